"""Calls that did not finish: where each rank is stuck, and refusing calls that would queue
behind a stuck one. A call in which one rank raised while the others keep running (waiting for
it in a collective, or for the chief) is reported after :data:`FAIL_FAST_S`, not after the
others' own timeouts (:func:`first_failures`).

A rank blocked in a collective answers no call, so :meth:`StuckCalls.where` reads the Python
stacks the engines dump on a signal (:func:`course_utils.cluster.engines.engine.enable_stack_dump`;
engines on this machine only), and a call's timeout error names each rank's line.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import time
from collections.abc import Sequence
from typing import Any

from ...errors import ClusterTimeout, ProcessGroupGone
from ...procs import cmdline
from ..engines import engine
from ..ranks import RankMap
from .failures import on_hosts, rank_list

#: Seconds a call waits for its other ranks once one rank raised: a mistake on every rank
#: fails on all of them within it; a rank still running after it waits for the failed one.
FAIL_FAST_S = 3.0


def first_failures(ar: Any, timeout: float | None,
                   grace: float = FAIL_FAST_S) -> list[Exception]:
    """Wait up to ``timeout`` s (None: until done) for the async result ``ar``. The errors of
    the parts that raised, when some rank raised and others still ran ``grace`` s later; else
    [] (all done, or the time is up: ``ar.get`` then says which)."""
    deadline = time.monotonic() + (float("inf") if timeout is None else timeout)
    done, pending = ar.wait(timeout, return_when=concurrent.futures.FIRST_EXCEPTION)
    failed = [e for part in done if (e := part.exception()) is not None]
    if not pending or not failed or ar.wait(min(grace, max(0.0, deadline - time.monotonic()))):
        return []
    return failed


def is_engine(pid: int) -> bool:
    """True when ``pid`` is an ipyparallel engine (never signal a reused pid)."""
    return "ipyparallel" in " ".join(cmdline(pid))


class StuckCalls:
    """One cluster's last call that timed out, and the files its engines dump stacks to."""

    def __init__(self) -> None:
        # ranks still running it, what and since when, its msg ids, where each rank was
        self.last: dict[str, Any] | None = None
        #: engine id -> the file its faulthandler writes stacks to (engines on this machine)
        self.stack_files: dict[int, str] = {}

    def forget_stack_files(self) -> None:
        """Delete the stack files of engines that are being replaced."""
        for path in self.stack_files.values():
            with contextlib.suppress(OSError):
                os.unlink(path)
        self.stack_files = {}

    def follow(self, rank_map: RankMap, local: bool) -> None:
        """Another kernel replaced the engines: forget the old ones' call and stack files."""
        self.last = None
        self.forget_stack_files()
        if local:  # the new engines dump their stacks where their pid says
            self.stack_files = {r.engine_id: engine.stack_file(r.pid) for r in rank_map
                                if os.path.exists(engine.stack_file(r.pid))}

    def where(self, ranks: RankMap, engine_ids: Sequence[int] | None = None,
              wait: float = 1.0) -> dict[int, str]:
        """rank -> what its main thread runs now (see :meth:`CourseCluster.where`)."""
        ids = list(ranks.engine_ids if engine_ids is None else engine_ids)
        sig = engine.STACK_SIGNAL
        marks: dict[int, tuple[str, int]] = {}
        for eid in ids:
            path = self.stack_files.get(eid)
            if sig is None or not path or not ranks.has_engine(eid):
                continue
            pid = ranks.by_engine(eid).pid
            if not os.path.exists(path) or os.path.basename(path) != f"{pid}.txt" \
                    or not is_engine(pid):
                continue
            with contextlib.suppress(OSError):
                size = os.path.getsize(path)
                os.kill(pid, sig)
                marks[eid] = (path, size)
        out: dict[int, str] = {}
        deadline = time.monotonic() + wait
        while marks and time.monotonic() < deadline:
            for eid, (path, size) in list(marks.items()):
                with contextlib.suppress(OSError):
                    if os.path.getsize(path) > size:
                        time.sleep(0.05)  # let the dump finish
                        with open(path, errors="replace") as f:
                            f.seek(size)
                            out[ranks.by_engine(eid).rank] = engine.summarize_stack(f.read())
                        marks.pop(eid)
            time.sleep(0.02)
        return out

    def timed_out(self, ranks: RankMap, pending: Sequence[tuple[int, str]], timeout: float,
                  what: str, targets: Sequence[int] | None = None) -> ClusterTimeout:
        """Record a call that did not finish in ``timeout`` s; the error that says where, and
        which ranks already returned from it. ``targets``: the engine ids the call went to
        (default: every rank for a call on all ranks, none named for ``... on rank N``)."""
        stuck = ranks_of(ranks, [e for e, _ in pending])
        where = self.where(ranks, [e for e, _ in pending])
        self.last = {"ranks": stuck, "what": what, "since": time.time() - timeout,
                     "msg_ids": [m for _, m in pending], "where": where}
        doing = "".join(f"\n  rank {r}: {where[r]}" for r in stuck if r in where)
        returned = returned_ranks(ranks, stuck, what, targets)
        left = (f"; ranks {returned} already returned from it (a rank that left early, e.g. "
                "after a stop decided from its own numbers, leaves the others waiting in a "
                "collective it never joins)" if returned else "")
        return ClusterTimeout(
            f"{what} did not finish within {timeout:g} s; still running on ranks {stuck}"
            f"{left}{doing}\nA collective that some ranks never joined blocks forever, and "
            "Ctrl-C (SIGINT) cannot break it",
            "run cu.restart() to replace the engines (the process group is rebuilt), "
            "then re-run the cell; check every rank calls the same collectives, in the same "
            "order and with the same shapes",
        )

    def left_running(self, ranks: RankMap, pending: Sequence[tuple[int, str]], what: str,
                     failed: Sequence[int], grace: float = FAIL_FAST_S) -> str:
        """Record the ranks still running a call in which ``failed`` ranks raised; the
        sentence that says so (and where each of them is, from its stack)."""
        left = ranks_of(ranks, [e for e, _ in pending])
        where = self.where(ranks, [e for e, _ in pending])
        who = rank_list(failed) if failed else "a rank"
        self.last = {"ranks": left, "what": what, "since": time.time(),
                     "why": f"kept running after {who} failed",
                     "msg_ids": [m for _, m in pending], "where": where}
        doing = "".join(f"\n  rank {r}: {where[r]}" for r in left if r in where)
        one = len(left) == 1
        were, they, them, their = (("was", "It goes", "it", "its") if one
                                   else ("were", "They go", "them", "their"))
        hosts = [ranks[r].host for r in left] if len(ranks.hosts) > 1 else []
        return (f"{rank_list(left)}{on_hosts(hosts)} {were} still running {what} "
                f"{grace:g} s after {who} raised (most likely waiting for it: in a collective "
                f"it never reached, or for the chief; or {their} host lost the network)"
                f"{doing}\n{they} on until that wait ends, and a new call would queue behind "
                f"{them}")

    def still_stuck(self, queues: dict[Any, Any], registered: set[int]) -> ProcessGroupGone | None:
        """The error for a new call while ranks still run the call that timed out (it would
        only queue behind it); None (and forgotten) once that call is gone from the queues."""
        stuck = self.last
        if not stuck:
            return None
        pending = {m for eid, q in queues.items() if eid in registered
                   for m in q.get("queue", [])}
        if not pending & set(stuck["msg_ids"]):
            self.last = None
            return None
        since = time.time() - stuck["since"]
        doing = "".join(f"\n  rank {r}: {w}" for r, w in stuck.get("where", {}).items())
        restart = "run cu.restart() (replaces the engines and rebuilds the process group)"
        if "why" in stuck:  # left running after another rank raised: their wait may end
            return ProcessGroupGone(
                f"ranks {stuck['ranks']} are still busy in {stuck['what']}, which "
                f"{stuck['why']} {since:.0f} s ago{doing}\nEvery new call would queue behind it",
                f"wait until it ends (a wait with a timeout ends by itself, and calls then go "
                f"through), or {restart} now; then re-run the cell")
        return ProcessGroupGone(
            f"ranks {stuck['ranks']} are still stuck in {stuck['what']}, which timed out "
            f"{since:.0f} s ago{doing}\nEvery new call would queue behind it, and the process "
            "group cannot be used until those ranks are replaced",
            f"{restart}, then re-run the cell",
        )


def returned_ranks(ranks: RankMap, stuck: Sequence[int], what: str,
                   targets: Sequence[int] | None = None) -> list[int]:
    """The ranks a timed-out call went to that are no longer running it. Without ``targets``,
    a call named ``... on rank N`` went to one rank (none returned), any other to all ranks
    (``run``, ``call``, ``pull``, ``push``)."""
    if targets is None:
        if " on rank " in what:
            return []
        targets = ranks.engine_ids
    return sorted(r for r in ranks_of(ranks, targets) if r not in set(stuck))


def ranks_of(ranks: RankMap, engine_ids: Sequence[int]) -> list[int]:
    """The ranks of those of ``engine_ids`` that the rank map knows, in the same order."""
    return [ranks.by_engine(e).rank for e in engine_ids if ranks.has_engine(e)]


def queued_behind_others(ranks: list[int], behind: float, timeout: float,
                         what: str) -> ClusterTimeout:
    """The error for a call that waited ``timeout`` s behind another notebook's cell."""
    return ClusterTimeout(
        f"{what} did not start within {timeout:g} s: ranks {ranks} are running "
        f"another notebook's cell (for {behind:.0f} s) and this call waits behind it",
        "wait for that cell to finish (or interrupt it in its notebook), then re-run "
        "this cell; do not restart: that would kill the other notebook's work",
    )
