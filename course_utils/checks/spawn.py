"""The one way a graded check runs the learner's code on ranks of its own, shaped like
``torch.multiprocessing.spawn(fn, nprocs=p)``: ``spawn(probe, nprocs=4, cells=[...])`` copies
the ``%%px`` cells that define ``cells`` from rank 0 of the notebook's cluster into ``nprocs``
fresh processes, which form a gloo group of their own (on simulated hosts when asked), run the
cells, then ``probe``, and exit. Returns each rank's result, in rank order. The notebook's
cluster and its process group are not touched.

Why: on the 2 engines of a laptop or CI some wrong answers look right (a typed 2 instead of
``world_size``; ``local_rank`` where ``rank`` belongs, equal on one host; a ring sending left,
which is also right with 2 ranks). The checks of units 0-3, 7 and 10 use it.

Where it runs: :func:`spawn` is called in the kernel. With a cluster it asks rank 0's engine to
start the world (:func:`engine_spawn`; that engine reads the cells from its own namespace, and
on a local cluster its fork server, which imported torch already, forks the launcher); with
``sources`` given and no cluster it starts the world from this process (the launcher forked
by a fork server started for this process once: a test run of many checks imports torch once,
not once per world). The launcher and the ranks are :mod:`.spawned_ranks`. Nothing is left
running: the launcher and every rank it forked are killed at the deadline, and waited for.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import CourseError

#: What every rank's namespace holds before the learner's cells run (as a unit's set-up has it).
BASE_IMPORTS = {"torch": "torch", "dist": "torch.distributed", "nn": "torch.nn",
                "F": "torch.nn.functional", "math": "math", "datetime": "datetime",
                "functools": "functools", "sharding": "course_utils.torch_dist.sharding"}


class RankFailed(CourseError):
    """A rank of a spawned world failed: its error (``said``), or the signal that ended it
    (``signal_name``: gloo aborts a process on some mistakes, such as a message larger than
    the buffer posted to receive it)."""

    def __init__(self, cause: str, fix: str, *, rank: int, nprocs: int, said: str,
                 signal_name: str = "") -> None:
        self.rank, self.nprocs, self.said, self.signal_name = rank, nprocs, said, signal_name
        super().__init__(cause, fix)

    @classmethod
    def of(cls, rank: int, nprocs: int, said: str, signal_name: str = "") -> RankFailed:
        """The error for rank ``rank`` of ``nprocs``, which said ``said``."""
        return cls(*rank_failed_message(rank, nprocs, said), rank=rank, nprocs=nprocs,
                   said=said, signal_name=signal_name)


def rank_failed_message(rank: int, nprocs: int, said: str) -> tuple[str, str]:
    """What :class:`RankFailed` says: the rank, its error, and the fix (pure)."""
    return (f"rank {rank} of the {nprocs}-rank check failed: {said}",
            "make your cell run on any world size (use world_size and rank, never 2 or 0 "
            "typed in), then run the test again")


def spawn(probe: str, nprocs: int = 4, *, cells: Sequence[str] = (), cluster: Any = None,
          sources: Sequence[str] | None = None, hosts: Sequence[int] | None = None,
          group: bool = True, timeout: float = 120.0, collective_timeout: float | None = None,
          extra_env: dict[str, str] | None = None, **kwargs: Any) -> list[Any]:
    """*Kernel side.* ``probe(**kwargs)`` (a name in :mod:`course_utils.checks`, or
    ``"module:function"``) on ``nprocs`` ranks of their own, after the learner's cells that
    define ``cells`` (read on rank 0 of ``cluster``, default the current one) or ``sources``
    (cells as text; then no cluster is used). Returns the results in rank order.

    ``hosts``: ranks per simulated host (``(2, 2)``: local ranks 0, 1, 0, 1); default one host.
    ``group``: whether the ranks join a gloo group before the cells run (else the learner's
    code builds one). ``collective_timeout``: gloo's wait per collective (default
    ``min(timeout, 60)``). ``extra_env``: variables for the world on top of this process's.
    Raises :class:`RankFailed` (a rank's error, first cause first) or :class:`CourseError`
    (not finished within ``timeout`` seconds)."""
    args = dict(probe=probe, nprocs=nprocs, cells=list(cells), hosts=hosts, group=group,
                timeout=timeout, collective_timeout=collective_timeout,
                extra_env=extra_env or {}, kwargs=kwargs)
    if sources is not None:
        return spawn_here(sources=list(sources), **args)
    from ..cluster import current

    cc = cluster or current()
    done = cc.run_on(0, engine_spawn, args, timeout=timeout + 60)
    if "failed" in done:
        raise RankFailed.of(**done["failed"])
    if "error" in done:
        raise CourseError(*done["error"])
    return done["results"]


def engine_spawn(args: dict[str, Any]) -> dict[str, Any]:
    """*On rank 0's engine* (not collective): :func:`spawn_here` with this engine's cells;
    ``{"results": [...]}``, or what went wrong as plain data for the kernel."""
    try:
        return {"results": spawn_here(**args)}
    except RankFailed as exc:
        return {"failed": {"rank": exc.rank, "nprocs": exc.nprocs, "said": exc.said,
                           "signal_name": exc.signal_name}}
    except CourseError as exc:
        return {"error": (exc.cause, exc.fix)}


def spawn_here(probe: str, nprocs: int, cells: list[str], hosts: Sequence[int] | None,
               group: bool, timeout: float, collective_timeout: float | None,
               extra_env: dict[str, str], kwargs: dict[str, Any],
               sources: list[str] | None = None) -> list[Any]:
    """Start the world from this process (a kernel, or an engine whose ``%%px`` cells are
    read when ``sources`` is None) and wait for it. A world whose ranks failed before all had
    joined their group (gloo's ``connectFullMesh`` losing its peer on a loaded machine), before
    a line of the learner's cells ran, is formed once more on a fresh port."""
    from ..torch_dist.px_functions import engine_cells

    carried = engine_cells(cells) if sources is None else {
        "sources": sources, "imports": {}, "values": {}}
    spec = {"sources": carried["sources"], "imports": {**BASE_IMPORTS, **carried["imports"]},
            "values": carried["values"], "probe": probe, "kwargs": kwargs, "group": group,
            "ranks": simulated_rank_map(tuple(hosts or (nprocs,))),
            "collective_timeout": collective_timeout or min(timeout, 60.0)}
    if len(spec["ranks"]) != nprocs:
        raise ValueError(f"hosts={hosts} hold {len(spec['ranks'])} ranks, not nprocs={nprocs}")
    try:
        return _one_world(spec, timeout, extra_env)
    except _NotJoined:
        pass  # formed once more below, on a fresh port
    try:
        return _one_world(spec, timeout, extra_env)
    except _NotJoined as exc:
        raise exc.error from None


def simulated_rank_map(hosts: Sequence[int]) -> list[dict[str, Any]]:
    """A rank map of ``sum(hosts)`` ranks on ``len(hosts)`` simulated hosts (``hosts[k]`` ranks
    on host ``k``), all on this machine, as the rank map's dicts: ``hosts=(2, 2)`` gives ranks
    0-3 with local ranks 0, 1, 0, 1. Pure; built by the cluster's own
    :func:`~course_utils.cluster.ranks.build_rank_map`."""
    from ..cluster.ranks import build_rank_map

    descriptions, eid = {}, 0
    for k, count in enumerate(hosts):
        for _ in range(count):
            descriptions[eid] = {"host": "localhost", "addr": "127.0.0.1", "pid": 0, "gpus": 0,
                                 "node": f"host{k}"}
            eid += 1
    return build_rank_map(descriptions, [f"host{k}" for k in range(len(hosts))],
                          local=True).to_dicts()


class _NotJoined(Exception):
    """A world that failed before every rank had joined its process group."""

    def __init__(self, error: CourseError) -> None:
        super().__init__(str(error))
        self.error = error


def _one_world(spec: dict[str, Any], timeout: float, extra_env: dict[str, str]) -> list[Any]:
    from ..cluster.launchers import fork_client, fork_protocol
    from ..cluster.ports import free_ports
    from ..torch_dist.process_group import loopback_ifname

    nprocs = len(spec["ranks"])
    with tempfile.TemporaryDirectory(prefix="course-world-") as tmp:
        path = Path(tmp) / "spec.pkl"
        store, master = free_ports(2, "127.0.0.1")
        path.write_bytes(pickle.dumps({**spec, "port": store, "master_port": master}))
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
               "GLOO_SOCKET_IFNAME": loopback_ifname() or "lo", **extra_env}
        # an engine's own fork server, or one of this process (its cluster's, else a helper
        # server started for it): torch imported already
        server = fork_protocol.FORK_SERVER or fork_client.helper_server_socket()
        target = "course_utils.checks.spawned_ranks"
        with open(Path(tmp) / "launcher.txt", "w") as err:
            proc = fork_protocol.fork_helper(
                server, f"{target}:main", [str(path)], [err.fileno()], env, tmp) or \
                subprocess.Popen([sys.executable, "-m", target, str(path)], env=env,
                                 stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        try:
            _watch(proc, Path(tmp), nprocs, time.monotonic() + timeout, timeout)
            return [_result(Path(tmp), r, nprocs) for r in range(nprocs)]
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


def _watch(proc: Any, tmp: Path, nprocs: int, deadline: float, timeout: float) -> None:
    """Wait for the launcher, or for every rank's result; a rank that failed is reported at
    once (the others would wait for it in their next collective until the timeout), and so is
    the rank that broke first when the launcher was done before the first look."""
    while True:
        # every rank has its result: the world is over (a rank may still be destroying a group
        # with a send the probe found stuck, which would wait out its timeout); killed after
        done = proc.poll() is not None or len(list(tmp.glob("result-*.pkl"))) == nprocs
        if sorted(tmp.glob("failed-*.txt")) or _ended_by_signal(tmp):
            if not done:  # the rank that broke first, and the peers it took down, all write
                time.sleep(0.5)
            _result(tmp, _first_cause(tmp), nprocs)
        if done:
            return
        if time.monotonic() > deadline:
            raise CourseError(
                f"the {nprocs}-rank check did not finish in {timeout:.0f} s (a collective "
                "that only some ranks reached?)",
                "run every collective on every rank, the same number of times; then run the "
                "test again")
        time.sleep(0.1)


#: What a rank's error says when it only lost a peer that failed first.
_KNOCK_ON = ("Connection reset by peer", "Connection closed by peer", "pair closure",
             "Broken pipe")


def first_failure(results: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """Of a world's results (dicts with ``"error"`` where a probe caught one), the one to
    report: the first rank whose error is its own, not a lost connection to a peer that failed
    first (those follow within moments); ``None`` when no rank failed. Pure."""
    failed = [r for r in results if "error" in r]
    own = [r for r in failed if not any(k in str(r["error"]) for k in _KNOCK_ON)]
    return (own or failed or [None])[0]


def _ended_by_signal(tmp: Path) -> dict[int, str]:
    """Ranks the launcher saw ended by a signal, and the signal's name."""
    log = tmp / "launcher.txt"
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    return {int(ln.split()[1]): ln.split()[-1] for ln in lines
            if ln.startswith("rank ") and " was ended by " in ln}


def _first_cause(tmp: Path) -> int:
    """The rank to report: one a signal ended, else the first whose error is its own, not a
    lost connection to a peer that broke (those follow within moments)."""
    killed = _ended_by_signal(tmp)
    if killed:
        return min(killed)
    ranks = [(int(p.stem.split("-")[1]), p.read_text(errors="replace"))
             for p in sorted(tmp.glob("failed-*.txt"))]
    own = [r for r, text in ranks if not any(k in text for k in _KNOCK_ON)]
    return (own or [r for r, _ in ranks])[0]


def _result(tmp: Path, rank: int, nprocs: int) -> Any:
    out = tmp / f"result-{rank}.pkl"
    if out.exists():
        return pickle.loads(out.read_bytes())
    failed = tmp / f"failed-{rank}.txt"
    text = failed.read_text() if failed.exists() else (tmp / "launcher.txt").read_text()
    err = [ln for ln in text.splitlines()
           if ln.strip() and not ln.lstrip().startswith(("^", "File ", "[rank", "Traceback"))
           and " was ended by " not in ln]
    raise RankFailed.of(rank, nprocs, " | ".join(err[-3:] or ["no message"]),
                        _ended_by_signal(tmp).get(rank, ""))
