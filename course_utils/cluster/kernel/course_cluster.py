"""``CourseCluster``: a connected cluster, its rank map, and calls on every rank.

Introduced in ``00_cluster_tour`` (``cluster.run``, ``call``, ``pull``, ``push``). Made by
:mod:`.lifecycle` (``cu.start()``, ``launch()``). Frameworks attach through
:meth:`CourseCluster.on_restart` / :meth:`CourseCluster.on_stop`; this module imports neither
torch nor TensorFlow. The helpers it leans on, one concern each: :mod:`.launching` (processes),
:mod:`.sharing` (other kernels on the same engines), :mod:`.stuck_calls` (timeouts, stacks),
:mod:`.remote_errors` (errors from the engines), :mod:`.controller` (ipyparallel internals).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import ipyparallel as ipp

from ... import settings
from ...errors import (
    ClusterNotRunning,
    ClusterTimeout,
    EngineError,
    ProcessGroupGone,
    WorldSizeMismatch,
)
from ..engines import engine
from ..launchers import launching
from ..profiles import ClusterProfile
from ..ranks import RankMap, build_rank_map
from . import controller, registry, sharing, stopped
from .cluster_files import read_rank_map, write_course_file
from .failures import rank_list
from .remote_errors import engine_error, ipython, show_engine_errors_plainly
from .stuck_calls import StuckCalls, first_failures, queued_behind_others, ranks_of

Hook = Callable[["CourseCluster"], Any]


class CourseCluster:
    """A connected cluster: the ipyparallel client, a view on all engines and the rank map."""

    def __init__(self, cluster: ipp.Cluster, client: ipp.Client, profile: ClusterProfile,
                 owned: bool, n: int, preload: tuple[str, ...] = ()) -> None:
        self.cluster = cluster
        self.client = client
        self.profile = profile
        self.owned = owned
        self.n = n
        #: modules its engines import before their first call, on start and restart
        self.preload = preload
        self.rank_map: RankMap | None = None
        self.view = client.direct_view("all")
        self.view.block = True
        self._restart_hooks: dict[str, Hook] = {}
        self._stop_hooks: dict[str, Hook] = {}
        self.started_at = time.time()
        #: Facts frameworks leave for each other, e.g. ``pg_broken`` after a group timed out.
        self.flags: dict[str, Any] = {}
        self._stuck = StuckCalls()
        #: when ``cu.stop()`` ran (``time.time()``): later calls fail with the course's error
        self.stopped_at: float | None = None
        self.stopped_it = False

    # ---- facts -------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def ranks(self) -> RankMap:
        if self.rank_map is None:
            raise ClusterNotRunning("the cluster has no rank map yet", "call cu.start() first")
        return self.rank_map

    @property
    def cluster_id(self) -> str:
        return self.cluster.cluster_id

    def __repr__(self) -> str:
        who = "started here" if self.owned else "connected"
        return (f"<CourseCluster {self.cluster_id!r} profile={self.profile.name} "
                f"engines={len(self.client.ids)} ({who})>")

    # ---- calls on the engines ----------------------------------------------------------
    def _wait(self, ar: Any, timeout: float | None, what: str) -> Any:
        timeout = settings.call_timeout() if timeout is None else timeout
        try:
            failed = first_failures(ar, timeout)
            if failed:
                raise self.failed_while_others_run(ar, failed, what) from None
            return ar.get(timeout=0)
        except ipp.error.TimeoutError:
            pending = controller.pending(ar)
            behind = sharing.behind_others(self.client, [m for _, m in pending])
            if behind is not None:  # queued behind another notebook's cell: nothing is stuck
                ranks = ranks_of(self.ranks, [e for e, _ in pending])
                raise queued_behind_others(ranks, behind, timeout, what) from None
            raise self._stuck.timed_out(self.ranks, pending, timeout, what) from None
        except (ipp.error.CompositeError, ipp.error.RemoteError) as exc:
            err = engine_error(exc, self.rank_map)
            if isinstance(err, ProcessGroupGone):
                self.flags["pg_broken"] = True
            raise err from exc

    def failed_while_others_run(self, ar: Any, excs: list[Any], what: str) -> Exception:
        """The error of the ranks that raised, and which ranks still run the call (recorded:
        the next call fails at once while they do, instead of queueing behind them)."""
        err = engine_error(ipp.error.CompositeError(
            "ranks raised", [(e.ename, e.evalue, e.traceback, e.engine_info) for e in excs]),
            self.rank_map)
        if isinstance(err, ProcessGroupGone):
            self.flags["pg_broken"] = True
        ranks = ranks_of(self.ranks, [e.engine_info.get("engine_id") for e in excs])
        note = self._stuck.left_running(self.ranks, controller.pending(ar), what, ranks)
        fix = err.fix if "cu.restart()" in err.fix else (
            "if they are still busy, first run cu.restart() (it replaces the engines and "
            f"rebuilds the process group); {err.fix}")
        return type(err)(f"{err.cause}\n{note}", fix)

    def _follow_replaced_engines(self) -> bool:
        """Follow engines another kernel replaced; True when the rank map names live engines.

        A kernel that joined this cluster may replace every engine (its ``cu.restart()``, or
        stopping TF servers). This kernel's rank map then names engine ids the controller
        dropped and launchers whose pids are gone: every call would fail, ``cu.start()``
        would take the cluster for dead, and a stop would signal stale pids. So take the rank
        map that kernel saved beside the cluster file (it covers exactly the registered
        engines) and the engine sets its cluster file lists. No round trip while the rank map
        is current.
        """
        rm = self.rank_map
        if rm is None:
            return False
        ids = set(self.client.ids)
        if set(rm.engine_ids) <= ids:
            return True
        saved = read_rank_map(self.cluster_id, sorted(ids))
        if saved is None:
            return False
        self.rank_map = saved
        self._stuck.follow(saved, self.profile.is_local)
        sharing.sync_engine_sets(self.cluster)
        return True

    def check_stuck(self) -> None:
        """Fail at once, naming the cure, while ranks still run a call that timed out or
        when a rank's engine is gone (else ipyparallel answers with a bare ``KeyError: 1``)."""
        if self.stopped_at is not None:
            raise stopped.stopped_error(self.cluster_id, self.stopped_it, self.stopped_at)
        self._follow_replaced_engines()
        gone = [info.rank for info in self.ranks if info.engine_id not in set(self.client.ids)]
        if gone:
            raise EngineError(
                f"{rank_list(gone)} {'is' if len(gone) == 1 else 'are'} gone: the engine died "
                "or lost contact with the controller, so no call can reach "
                f"{'it' if len(gone) == 1 else 'them'}",
                "run `cu.restart()` (it replaces the engines and rebuilds the process group), "
                "then re-run this unit's set-up cell")
        if not self._stuck.last:
            return
        try:
            queues = controller.queue_status(self.client, timeout=5)
        except Exception:
            return
        err = self._stuck.still_stuck(queues, set(self.client.ids))
        if err is not None and self.ping(timeout=1.0):
            # the engines answer, so the stuck call has ended; the controller's queue just
            # has not caught up yet (seen right after an interrupt freed them)
            self._stuck.last = None
            err = None
        if err is not None:
            raise err

    def where(self, engine_ids: Sequence[int] | None = None, wait: float = 1.0) -> dict[int, str]:
        """What each rank's main thread is running right now: rank -> ``"all_reduce, called
        from only_rank0 line 9"``. Reads the stacks the engines dump on a signal (engines on
        this machine only; ranks it cannot ask are left out). Works while a rank is stuck."""
        return self._stuck.where(self.ranks, engine_ids, wait)

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float | None = None,
            **kwargs: Any) -> list[Any]:
        """Call ``fn(*args, **kwargs)`` on every rank; results are returned in rank order."""
        self.check_stuck()
        ar = self.client[self.ranks.engine_ids].apply_async(fn, *args, **kwargs)
        return self._wait(ar, timeout, f"{getattr(fn, '__name__', 'call')}()")

    def run_per_rank(self, fn: Callable[..., Any], args_by_rank: Sequence[Sequence[Any]],
                     timeout: float | None = None) -> list[Any]:
        """Call ``fn(*args_by_rank[r])`` on rank ``r`` for every rank, concurrently."""
        if len(args_by_rank) != self.world_size:
            raise WorldSizeMismatch(
                f"got arguments for {len(args_by_rank)} ranks, the cluster has {self.world_size}",
                "pass one argument tuple per rank",
            )
        self.check_stuck()
        ars = [self.client[info.engine_id].apply_async(fn, *args)
               for info, args in zip(self.ranks, args_by_rank, strict=True)]
        deadline = time.monotonic() + (settings.call_timeout() if timeout is None else timeout)
        return [self._wait(ar, max(0.0, deadline - time.monotonic()),
                           getattr(fn, "__name__", "call") + "()") for ar in ars]

    def run_on(self, rank: int, fn: Callable[..., Any], *args: Any,
               timeout: float | None = None) -> Any:
        """Call ``fn`` on one rank only."""
        self.check_stuck()
        ar = self.client[self.ranks[rank].engine_id].apply_async(fn, *args)
        return self._wait(ar, timeout, f"{getattr(fn, '__name__', 'call')}() on rank {rank}")

    def call(self, name: str, *args: Any, timeout: float | None = None, **kwargs: Any) -> list[Any]:
        """Call the function ``name`` defined in every rank's ``%%px`` namespace (rank order).

        This is how test cells in the kernel check a function a learner wrote in a ``%%px`` cell.
        """
        return self.run(engine.call_named, name, args, kwargs, timeout=timeout)

    def pull(self, name: str, timeout: float | None = None) -> list[Any]:
        """A variable from every rank's ``%%px`` namespace, in rank order."""
        self.check_stuck()
        ar = self.client[self.ranks.engine_ids].pull(name, block=False)
        return self._wait(ar, timeout, f"pull({name!r})")

    def push(self, namespace: dict[str, Any], timeout: float | None = None) -> None:
        """Set variables in every rank's ``%%px`` namespace."""
        self.check_stuck()
        ar = self.client[self.ranks.engine_ids].push(namespace, block=False)
        self._wait(ar, timeout, "push()")

    def ping(self, timeout: float = 5.0) -> bool:
        """True when every engine answers within ``timeout`` seconds."""
        try:
            self._follow_replaced_engines()
            self.client[self.ranks.engine_ids].apply_async(os.getpid).get(timeout=timeout)
            return True
        except Exception:
            return False

    def alive(self, timeout: float = 5.0) -> bool:
        """True when the controller answers and still lists every engine of the rank map.

        Asks the controller, not the engines: an engine busy with another notebook's cell is
        alive (its heartbeat runs in its own thread) though it will not answer a call now.
        """
        try:
            controller.queue_status(self.client, timeout=timeout)
        except Exception:
            return False
        return self._follow_replaced_engines()

    def busy(self, timeout: float = 5.0) -> dict[int, dict[str, Any]]:
        """Engines with tasks queued or running, by engine id: ``{"tasks": n, "since": s}``
        (seconds since the oldest was submitted, when the controller recorded it)."""
        return sharing.busy(self.client, timeout)

    # ---- hooks for frameworks ----------------------------------------------------------
    def on_restart(self, key: str, hook: Hook | None) -> None:
        """Run ``hook(cluster)`` after the engines were replaced (e.g. rebuild a process group)."""
        _set_hook(self._restart_hooks, key, hook)

    def on_stop(self, key: str, hook: Hook | None) -> None:
        """Run ``hook(cluster)`` before the cluster stops (e.g. destroy a process group)."""
        _set_hook(self._stop_hooks, key, hook)

    # ---- rank map ----------------------------------------------------------------------
    def refresh_ranks(self, timeout: float | None = None) -> RankMap:
        """Ask every engine who it is, assign ranks, and push each engine its rank.

        Engines busy with another notebook's cell cannot answer now: then the rank map that
        kernel pushed (saved beside the cluster file) is reused, or, without one, this waits
        for the running cell with a bounded, explained timeout.
        """
        timeout = settings.call_timeout() if timeout is None else timeout
        ids = sorted(self.client.ids)
        try:
            busy = self.busy()
        except Exception:
            busy = {}
        if busy:
            saved = read_rank_map(self.cluster_id, ids)
            if saved is not None:
                self.rank_map = saved
                return saved
            longest = max((b.get("since") or 0.0) for b in busy.values())
            print(f"cu: engines {sorted(busy)} are running another notebook's cell "
                  f"(for {longest:.0f} s); waiting up to {timeout:g} s for it to learn "
                  "which engine is which rank")
        where = self.profile.controller_ip or "127.0.0.1"
        ar = self.client[ids].apply_async(engine.describe, where)
        try:
            descs = ar.get(timeout=timeout)
        except ipp.error.TimeoutError:
            raise ClusterTimeout(
                f"engines did not say who they are within {timeout:g} s"
                + (" (they are busy with another notebook's cell)" if busy else ""),
                "wait for the other notebook's cell to finish, then run cu.start() again; "
                "if an engine is stuck, the notebook that started the cluster can run "
                "cu.restart()",
            ) from None
        rank_map = build_rank_map(dict(zip(ids, descs, strict=True)),
                                  host_order=self.profile.host_order,
                                  local=self.profile.is_local)
        ars = [self.client[info.engine_id].apply_async(engine.install, {**info.__dict__},
                                                        info.as_env())
               for info in rank_map]
        installed = [ar.get(timeout=timeout) for ar in ars]
        self._stuck.last = None
        self._stuck.stack_files = {
            info.engine_id: res["stack_file"] for info, res in zip(rank_map, installed,
                                                                   strict=True)
            if isinstance(res, dict) and res.get("stack_file")
        } if self.profile.is_local else {}
        self.rank_map = rank_map
        write_course_file(self.cluster, self.owned, rank_map)
        with contextlib.suppress(Exception):
            engine.remove_stale_stack_files()
        return rank_map

    def activate(self) -> None:
        """Make ``%%px`` run on every engine of this cluster, with quiet, ordered output."""
        self.view = self.client.direct_view("all")
        self.view.block = True
        ip = ipython()
        if ip is not None:  # outside IPython there are no magics to register
            self.view.activate()
            # Any kernel (not only the course's kernelspec) labels output by rank: [rank 1, ...]
            from . import pxoutput, pxwait

            pxoutput.install()
            pxwait.install()  # a rank that raised is reported in seconds, not after a timeout
            with contextlib.suppress(Exception):
                ip.run_line_magic("pxconfig", "--progress-after -1")
            show_engine_errors_plainly(ip)

    # ---- lifecycle ---------------------------------------------------------------------
    def restart(self, timeout: float | None = None, force: bool = False) -> CourseCluster:
        """Replace every engine (the only cure for a rank stuck in a collective), then re-run
        the restart hooks so the process group comes back. Engines get new ids and import
        what the cluster's start named in ``preload``.

        Refuses while the engines run another notebook's cell (that would kill its work),
        unless ``force``."""
        timeout = settings.start_timeout() if timeout is None else timeout
        others = None if force else sharing.running_others(self.client)
        if others is not None:
            raise ClusterTimeout(
                f"the engines are running another notebook's cell (for {others:.0f} s); "
                "restarting them now would kill its work",
                "wait for that cell to finish (or interrupt it in its notebook); if it is "
                "stuck for good, run cu.restart(force=True)",
            )
        self._follow_replaced_engines()  # stop the engines that run now, not stale pids
        old = set(self.client.ids)
        launching.stop_engines(self.cluster, kill=True)
        self._stuck.forget_stack_files()
        launching.start_engines(self.cluster, self.profile, self.n, self.preload)
        launching.wait_for_engines(self.cluster, self.client, self.n, timeout, exclude=old)
        launching.wait_unregistered(self.client, old)
        self.flags.pop("pg_broken", None)
        self.refresh_ranks()
        self.activate()
        for hook in list(self._restart_hooks.values()):
            hook(self)
        return self

    def stop(self, force: bool = False, kill: bool = False) -> None:
        """Stop the cluster if this process started it (or ``force``); else disconnect.

        The stop hooks run first (e.g. destroy the process group). ``kill=True``: nothing on
        the engines is worth a polite stop, so the hooks are skipped and the engines get
        SIGKILL at once (SIGTERM waits 2 s)."""
        stopping = self.owned or force
        if not (kill and stopping):
            for hook in list(self._stop_hooks.values()):
                with contextlib.suppress(Exception):
                    hook(self)
        with contextlib.suppress(Exception):
            self.client.close()
        if stopping:
            launching.stop_cluster(self.cluster, kill=kill)
            self._stuck.forget_stack_files()
        registry.forget(self)

    def refuse_calls(self, stopped_it: bool) -> None:
        """After ``cu.stop()``: every later call on this object, and ``%%px`` until a new
        ``cu.start()``, fails with the course's error (``stopped_it``: the cluster was
        stopped, not only disconnected from)."""
        self.stopped_at = time.time()
        self.stopped_it = stopped_it
        ip = ipython()
        if ip is not None and registry.current_or_none() is None:
            stopped.guard_px(ip, self.cluster_id, stopped_it, self.stopped_at)


def _set_hook(table: dict[str, Hook], key: str, hook: Hook | None) -> None:
    if hook is None:
        table.pop(key, None)
    else:
        table[key] = hook
