"""The faults of ``08_hangs_and_faults``: mismatched collectives, a missing rank, a dead rank
and an elastic restart under ``torchrun``. Every wait is bounded.

``engine_*`` functions run on the engines (``cluster.run``) and are *collective* unless they say
otherwise; the others run in the notebook's kernel.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from typing import Any

from ..cluster import CourseCluster, current
from ..errors import CourseError


def engine_set_debug(level: str) -> str:
    """*Not collective.* Set ``TORCH_DISTRIBUTED_DEBUG`` on this engine; it is read when the
    process group is created, so re-create it afterwards (:func:`set_debug` does)."""
    os.environ["TORCH_DISTRIBUTED_DEBUG"] = level
    if "torch.distributed" in sys.modules:  # already imported: it read the variable then
        import torch.distributed as dist

        dist.set_debug_level_from_env()
    return level


def set_debug(level: str = "DETAIL", cluster: CourseCluster | None = None) -> dict[str, Any]:
    """Re-create the process group on every engine with ``TORCH_DISTRIBUTED_DEBUG=level``
    (``OFF``, ``INFO`` or ``DETAIL``). Returns :func:`course_utils.start_torch`'s summary."""
    from .process_group import start, stop

    if level not in ("OFF", "INFO", "DETAIL"):
        raise ValueError(f"level={level!r}: one of OFF, INFO, DETAIL")
    cc = cluster or current()
    stop(cc)
    cc.run(engine_set_debug, level, timeout=10)
    # start() sets TORCH_DISTRIBUTED_DEBUG to its own level on every engine: pass this one
    return start(cc, debug=level.lower())


def restart_group(cluster: CourseCluster | None = None) -> dict[str, Any]:
    """Stop the process group on every engine and start a new one. Needed after a gloo
    timeout: gloo closes the connection ("Application timeout caused pair closure") for good."""
    from .process_group import start, stop

    cc = cluster or current()
    stop(cc)
    return start(cc)


def engine_mismatch(kind: str = "shape") -> str:
    """*Collective.* Make the ranks disagree on purpose and return the first line of the error
    this rank got (``"no error"`` if none): ``shape``: rank 0 all-reduces 4 floats, the others
    8; ``order``: rank 0 calls all_reduce then broadcast, the others broadcast first. Run it
    with ``TORCH_DISTRIBUTED_DEBUG=DETAIL``, which checks every collective's fingerprint first
    (without it, this can hang until the process group's timeout or return garbage)."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    try:
        if kind == "shape":
            dist.all_reduce(torch.ones(4 if rank == 0 else 8))
        elif kind == "order":
            t = torch.ones(4)
            if rank == 0:
                dist.all_reduce(t)
                dist.broadcast(t, 0)
            else:
                dist.broadcast(t, 0)
                dist.all_reduce(t)
        else:
            raise ValueError(f"kind={kind!r}: 'shape' or 'order'")
    except RuntimeError as err:
        return shorten_fingerprint(str(err).splitlines()[0])
    return "no error"


def shorten_fingerprint(message: str) -> str:
    """Drop the long ``TensorDeviceTypes=...`` part of a DETAIL mismatch message."""
    return re.sub(r", TensorDeviceTypes=TensorOptions\(.*?\)\)\)", ")", message)


def engine_late_rank(late_rank: int = 1, timeout_s: float = 1.0) -> str:
    """*Collective.* ``late_rank`` sleeps ``2·timeout_s`` before the barrier; every rank calls
    ``dist.monitored_barrier(timeout, wait_all_ranks=True)`` and returns what it saw. Rank 0
    names the ranks that did not arrive; the late rank times out waiting for rank 0."""
    import datetime

    import torch.distributed as dist

    if dist.get_rank() == late_rank:
        time.sleep(2 * timeout_s)
    t0 = time.perf_counter()
    try:
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=timeout_s), wait_all_ranks=True)
        return f"passed in {time.perf_counter() - t0:.2f} s"
    except RuntimeError as err:
        return f"after {time.perf_counter() - t0:.2f} s: {str(err).splitlines()[0][:160]}"


def engine_train_then_die(die_rank: int = 1, die_step: int = 5, steps: int = 20) -> str:
    """*Collective.* Train a small DDP model; ``die_rank`` ends its process with ``os._exit(1)``
    at ``die_step`` (a crash: no cleanup, no goodbye). The others find out inside their next
    all_reduce; they return the error they got."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = dist.get_rank()
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    for step in range(steps):
        if rank == die_rank and step == die_step:
            os._exit(1)
        x, y = torch.randn(16, 32, generator=gen), torch.randint(0, 4, (16,), generator=gen)
        opt.zero_grad()
        try:
            F.cross_entropy(model(x), y).backward()
        except RuntimeError as err:
            return f"rank {rank}, step {step}: {str(err).splitlines()[0][:140]}"
        opt.step()
    return f"rank {rank}: finished {steps} steps"


def run_rank_death(cluster: CourseCluster | None = None, die_rank: int = 1, die_step: int = 5,
                  steps: int = 20, timeout: float = 30.0) -> dict[int, str]:
    """Run :func:`engine_train_then_die` on every rank and wait (at most ``timeout`` s) for the
    ranks that survive: what each of them got from gloo. The dead rank's engine never answers,
    so it is not waited for (the controller would notice only at its next heartbeat); replace
    the engines afterwards with ``cu.restart()``."""
    cc = cluster or current()
    handles = {info.rank: cc.client[info.engine_id].apply_async(
        engine_train_then_die, die_rank, die_step, steps) for info in cc.ranks}
    out: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    for rank, handle in sorted(handles.items()):
        if rank == die_rank:
            continue
        try:
            out[rank] = str(handle.get(timeout=max(0.1, deadline - time.monotonic())))
        except Exception as exc:  # a timeout, or the engine went too
            out[rank] = f"no answer: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    out[die_rank] = f"rank {die_rank}: its process ended with os._exit(1) at step {die_step}"
    cc.flags["pg_broken"] = True
    return dict(sorted(out.items()))


def start_elastic(ckpt_dir: str, steps: int = 12, crash_at: int = 6, nproc: int = 2,
                  max_restarts: int = 1, learner: str = "") -> dict[str, Any]:
    """Start :mod:`course_utils.torch_dist.elastic_demo` under ``torchrun --standalone`` on this
    machine (loopback only), in the background: rank 1 crashes once at ``crash_at``, torchrun
    restarts every worker, they resume from the last checkpoint. ``learner``: a file of the
    learner's save and resume functions (:func:`course_utils.checks.watchdog_and_save.
    engine_pickle_functions`) that the workers use instead of their own. Collect it with
    :func:`join_elastic`."""
    os.makedirs(ckpt_dir, exist_ok=True)
    for name in ("crashed-once", "elastic.pt", "elastic.pt.tmp"):
        if os.path.exists(os.path.join(ckpt_dir, name)):
            os.remove(os.path.join(ckpt_dir, name))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", f"--max-restarts={max_restarts}",
           "--monitor-interval=0.5", "-m", "course_utils.torch_dist.elastic_demo",
           "--ckpt-dir", ckpt_dir, "--steps", str(steps), "--crash-at", str(crash_at)]
    if learner:
        cmd += ["--learner", learner]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LOGLEVEL": "WARNING"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    return {"proc": proc, "t0": time.perf_counter(), "cmd": " ".join(cmd[2:])}


def join_elastic(handle: dict[str, Any], timeout: float = 150.0) -> dict[str, Any]:
    """Wait for :func:`start_elastic`'s torchrun; return the demo's ``[elastic]`` lines, the
    seconds since the start and torchrun's exit code. After ``timeout`` seconds it kills
    torchrun and raises :class:`CourseError`."""
    proc = handle["proc"]
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_torchrun(proc)
        raise CourseError(f"torchrun did not finish within {timeout:g} s (stopped, with its "
                          "workers)",
                          "re-run the cell; on a slow machine pass a larger timeout=") from None
    lines = [ln for ln in out.splitlines() if ln.startswith("[elastic]")]
    return {"lines": lines, "seconds": time.perf_counter() - handle["t0"],
            "returncode": proc.returncode, "stderr_tail": err.splitlines()[-3:]}


def stop_torchrun(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """Stop a ``torchrun`` and every worker it started. The workers run in sessions of their
    own, so killing torchrun alone would leave them running: SIGTERM first (torchrun then stops
    its workers), after ``grace`` seconds SIGKILL to torchrun and to what is left of them."""
    import psutil

    try:
        workers = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        workers = []
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for worker in workers:  # psutil checks it is still the same process before signalling
        try:
            worker.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(workers, timeout=grace)
    try:  # read the pipes only now: a live worker holds them open
        proc.communicate(timeout=grace)
    except subprocess.TimeoutExpired:
        for pipe in (proc.stdout, proc.stderr):
            if pipe:
                pipe.close()
