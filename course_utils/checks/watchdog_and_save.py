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
from ..cluster.engines.engine import px_name


def engine_check_watchdog(fn_name: str = "who_is_missing", late_ranks: tuple[int, ...] = (1,),
                          timeout_s: float = 1.0) -> dict[str, Any]:
    """*Collective.* Call the learner's ``fn_name(timeout_s)`` twice: every rank on time, then
    with ``late_ranks`` arriving ``2·timeout_s + 0.5`` s late. Returns both answers and how long
    the second call took on this rank (a watchdog must give up near ``timeout_s``)."""
    import torch.distributed as dist

    fn = px_name(fn_name)
    on_time = fn(timeout_s)
    dist.barrier()
    if dist.get_rank() in late_ranks:
        time.sleep(2 * timeout_s + 0.5)
    t0 = time.perf_counter()
    late = fn(timeout_s)
    return {"rank": dist.get_rank(), "on_time": on_time, "late": late,
            "late_seconds": time.perf_counter() - t0}


def watchdog_at(late_ranks: tuple[int, ...] = (1, 3), hosts: tuple[int, ...] = (2, 2),
                fn_name: str = "who_is_missing", timeout_s: float = 1.0,
                cluster: Any = None) -> dict[str, Any]:
    """*Kernel side.* :func:`engine_check_watchdog` on a world of its own (:func:`.spawn.spawn`:
    ``hosts`` simulated hosts, four ranks by default, so rank and local rank differ), running
    the learner's cell that defines ``fn_name``; returns rank 0's answer. The learner's cluster
    is not touched: a late rank's message, never received by a rank 0 that has given up, would
    otherwise be left in its group. Introduced in ``08_hangs_and_faults``."""
    from .spawn import spawn

    res = spawn("engine_check_watchdog", sum(hosts), cells=[fn_name], cluster=cluster,
                hosts=hosts, timeout=60, fn_name=fn_name, late_ranks=tuple(late_ranks),
                timeout_s=timeout_s)
    return res[0]


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


def _dying_save(save: Any, crash_at: int, log_fd: int | None = None) -> Any:
    """``torch.save`` replaced in the child: the save after step ``crash_at`` writes half a
    file and SIGKILLs its own process. ``log_fd``: where to write ``time kind n`` lines (each
    save's start and end, the kill) for the timeline figure."""
    import torch

    calls: list[str] = []
    real = torch.save

    def log(kind: str) -> None:
        if log_fd is not None:
            os.write(log_fd, f"{time.time():.6f} {kind} {len(calls)}\n".encode())

    def dying(obj: Any, f: Any, *a: Any, **k: Any) -> Any:
        calls.append(os.fspath(f) if isinstance(f, (str, os.PathLike)) else repr(f))
        log("save")
        if len(calls) == crash_at + 1:
            target = open(f, "wb") if isinstance(f, (str, os.PathLike)) else f
            target.write(b"PK\x03\x04 half a checkpoint")
            target.flush()
            log("kill")
            os.kill(os.getpid(), signal.SIGKILL)
        done = real(obj, f, *a, **k)
        log("saved")
        return done

    return dying


def read_events(fd: int, t0: float) -> list[tuple[float, str, int]]:
    """The child's ``time kind n`` lines from the read end ``fd`` (closed here), as
    ``(seconds since t0, kind, n)``."""
    raw = b""
    while chunk := os.read(fd, 65536):
        raw += chunk
    os.close(fd)
    out = []
    for line in raw.decode(errors="replace").splitlines():
        t, kind, n = line.split()
        out.append((float(t) - t0, kind, int(n)))
    return out


def _forked_child(save: Any, path: str, steps: int, crash_at: int, timeout: float,
                  events: list[Any] | None = None) -> tuple[int | None, str]:
    import torch

    read_end, write_end = os.pipe()  # the child's error, if the learner's save raised
    log_read, log_write = os.pipe()  # the child's save events (a few lines)
    t0 = time.time()
    pid = os.fork()
    if pid == 0:  # the child: train, save with the learner's function, die mid-save
        os.close(read_end)
        os.close(log_read)
        code = 0
        try:
            # OpenMP's thread pool does not survive a fork (a parallel region would hang): the
            # child computes on one thread, which its tiny model needs anyway.
            torch.set_num_threads(1)
            torch.save = _dying_save(save, crash_at, log_write)
            tiny_run(0, steps, lambda state: save(state, path))
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, then exit 1
            os.write(write_end, f"{type(exc).__name__}: {exc}"[:300].encode())
            code = 1
        finally:
            os._exit(code)
    os.close(write_end)
    os.close(log_write)
    try:
        code, err = _wait_child(pid, timeout)
        return code, err or os.read(read_end, 400).decode(errors="replace")
    finally:
        os.close(read_end)
        got = read_events(log_read, t0)
        if events is not None:
            events.extend(got)


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


def engine_folder_apart_from_tmp() -> str | None:
    """*On one engine.* A fresh folder on a file system other than the temporary directory's
    (``/dev/shm`` where it is one), or ``None``: a save that writes its temporary file to
    ``/tmp`` and renames it across file systems fails there (``os.replace`` cannot), as it does
    on a machine whose ``/tmp`` is a RAM disk. Used by exercise 2 of ``08_hangs_and_faults``."""
    import tempfile

    tmp_dev = os.stat(tempfile.gettempdir()).st_dev
    for base in ("/dev/shm", os.path.expanduser("~")):
        try:
            if os.stat(base).st_dev != tmp_dev and os.access(base, os.W_OK):
                return tempfile.mkdtemp(prefix="course-atomic-", dir=base)
        except OSError:
            continue
    return None


def engine_check_atomic_save(save_name: str = "save_atomic", folder: str = "/tmp",
                             steps: int = 6, crash_at: int = 3,
                             timeout: float = 60.0) -> dict[str, Any]:
    """*Not collective* (run it on one rank). A child process trains ``steps`` steps saving
    after each with the learner's ``save_name(state, path)``; during the save after step
    ``crash_at`` it writes half a file and kills itself with SIGKILL. Then: does ``path`` still
    load, at which step, and does resuming from it end with the uninterrupted run's weights?"""
    import torch

    save = px_name(save_name)
    path = os.path.join(folder, "atomic-check.pt")
    for f in os.listdir(folder):
        if f.startswith("atomic-check"):
            os.remove(os.path.join(folder, f))
    # The uninterrupted run, first: it also loads, in this process, what the child will use
    # (optimizer, serialization), so the forked child does not import them again.
    full = tiny_run(0, steps, lambda s: torch.save(s, io.BytesIO()))
    t0 = time.perf_counter()
    events: list[tuple[float, str, int]] = []   # the child's saves, for the timeline figure
    if sys.platform.startswith("linux"):
        # A copy of this engine (fork): torch is imported already, so the child starts at once.
        code, err = _forked_child(save, path, steps, crash_at, timeout, events)
    else:
        code, err = _fresh_child(save, path, steps, crash_at, timeout, folder)
    out: dict[str, Any] = {"child_returncode": code, "child_seconds":
                           time.perf_counter() - t0, "child_stderr": err, "events": events,
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


class _Holder:
    """A stand-in with ``state_dict()`` for the model or optimizer of a forked save."""

    def __init__(self, state: Any) -> None:
        self.state = state

    def state_dict(self) -> Any:
        return self.state


def engine_check_restart_resume(save_name: str = "save_for_restart",
                                resume_name: str = "resume_for_restart", folder: str = "/tmp",
                                timeout: float = 60.0) -> dict[str, Any]:
    """*Not collective* (run it on one rank). The fast checks of ``08_hangs_and_faults``'s
    exercise 3, before the ``torchrun`` run: ``resume(model, optimizer, path)`` with no file
    (step 0, weights untouched) and with a checkpoint of step 5 written by ``save`` (step 5,
    its weights and momentum); ``save(..., rank=1)`` must write nothing; and a child process
    killed by SIGKILL in the middle of the save after step 3 must leave a file that resumes at
    step 3 (an atomic save)."""
    import torch

    save, resume = px_name(save_name), px_name(resume_name)
    path = os.path.join(folder, "restart-check.pt")

    def clean() -> None:
        for f in os.listdir(folder):
            if f.startswith("restart-check"):
                os.remove(os.path.join(folder, f))

    def fresh(seed: int) -> tuple[Any, Any]:
        torch.manual_seed(seed)
        model = torch.nn.Linear(10, 3)
        return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def flat(model: Any) -> Any:
        return torch.cat([q.detach().reshape(-1) for q in model.parameters()])

    clean()
    out: dict[str, Any] = {}
    model, opt = fresh(1)
    before = flat(model).clone()
    out["no_file_step"] = resume(model, opt, path)
    out["untouched"] = bool(torch.equal(before, flat(model)))
    saved, saved_opt = fresh(2)
    saved(torch.ones(2, 10)).sum().backward()
    saved_opt.step()
    save(saved, saved_opt, 5, path, 1)
    out["rank1_files"] = sorted(f for f in os.listdir(folder) if f.startswith("restart-check"))
    save(saved, saved_opt, 5, path, 0)
    model, opt = fresh(3)
    out["step"] = resume(model, opt, path)
    out["weight_diff"] = float((flat(model) - flat(saved)).abs().max())
    out["momentum_restored"] = bool(opt.state_dict()["state"])
    clean()

    def child_save(state: dict[str, Any], to: str) -> None:
        save(_Holder(state["model"]), _Holder(state["optimizer"]), state["step"], to, 0)

    tiny_run(0, 1, lambda s: torch.save(s, io.BytesIO()))   # load what the child uses, first
    code, err = _forked_child(child_save, path, 6, 3, timeout)
    out.update({"child_returncode": code, "child_stderr": err, "after_kill": None})
    try:
        out["after_kill"] = int(resume(torch.nn.Linear(10, 3),
                                       torch.optim.SGD(torch.nn.Linear(10, 3).parameters(),
                                                       lr=0.1, momentum=0.9), path))
    except Exception as exc:  # half a file
        out["after_kill_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    clean()
    return out


def engine_pickle_functions(names: list[str], path: str) -> str:
    """*Not collective.* Write the learner's ``%%px`` functions ``names`` to ``path`` with
    cloudpickle (by value: a ``torchrun`` worker loads them without the notebook); returns
    ``path``. Used by exercise 3 of ``08_hangs_and_faults``."""
    import cloudpickle

    with open(path, "wb") as fh:
        cloudpickle.dump(tuple(px_name(n) for n in names), fh)
    return path

