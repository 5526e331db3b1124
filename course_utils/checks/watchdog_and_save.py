"""Engine-side probes behind the graded tests of ``08_hangs_and_faults``: they make a rank late
or kill a process in the middle of a save, then look at what the learner's code did."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from typing import Any

from .. import settings
from .common import learner


def engine_check_watchdog(fn_name: str = "who_is_missing", late_rank: int = 1,
                          timeout_s: float = 1.0) -> dict[str, Any]:
    """*Collective.* Call the learner's ``fn_name(timeout_s)`` twice: every rank on time, then
    with ``late_rank`` arriving ``2·timeout_s + 0.5`` s late. Returns both answers and how long
    the second call took on this rank (a watchdog must give up near ``timeout_s``)."""
    import torch.distributed as dist

    fn = learner(fn_name)
    on_time = fn(timeout_s)
    dist.barrier()
    if dist.get_rank() == late_rank:
        time.sleep(2 * timeout_s + 0.5)
    t0 = time.perf_counter()
    late = fn(timeout_s)
    return {"rank": dist.get_rank(), "on_time": on_time, "late": late,
            "late_seconds": time.perf_counter() - t0}


_CHILD = r"""
import os, sys
import cloudpickle, torch
save, path, steps, crash_at = cloudpickle.load(open(sys.argv[1], "rb"))
from course_utils.checks.watchdog_and_save import _dying_save, tiny_run
torch.save = _dying_save(save, crash_at)
tiny_run(0, steps, lambda state: save(state, path))
"""


def tiny_run(start: int, steps: int, on_step: Any, state: dict[str, Any] | None = None) -> Any:
    """Train a tiny linear model from step ``start`` to ``steps`` (data depends only on the step),
    calling ``on_step(state)`` after each; ``state`` resumes a run. Returns the flat weights."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = torch.nn.Linear(10, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
    for step in range(start, steps):
        gen = torch.Generator().manual_seed(step)
        x, y = torch.randn(8, 10, generator=gen), torch.randint(0, 3, (8,), generator=gen)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        on_step({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step + 1})
    return torch.cat([q.detach().reshape(-1) for q in model.parameters()])


def _dying_save(save: Any, crash_at: int) -> Any:
    """``torch.save`` replaced in the child: the save after step ``crash_at`` writes half a
    file and SIGKILLs its own process."""
    import torch

    calls: list[str] = []
    real = torch.save

    def dying(obj: Any, f: Any, *a: Any, **k: Any) -> Any:
        calls.append(os.fspath(f) if isinstance(f, (str, os.PathLike)) else repr(f))
        if len(calls) == crash_at + 1:
            target = open(f, "wb") if isinstance(f, (str, os.PathLike)) else f
            target.write(b"PK\x03\x04 half a checkpoint")
            target.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return real(obj, f, *a, **k)

    return dying


def _forked_child(save: Any, path: str, steps: int, crash_at: int, timeout: float
                  ) -> tuple[int | None, str]:
    import torch

    read_end, write_end = os.pipe()  # the child's error, if the learner's save raised
    pid = os.fork()
    if pid == 0:  # the child: train, save with the learner's function, die mid-save
        os.close(read_end)
        code = 0
        try:
            # OpenMP's thread pool does not survive a fork (a parallel region would hang): the
            # child computes on one thread, which its tiny model needs anyway.
            torch.set_num_threads(1)
            torch.save = _dying_save(save, crash_at)
            tiny_run(0, steps, lambda state: save(state, path))
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, then exit 1
            os.write(write_end, f"{type(exc).__name__}: {exc}"[:300].encode())
            code = 1
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        code, err = _wait_child(pid, timeout)
        return code, err or os.read(read_end, 400).decode(errors="replace")
    finally:
        os.close(read_end)


def _wait_child(pid: int, timeout: float) -> tuple[int | None, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            return code, ""
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None, f"the child did not finish within {timeout:g} s (killed)"


def _fresh_child(save: Any, path: str, steps: int, crash_at: int, timeout: float,
                 folder: str) -> tuple[int | None, str]:
    import cloudpickle

    job = os.path.join(folder, "atomic-check-job.pkl")
    with open(job, "wb") as fh:
        cloudpickle.dump((save, path, steps, crash_at), fh)
    root = str(settings.course_root())
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    try:
        done = subprocess.run([sys.executable, "-c", _CHILD, job], capture_output=True,
                              text=True, timeout=timeout, env=env)
    finally:
        os.remove(job)
    return done.returncode, done.stderr[-300:]


def engine_check_atomic_save(save_name: str = "save_atomic", folder: str = "/tmp",
                             steps: int = 6, crash_at: int = 3,
                             timeout: float = 60.0) -> dict[str, Any]:
    """*Not collective* (run it on one rank). A child process trains ``steps`` steps saving
    after each with the learner's ``save_name(state, path)``; during the save after step
    ``crash_at`` it writes half a file and kills itself with SIGKILL. Then: does ``path`` still
    load, at which step, and does resuming from it end with the uninterrupted run's weights?"""
    import torch

    save = learner(save_name)
    path = os.path.join(folder, "atomic-check.pt")
    for f in os.listdir(folder):
        if f.startswith("atomic-check"):
            os.remove(os.path.join(folder, f))
    # The uninterrupted run, first: it also loads, in this process, what the child will use
    # (optimizer, serialization), so the forked child does not import them again.
    full = tiny_run(0, steps, lambda s: torch.save(s, io.BytesIO()))
    t0 = time.perf_counter()
    if sys.platform.startswith("linux"):
        # A copy of this engine (fork): torch is imported already, so the child starts at once.
        code, err = _forked_child(save, path, steps, crash_at, timeout)
    else:
        code, err = _fresh_child(save, path, steps, crash_at, timeout, folder)
    out: dict[str, Any] = {"child_returncode": code, "child_seconds":
                           time.perf_counter() - t0, "child_stderr": err,
                           "loads": False, "step": None, "resume_diff": None,
                           "files": sorted(f for f in os.listdir(folder)
                                           if f.startswith("atomic-check"))}
    try:
        state = torch.load(path, weights_only=True)
        out["loads"], out["step"] = True, int(state["step"])
    except Exception as exc:  # a half-written checkpoint
        out["load_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
        return out
    resumed = tiny_run(out["step"], steps, lambda s: None, state)
    out["resume_diff"] = float((full - resumed).abs().max())
    return out
