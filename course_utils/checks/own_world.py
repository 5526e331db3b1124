"""A short-lived world of its own gloo processes for a graded check (``10_sharding_and_memory``;
``07_performance`` grades exercise 2 on 3 ranks with it): the learner's ``%%px`` cells are
copied from an engine of the notebook's cluster into ``world_size`` fresh Python processes,
which form their own process group, run one probe of ``checks`` and exit. Nothing is left
running: every process is waited for, or killed at the deadline.

Run as ``python -m course_utils.checks.own_world SPEC`` (what :func:`run_on_ranks` does): one
launcher imports torch once and forks the ranks, so a 4-rank world costs one import. In a
process that started a local cluster the launcher is forked by that cluster's fork server,
which has imported torch already, so it costs none.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..errors import CourseError


def engine_cell_sources(names: list[str]) -> list[str]:
    """*On an engine.* The whole ``%%px`` cell that defined each of ``names`` (a function or a
    class), read back from the file name IPython compiled it under, each cell once."""
    import linecache

    import __main__

    ns = vars(__main__)
    cells: list[str] = []
    for name in names:
        obj = ns.get(name)
        funcs = [obj] if hasattr(obj, "__code__") else [
            getattr(f, "__func__", f) for f in vars(obj).values()] if obj is not None else []
        code = next((f.__code__ for f in funcs if hasattr(f, "__code__")), None)
        if code is None:
            raise NameError(f"{name!r} is not defined on this engine: run its cell first")
        body = "".join(linecache.getlines(code.co_filename))
        if not body:
            raise NameError(f"the cell that defined {name!r} cannot be read back: run it again")
        if body not in cells:
            cells.append(body)
    return cells


def run_on_ranks(cluster: Any, names: list[str], probe: str, world_size: int = 4,
                 timeout: float = 120, sources: list[str] | None = None,
                 extra_env: dict[str, str] | None = None,
                 **kwargs: Any) -> list[dict[str, Any]]:
    """Run ``checks.<probe>(**kwargs)`` (or ``"module:function"``) on a new world of
    ``world_size`` gloo processes that first run the learner's cells defining ``names`` (read
    from ``cluster``'s rank 0); one result per rank, in rank order. ``sources`` (cells as
    text) replaces reading them from ``cluster`` (then ``None``): what the tests do.
    ``extra_env``: variables set for the world on top of this process's (e.g. debug off).

    A world whose ranks failed to connect to each other, before any of them ran a line of
    the learner's cells, is formed once more on a fresh port (seen once in a loaded test run:
    gloo's ``connectFullMesh`` lost its peer); a second such failure is reported."""
    if sources is None:
        sources = cluster.run(engine_cell_sources, names, timeout=30)[0]
    try:
        return _one_world(sources, probe, world_size, timeout, extra_env or {}, kwargs)
    except _NotJoined:
        pass  # formed once more below, on a fresh port
    try:
        return _one_world(sources, probe, world_size, timeout, extra_env or {}, kwargs)
    except _NotJoined as exc:
        raise exc.error from None


class _NotJoined(Exception):
    """A world that failed before every rank had joined its process group."""

    def __init__(self, error: CourseError) -> None:
        super().__init__(str(error))
        self.error = error


def _one_world(sources: list[str], probe: str, world_size: int, timeout: float,
               extra_env: dict[str, str], kwargs: dict[str, Any]) -> list[dict[str, Any]]:
    from ..cluster.ports import free_port

    with tempfile.TemporaryDirectory(prefix="course-world-") as tmp:
        spec = Path(tmp) / "spec.json"
        spec.write_text(json.dumps({"sources": sources, "probe": probe,
                                    "kwargs": kwargs, "world_size": world_size,
                                    "port": free_port(), "timeout": timeout}))
        from ..cluster import engine_fork, fork_protocol
        from ..torch_dist.process_group import loopback_ifname

        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
               "GLOO_SOCKET_IFNAME": loopback_ifname() or "lo", **extra_env}
        with open(Path(tmp) / "launcher.txt", "w") as err:
            # forked by this process's cluster fork server, which imported torch already
            proc = fork_protocol.fork_helper(
                engine_fork.own_server_socket(), f"{__name__}:main", [str(spec)],
                [err.fileno()], env, tmp) or subprocess.Popen(
                [sys.executable, "-m", "course_utils.checks.own_world", str(spec)], env=env,
                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        try:
            _watch(proc, Path(tmp), world_size, time.monotonic() + timeout, timeout)
            return [_result(Path(tmp), r, world_size) for r in range(world_size)]
        except CourseError as exc:
            failed = {f.stem.split("-")[1] for f in Path(tmp).glob("failed-*.txt")}
            joined = {f.name.split("-")[1] for f in Path(tmp).glob("joined-*")}
            if failed and not failed & joined:  # every rank that failed did so joining
                raise _NotJoined(exc) from None
            raise
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)     # the launcher and every rank it forked
            proc.wait()


def _watch(proc: Any, tmp: Path, world_size: int, deadline: float,
           timeout: float) -> None:
    """Wait for the launcher; a rank that failed is reported at once (the others would wait
    for it in their next collective until the timeout), and so is the rank that broke first
    when the launcher was done before the first look (a forked one can be)."""
    while True:
        done = proc.poll() is not None
        if sorted(tmp.glob("failed-*.txt")):
            if not done:  # the rank that broke first, and the peers it took down, all write
                time.sleep(0.5)
            _result(tmp, _first_cause(sorted(tmp.glob("failed-*.txt"))), world_size)
        if done:
            return
        if time.monotonic() > deadline:
            raise CourseError(
                f"the {world_size}-rank check did not finish in {timeout:.0f} s (a collective "
                "that only some ranks reached?)",
                "run every collective on every rank, the same number of times; then run the "
                "test again")
        time.sleep(0.2)


#: What a rank's error says when it only lost a peer that failed first.
_KNOCK_ON = ("Connection reset by peer", "Connection closed by peer", "pair closure",
             "Broken pipe")


def _first_cause(failed: list[Path]) -> int:
    """The rank to report: the first whose error is its own, not a lost connection to a peer
    that broke (those follow within moments)."""
    ranks = [(int(p.stem.split("-")[1]), p.read_text(errors="replace")) for p in failed]
    own = [r for r, text in ranks if not any(k in text for k in _KNOCK_ON)]
    return (own or [r for r, _ in ranks])[0]


def _result(tmp: Path, rank: int, world_size: int) -> dict[str, Any]:
    out = tmp / f"result-{rank}.json"
    if out.exists():
        return json.loads(out.read_text())
    failed = tmp / f"failed-{rank}.txt"
    text = failed.read_text() if failed.exists() else (tmp / "launcher.txt").read_text()
    err = [ln for ln in text.splitlines()
           if ln.strip() and not ln.lstrip().startswith(("^", "File ", "[rank", "Traceback"))]
    raise CourseError(f"rank {rank} of the {world_size}-rank check failed: "
                      + " | ".join(err[-3:] or ["no message"]),
                      "make your cell run on any world size (use world_size and rank, never "
                      "2 or 0 typed in), then run the test again")


def main(spec_path: str) -> None:
    """The launcher of :func:`run_on_ranks`: import torch once, fork a process per rank
    (before any process group exists), run rank 0 here, wait for the others."""
    import torch
    import torch.distributed as dist  # imported once, before the fork

    from . import sharding  # noqa: F401

    # a launcher forked by a fork server inherits the level the server read at its import:
    # read this process's own TORCH_DISTRIBUTED_DEBUG, as a fresh python would
    dist.set_debug_level_from_env()

    spec = json.loads(Path(spec_path).read_text())
    children = []
    for r in range(1, spec["world_size"]):
        pid = os.fork()
        if pid == 0:
            os._exit(_run_rank(spec_path, spec, r))
        children.append(pid)
    torch.set_num_threads(1)
    code = _run_rank(spec_path, spec, 0)
    for r, pid in enumerate(children, start=1):
        ended = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        if ended < 0:  # no traceback of its own: say what ended it
            print(f"rank {r} was ended by {signal.Signals(-ended).name}", file=sys.stderr)
        code |= ended != 0
    sys.exit(code)


def _run_rank(spec_path: str, spec: dict[str, Any], rank: int) -> int:
    """One rank: join the group, run the learner's cells and the probe; its result (or its
    traceback, ``failed-<rank>.txt``) next to the spec. Returns the exit code."""
    import datetime
    import importlib
    import math
    import traceback

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn

    import __main__

    from .. import checks
    from ..torch_dist import sharding
    from ..torch_dist.process_group import rendezvous_store

    folder = Path(spec_path).parent
    try:
        torch.set_num_threads(1)
        wait = datetime.timedelta(seconds=spec["timeout"])
        store = rendezvous_store(rank, spec["world_size"], "127.0.0.1", spec["port"], wait)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=spec["world_size"],
                                timeout=wait)  # the store listens on loopback only
        (folder / f"joined-{rank}").touch()
        ns = vars(__main__)
        ns.update(torch=torch, dist=dist, nn=nn, F=F, math=math, sharding=sharding, rank=rank,
                  world_size=spec["world_size"])
        for src in spec["sources"]:
            exec(compile(src, "<your cell>", "exec"), ns)
        mod, _, func = spec["probe"].rpartition(":")
        probe = getattr(importlib.import_module(mod) if mod else checks, func)
        result = probe(**spec["kwargs"])
        dist.destroy_process_group()
    except BaseException:
        (folder / f"failed-{rank}.txt").write_text(traceback.format_exc())
        return 1
    out = folder / f"result-{rank}.json"
    tmp = out.with_suffix(".part")
    tmp.write_text(json.dumps(result))
    tmp.replace(out)
    return 0


if __name__ == "__main__":
    main(sys.argv[1])
