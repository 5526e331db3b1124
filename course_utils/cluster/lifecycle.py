"""Cluster lifecycle: start or connect, rank map, calls on every rank, restart, stop.

Introduced in ``00_cluster_tour``. This layer imports neither torch nor TensorFlow: frameworks
attach to it through :meth:`CourseCluster.on_restart` / :meth:`CourseCluster.on_stop` hooks.

Typical notebook use::

    import course_utils as cu
    cluster = cu.start()          # idempotent: reuses a running cluster (course lab's or ours)
    cu.start_torch()               # process group on every engine
    %%px                          # every later cell runs on every rank
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import re
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ipyparallel as ipp

from .. import settings
from ..errors import (
    ClusterNotRunning,
    ClusterTimeout,
    CourseError,
    EngineError,
    EnginesDidNotStart,
    ProcessGroupGone,
    WorldSizeMismatch,
)
from . import engine, failures, slurm
from .profiles import ClusterProfile, load_profile
from .ranks import RankInfo, RankMap, build_rank_map

log = logging.getLogger(__name__)

HEARTBEAT_MS = 500
HEARTBEAT_MISSES = 20

_current: CourseCluster | None = None


def profile_dir(name: str | None = None) -> str:
    """The IPython profile directory that holds cluster files and engine logs (created if new)."""
    from IPython.core.profiledir import ProfileDir
    from IPython.paths import get_ipython_dir

    name = name or settings.ipython_profile()
    ipdir = get_ipython_dir()
    try:
        return ProfileDir.find_profile_dir_by_name(ipdir, name).location
    except Exception:
        return ProfileDir.create_profile_dir_by_name(ipdir, name).location


def cluster_file(cluster_id: str | None = None, pdir: str | None = None) -> Path:
    cid = cluster_id or settings.cluster_id()
    return Path(pdir or profile_dir()) / "security" / f"cluster-{cid}.json"


def course_file(cluster_id: str | None = None, pdir: str | None = None) -> Path:
    """Beside ipyparallel's cluster file: who started the cluster and the rank map last pushed
    to its engines, so a second kernel can join while the engines are busy."""
    cid = cluster_id or settings.cluster_id()
    return Path(pdir or profile_dir()) / "security" / f"course-{cid}.json"


class CourseCluster:
    """A connected cluster: the ipyparallel client, a view on all engines and the rank map."""

    def __init__(
        self,
        cluster: ipp.Cluster,
        client: ipp.Client,
        profile: ClusterProfile,
        owned: bool,
        n: int,
    ) -> None:
        self.cluster = cluster
        self.client = client
        self.profile = profile
        self.owned = owned
        self.n = n
        self.rank_map: RankMap | None = None
        self.view = client.direct_view("all")
        self.view.block = True
        self._restart_hooks: dict[str, Callable[[CourseCluster], Any]] = {}
        self._stop_hooks: dict[str, Callable[[CourseCluster], Any]] = {}
        self.started_at = time.time()
        #: Facts frameworks leave for each other, e.g. ``pg_broken`` after a group timed out.
        self.flags: dict[str, Any] = {}
        # The last call that timed out: ranks still running it, what and since when.
        self._stuck: dict[str, Any] | None = None
        # engine id -> file its faulthandler writes stacks to (engines on this machine only)
        self._stack_files: dict[int, str] = {}

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
        return (
            f"<CourseCluster {self.cluster_id!r} profile={self.profile.name} "
            f"engines={len(self.client.ids)} ({who})>"
        )

    # ---- calls on the engines ----------------------------------------------------------
    def _wait(self, ar: Any, timeout: float | None, what: str) -> Any:
        timeout = settings.call_timeout() if timeout is None else timeout
        try:
            return ar.get(timeout=timeout)
        except ipp.error.TimeoutError:
            pending = [(eid, mid) for eid, mid, done in
                       zip(ar._targets, ar.msg_ids, _done_flags(ar), strict=False) if not done]
            ranks = [self.ranks.by_engine(e).rank for e, _ in pending if self._has_engine(e)]
            behind = self._behind_others([m for _, m in pending])
            if behind is not None:  # queued behind another notebook's cell: nothing is stuck
                raise ClusterTimeout(
                    f"{what} did not start within {timeout:g} s: ranks {ranks} are running "
                    f"another notebook's cell (for {behind:.0f} s) and this call waits behind it",
                    "wait for that cell to finish (or interrupt it in its notebook), then re-run "
                    "this cell; do not restart: that would kill the other notebook's work",
                ) from None
            where = self.where([e for e, _ in pending])
            self._stuck = {"ranks": ranks, "what": what, "since": time.time() - timeout,
                           "msg_ids": [m for _, m in pending], "where": where}
            doing = "".join(f"\n  rank {r}: {where[r]}" for r in ranks if r in where)
            raise ClusterTimeout(
                f"{what} did not finish within {timeout:g} s; still running on ranks {ranks}"
                f"{doing}\nA collective that some ranks never joined blocks forever, and Ctrl-C "
                "(SIGINT) cannot break it",
                "run cu.restart() to replace the engines (the process group is rebuilt), "
                "then re-run the cell; check every rank calls the same collectives in order",
            ) from None
        except (ipp.error.CompositeError, ipp.error.RemoteError) as exc:
            err = _engine_error(exc, self)
            if isinstance(err, ProcessGroupGone):
                self.flags["pg_broken"] = True
            raise err from exc

    def _others_since(self, msg_ids: Sequence[str]) -> float | None:
        """Seconds since the oldest of ``msg_ids`` that *another* client submitted was
        submitted; None when all of them are this kernel's."""
        if not msg_ids:
            return None
        records = _records(self.client, msg_ids, ["client_uuid", "submitted"])
        mine = self.client.session.session
        others = [r for r in records if r.get("client_uuid") not in (None, mine)]
        if not others:
            return None
        now = datetime.datetime.now(datetime.UTC)
        times = [r["submitted"] for r in others
                 if isinstance(r.get("submitted"), datetime.datetime)]
        return (now - min(times)).total_seconds() if times else 0.0

    def _behind_others(self, msg_ids: Sequence[str]) -> float | None:
        """How long another notebook's task ahead of ``msg_ids`` has been queued or running
        (None: what runs ahead of them is this kernel's own)."""
        try:
            status = _queue_status(self.client, timeout=5)
            ahead = []
            for q in status.values():
                queue = list(q.get("queue", [])) if isinstance(q, dict) else []
                for mid in msg_ids:
                    if mid in queue:
                        ahead += queue[:queue.index(mid)]
            return self._others_since(ahead)
        except Exception:
            return None

    def _running_others(self) -> float | None:
        """How long another notebook's task has been running on an engine of this cluster."""
        try:
            status = _queue_status(self.client, timeout=5)
            registered = set(self.client.ids)
            heads = [q["queue"][0] for eid, q in status.items()
                     if eid in registered and isinstance(q, dict) and q.get("queue")]
            return self._others_since(heads)
        except Exception:
            return None

    def _follow_replaced_engines(self) -> bool:
        """Follow engines another kernel replaced; True when the rank map names live engines.

        A kernel that joined this cluster may replace every engine (its ``cu.restart()``, each
        ``tf_dist.teardown()``). This kernel's rank map then names engine ids the controller
        dropped and its launchers pids that are gone, so every call here failed, ``cu.start()``
        took the cluster for dead and stopped it (the other kernel's engines with it), and a
        stop signalled stale pids. Take the rank map that kernel saved beside the cluster file
        (it covers exactly the registered engines) and the engine sets its cluster file lists.
        Costs nothing while the rank map is current (no round trip).
        """
        rm = self.rank_map
        if rm is None:
            return False
        ids = set(self.client.ids)
        if set(rm.engine_ids) <= ids:
            return True
        saved = _read_rank_map(self.cluster_id, sorted(ids))
        if saved is None:
            return False
        self.rank_map = saved
        self._stuck = None
        self._forget_stack_files()  # the replaced engines' files
        if self.profile.is_local:  # the new engines dump their stacks where their pid says
            self._stack_files = {r.engine_id: engine.stack_file(r.pid) for r in saved
                                 if os.path.exists(engine.stack_file(r.pid))}
        _sync_engine_sets(self.cluster)
        return True

    def _check_stuck(self) -> None:
        """Fail at once, naming the cure, while ranks still run a call that timed out: a new
        call would only queue behind it."""
        self._follow_replaced_engines()
        stuck = self._stuck
        if not stuck:
            return
        try:
            status = _queue_status(self.client, timeout=5)
        except Exception:
            return
        registered = set(self.client.ids)
        pending = {m for eid, q in status.items() if eid in registered for m in q.get("queue", [])}
        if not pending & set(stuck["msg_ids"]):
            self._stuck = None
            return
        since = time.time() - stuck["since"]
        doing = "".join(f"\n  rank {r}: {w}" for r, w in stuck.get("where", {}).items())
        raise ProcessGroupGone(
            f"ranks {stuck['ranks']} are still stuck in {stuck['what']}, which timed out "
            f"{since:.0f} s ago{doing}\nEvery new call would queue behind it, and the process "
            "group cannot be used until those ranks are replaced",
            "run cu.restart() (replaces the engines and rebuilds the process group), then "
            "re-run the cell",
        )

    def _forget_stack_files(self) -> None:
        for path in self._stack_files.values():
            with contextlib.suppress(OSError):
                os.unlink(path)
        self._stack_files = {}

    def where(self, engine_ids: Sequence[int] | None = None, wait: float = 1.0) -> dict[int, str]:
        """What each rank's main thread is running right now: rank -> ``"all_reduce, called
        from only_rank0 line 9"``. Reads the stacks the engines dump on a signal (engines on
        this machine only; ranks it cannot ask are left out). Works while a rank is stuck."""
        ids = list(self.ranks.engine_ids if engine_ids is None else engine_ids)
        sig = engine.STACK_SIGNAL
        marks: dict[int, tuple[str, int]] = {}
        for eid in ids:
            path = self._stack_files.get(eid)
            if sig is None or not path or not self._has_engine(eid):
                continue
            pid = self.ranks.by_engine(eid).pid
            if not os.path.exists(path) or f"-{pid}." not in path or not _is_engine(pid):
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
                            out[self.ranks.by_engine(eid).rank] = engine.summarize_stack(f.read())
                        marks.pop(eid)
            time.sleep(0.02)
        return out

    def _has_engine(self, eid: int) -> bool:
        try:
            self.ranks.by_engine(eid)
            return True
        except KeyError:
            return False

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float | None = None,
            **kwargs: Any) -> list[Any]:
        """Call ``fn(*args, **kwargs)`` on every rank; results are returned in rank order."""
        self._check_stuck()
        view = self.client[self.ranks.engine_ids]
        ar = view.apply_async(fn, *args, **kwargs)
        return self._wait(ar, timeout, f"{getattr(fn, '__name__', 'call')}()")

    def run_per_rank(self, fn: Callable[..., Any], args_by_rank: Sequence[Sequence[Any]],
                     timeout: float | None = None) -> list[Any]:
        """Call ``fn(*args_by_rank[r])`` on rank ``r`` for every rank, concurrently."""
        if len(args_by_rank) != self.world_size:
            raise WorldSizeMismatch(
                f"got arguments for {len(args_by_rank)} ranks, the cluster has {self.world_size}",
                "pass one argument tuple per rank",
            )
        self._check_stuck()
        ars = [
            self.client[info.engine_id].apply_async(fn, *args)
            for info, args in zip(self.ranks, args_by_rank, strict=True)
        ]
        deadline = time.monotonic() + (settings.call_timeout() if timeout is None else timeout)
        return [self._wait(ar, max(0.0, deadline - time.monotonic()),
                           getattr(fn, "__name__", "call") + "()") for ar in ars]

    def run_on(self, rank: int, fn: Callable[..., Any], *args: Any,
               timeout: float | None = None) -> Any:
        """Call ``fn`` on one rank only."""
        self._check_stuck()
        ar = self.client[self.ranks[rank].engine_id].apply_async(fn, *args)
        return self._wait(ar, timeout, f"{getattr(fn, '__name__', 'call')}() on rank {rank}")

    def call(self, name: str, *args: Any, timeout: float | None = None, **kwargs: Any) -> list[Any]:
        """Call the function ``name`` defined in every rank's ``%%px`` namespace (rank order).

        This is how test cells in the kernel check a function a learner wrote in a ``%%px`` cell.
        """
        return self.run(engine.call_named, name, args, kwargs, timeout=timeout)

    def pull(self, name: str, timeout: float | None = None) -> list[Any]:
        """A variable from every rank's ``%%px`` namespace, in rank order."""
        self._check_stuck()
        ar = self.client[self.ranks.engine_ids].pull(name, block=False)
        return self._wait(ar, timeout, f"pull({name!r})")

    def push(self, namespace: dict[str, Any], timeout: float | None = None) -> None:
        """Set variables in every rank's ``%%px`` namespace."""
        self._check_stuck()
        ar = self.client[self.ranks.engine_ids].push(namespace, block=False)
        self._wait(ar, timeout, "push()")

    def ping(self, timeout: float = 5.0) -> bool:
        """True when every engine answers within ``timeout`` seconds."""
        try:
            self._follow_replaced_engines()
            ar = self.client[self.ranks.engine_ids].apply_async(os.getpid)
            ar.get(timeout=timeout)
            return True
        except Exception:
            return False

    def alive(self, timeout: float = 5.0) -> bool:
        """True when the controller answers and still lists every engine of the rank map.

        Asks the controller, not the engines: an engine busy with another notebook's cell is
        alive (its heartbeat runs in its own thread) though it will not answer a call now.
        """
        try:
            _queue_status(self.client, timeout=timeout)
        except Exception:
            return False
        return self._follow_replaced_engines()

    def busy(self, timeout: float = 5.0) -> dict[int, dict[str, Any]]:
        """Engines with tasks queued or running, by engine id: ``{"tasks": n, "since": s}``
        (seconds since the oldest was submitted, when the controller recorded it)."""
        status = _queue_status(self.client, timeout=timeout)
        registered = set(self.client.ids)  # the controller keeps queues of engines it dropped
        out: dict[int, dict[str, Any]] = {}
        for eid, q in status.items():
            if eid in registered and q.get("queue"):
                out[eid] = {"tasks": len(q["queue"]), "msg_ids": list(q["queue"])}
        if out:
            submitted = _submitted(self.client, [m for b in out.values() for m in b["msg_ids"]])
            now = datetime.datetime.now(datetime.UTC)
            for b in out.values():
                times = [submitted[m] for m in b["msg_ids"] if submitted.get(m)]
                b["since"] = (now - min(times)).total_seconds() if times else None
        return out

    # ---- hooks for frameworks ----------------------------------------------------------
    def on_restart(self, key: str, hook: Callable[[CourseCluster], Any] | None) -> None:
        """Run ``hook(cluster)`` after the engines were replaced (e.g. rebuild a process group)."""
        _set_hook(self._restart_hooks, key, hook)

    def on_stop(self, key: str, hook: Callable[[CourseCluster], Any] | None) -> None:
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
            saved = _read_rank_map(self.cluster_id, ids)
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
        rank_map = build_rank_map(
            dict(zip(ids, descs, strict=True)),
            host_order=self.profile.host_order,
            local=self.profile.is_local,
        )
        ars = []
        for info in rank_map:
            env = info.as_env()
            ars.append(self.client[info.engine_id].apply_async(
                engine.install, {**info.__dict__}, env))
        installed = [ar.get(timeout=timeout) for ar in ars]
        self._stack_files = {
            info.engine_id: res.get("stack_file") for info, res in zip(rank_map, installed,
                                                                        strict=True)
            if isinstance(res, dict) and res.get("stack_file")
        } if self.profile.is_local else {}
        self.rank_map = rank_map
        self._stuck = None
        _write_course_file(self, rank_map)
        with contextlib.suppress(Exception):
            engine.remove_stale_stack_files()
        return rank_map

    def activate(self) -> None:
        """Make ``%%px`` run on every engine of this cluster, with quiet, ordered output."""
        self.view = self.client.direct_view("all")
        self.view.block = True
        ip = _ipython()
        if ip is not None:  # outside IPython there are no magics to register
            self.view.activate()
            # Any kernel (not only the course's kernelspec) labels output by rank: [rank 1, ...]
            from course_utils.cluster import pxoutput

            pxoutput.install()
            with contextlib.suppress(Exception):
                ip.run_line_magic("pxconfig", "--progress-after -1")
            _show_engine_errors_plainly(ip)

    # ---- lifecycle ---------------------------------------------------------------------
    def restart(self, timeout: float | None = None, force: bool = False) -> CourseCluster:
        """Replace every engine (the only cure for a rank stuck in a collective), then re-run
        the restart hooks so the process group comes back. Engines get new ids.

        Refuses while the engines run another notebook's cell (that would kill its work),
        unless ``force``."""
        timeout = settings.start_timeout() if timeout is None else timeout
        others = None if force else self._running_others()
        if others is not None:
            raise ClusterTimeout(
                f"the engines are running another notebook's cell (for {others:.0f} s); "
                "restarting them now would kill its work",
                "wait for that cell to finish (or interrupt it in its notebook); if it is "
                "stuck for good, run cu.restart(force=True)",
            )
        n = self.n
        self._follow_replaced_engines()  # stop the engines that run now, not stale pids
        old = set(self.client.ids)
        _stop_engines(self.cluster, kill=True)
        self._forget_stack_files()
        _start_engines(self.cluster, self.profile, n)
        _wait_for_engines(self.cluster, self.client, n, timeout, exclude=old)
        _wait_unregistered(self.client, old)
        self.flags.pop("pg_broken", None)
        self.refresh_ranks()
        self.activate()
        for hook in list(self._restart_hooks.values()):
            hook(self)
        return self

    def stop(self, force: bool = False) -> None:
        """Run stop hooks; stop the cluster if this process started it (or ``force``)."""
        global _current
        for hook in list(self._stop_hooks.values()):
            with contextlib.suppress(Exception):
                hook(self)
        if self.owned or force:
            with contextlib.suppress(Exception):
                self.client.close()
            _stop_cluster(self.cluster)
            self._forget_stack_files()
        else:
            with contextlib.suppress(Exception):
                self.client.close()
        if _current is self:
            _current = None


# ---- module-level API ----------------------------------------------------------------------
def current() -> CourseCluster:
    """The cluster this kernel is using; raises a clear error when there is none."""
    if _current is None:
        raise ClusterNotRunning("no cluster is connected in this kernel", "run cu.start() first")
    return _current


def start(
    n: int | None = None,
    profile: str | ClusterProfile | None = None,
    timeout: float | None = None,
    cluster_id: str | None = None,
) -> CourseCluster:
    """Start or connect to the course cluster and give every engine its rank. Idempotent.

    1. the cluster already connected in this kernel, if it still answers;
    2. else a running cluster with the same id (e.g. started by ``course lab``);
    3. else a new one with ``n`` engines (default ``$COURSE_ENGINES`` or 2).

    ``n=None`` accepts whatever is running; an explicit ``n`` that differs is an error.
    """
    global _current
    prof = load_profile(profile if profile is not None else settings.cluster_profile())
    want = prof.engine_count(n)
    if want is not None and want < 1:
        raise WorldSizeMismatch(f"n={want} engines asked for", "use n >= 1")
    timeout = settings.start_timeout() if timeout is None else timeout
    cid = cluster_id or settings.cluster_id()

    if _current is not None and _current.cluster_id == cid:
        # Asks the controller, not the engines: busy engines are alive, never replaced here.
        alive = _current.alive()
        if alive and (want is None or want == _current.n):
            _current.activate()
            return _current
        if want is not None and want != _current.n and alive:
            if not _current.owned:
                raise WorldSizeMismatch(
                    f"the running cluster {cid!r} has {_current.n} engines, n={want} was asked",
                    f"call cu.start() without n, or stop course lab and start it with "
                    f"COURSE_ENGINES={want}",
                )
        _current.stop()
        _current = None

    cc = _connect_existing(cid, prof, want, timeout)
    if cc is None:
        cc = _start_new(cid, prof, want or settings.default_engines(), timeout)
        _write_course_file(cc, None)
    cc.refresh_ranks()
    cc.activate()
    _current = cc
    return cc


def stop(force: bool = False) -> None:
    """Tear down: stop hooks (process groups), then the cluster if this kernel started it."""
    if _current is not None:
        _current.stop(force=force)


def restart(timeout: float | None = None, force: bool = False) -> CourseCluster:
    """Replace the engines of the current cluster; see :meth:`CourseCluster.restart`."""
    return current().restart(timeout=timeout, force=force)


def stop_running(cluster_id: str | None = None) -> bool:
    """Stop a cluster started by another process (``course lab``'s) from its cluster file."""
    path = cluster_file(cluster_id)
    if not path.exists():
        return False
    try:
        cl = ipp.Cluster.from_file(str(path), shutdown_atexit=False, log_level=logging.ERROR)
    except Exception:
        path.unlink(missing_ok=True)
        course_file(cluster_id).unlink(missing_ok=True)
        return False
    _stop_cluster(cl)
    path.unlink(missing_ok=True)
    return True


# ---- internals -----------------------------------------------------------------------------
def _ipython() -> Any:
    try:
        from IPython import get_ipython

        return get_ipython()
    except ImportError:
        return None


def _show_engine_errors_plainly(ip: Any) -> None:
    """``%%px`` cells (and raw ipyparallel calls) that fail show the course's summary: ranks
    grouped, the learner's lines, known torch messages explained, the fix. The error's name
    and value stay ipyparallel's (``CompositeError``), which graders and nbval read."""
    if getattr(ip, "_course_px_errors", False):
        return

    def handler(shell: Any, etype: Any, value: Any, tb: Any, tb_offset: Any = None) -> list[str]:
        cc = _current
        if cc is None:
            stb = shell.InteractiveTB.structured_traceback(etype, value, tb, tb_offset=tb_offset)
        else:
            err = _engine_error(value, cc)
            if isinstance(err, ProcessGroupGone):
                cc.flags["pg_broken"] = True
            stb = [f"\x1b[31m{type(err).__name__}\x1b[0m: {err.cause}", f"Fix: {err.fix}"]
        shell._showtraceback(etype, value, stb)  # IPython leaves the display to the handler
        return stb

    ip.set_custom_exc((ipp.error.CompositeError, ipp.error.RemoteError), handler)
    ip._course_px_errors = True


def _set_hook(table: dict[str, Any], key: str, hook: Any) -> None:
    if hook is None:
        table.pop(key, None)
    else:
        table[key] = hook


def _done_flags(ar: Any) -> list[bool]:
    try:
        return [bool(ar._children[i].done()) for i in range(len(ar._children))]
    except Exception:
        return [False] * len(getattr(ar, "_targets", []))


def _engine_error(exc: Exception, cc: CourseCluster) -> CourseError:
    """One learner-facing error for what failed on the engines (see :mod:`.failures`)."""
    errors = exc.elist if isinstance(exc, ipp.error.CompositeError) else [
        (exc.ename, exc.evalue, exc.traceback, exc.engine_info)
    ]
    found, died = [], []
    for ename, evalue, tb, info in errors:
        eid = (info or {}).get("engine_id")
        lost = re.match(r"Engine (\d+) died", str(evalue)) if ename == "EngineError" else None
        if eid is None and lost:  # the controller lost its heartbeat: process or host gone
            eid = int(lost.group(1))
        rank = None
        if eid is not None and cc.rank_map is not None and cc._has_engine(eid):
            info_r = cc.ranks.by_engine(eid)
            rank = info_r.rank
            if lost:
                died.append(f"rank {rank} on {info_r.host}" if len(cc.ranks.hosts) > 1
                            else f"rank {rank}")
        elif lost:
            died.append(f"engine {eid}")
        text = "\n".join(tb) if isinstance(tb, list) else str(tb or "")
        found.append(failures.Failure(rank, eid, str(ename), str(evalue), text))
    if died:  # one line per rank, with its host: which ranks are gone and what the rest saw
        lines = []
        for f in found:
            where = f"engine {f.engine_id}"
            if f.rank is not None:
                host = cc.ranks[f.rank].host
                where = f"rank {f.rank} on {host}" if len(cc.ranks.hosts) > 1 else f"rank {f.rank}"
            lost = f.ename == "EngineError" and re.match(r"Engine (\d+) died", f.evalue)
            evalue = ("died or lost contact with the controller (its process or its host is gone)"
                      if lost else f.evalue.splitlines()[0][:300] if f.evalue else "")
            lines.append(f"[{where}] {f.ename}: {evalue}")
        return EngineError(
            "code failed on the engines:\n  " + "\n  ".join(lines),
            f"{', '.join(died)} is gone: check that host (network, `course doctor --hosts`), "
            "then run cu.restart() to replace the engines and rebuild the process group")
    return failures.describe(found)


def _new_ipp_cluster(cid: str, prof: ClusterProfile, n: int) -> ipp.Cluster:
    kw = prof.cluster_kwargs()
    cl = ipp.Cluster(
        n=n,
        cluster_id=cid,
        profile_dir=profile_dir(),
        delay=0,  # engines get the connection info directly; no need to sleep after the controller
        shutdown_atexit=True,
        # ipyparallel logs every killed engine's whole output as a warning; our own errors
        # carry the output when it matters (EnginesDidNotStart).
        log_level=logging.ERROR,
        # ipyparallel finishes an engine's registration on its first heartbeats; the default
        # 3 s period costs ~5 s per start. 0.5 s with 20 allowed misses keeps a 10 s tolerance.
        controller_args=[
            f"--HeartMonitor.period={HEARTBEAT_MS}",
            f"--HeartMonitor.max_heartmonitor_misses={HEARTBEAT_MISSES}",
        ],
        **kw,
    )
    cmd = prof.engine_cmd()
    if cmd:
        cl.config.LocalEngineLauncher.engine_cmd = cmd
        cl.config.LocalEngineSetLauncher.engine_cmd = cmd
    return cl


def _remote_profile_base(pdir: str) -> str:
    """Where SSH hosts keep their copy of the profile: like ipyparallel, relative to the remote
    home when the local profile is under this home (``.ipython/profile_course``)."""
    home = os.path.expanduser("~").rstrip("/") + "/"
    return pdir[len(home):] if pdir.startswith(home) else pdir


def ssh_preflight(prof: ClusterProfile, timeout: float = 15.0) -> dict[str, str]:
    """``ssh HOST true`` to every host of an SSH profile at once; host -> why it failed.

    Empty when every host answers. Bounded by ``timeout`` (plus ssh's ConnectTimeout), so an
    unreachable host costs seconds, not a hung start. Used by :func:`_start_engines` and by
    ``course doctor --hosts``.
    """
    import subprocess

    procs = {h.host: subprocess.Popen(prof.ssh_argv(h, "true"), stdin=subprocess.DEVNULL,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True)
             for h in prof.hosts}
    deadline = time.monotonic() + timeout
    failed: dict[str, str] = {}
    for host, p in procs.items():
        try:
            _, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            failed[host] = f"no answer within {timeout:g} s"
            continue
        if p.returncode != 0:
            lines = [ln for ln in (err or "").strip().splitlines() if ln.strip()]
            failed[host] = lines[-1] if lines else f"ssh exited {p.returncode}"
    return failed


def _owner_only(cl: ipp.Cluster) -> None:
    """The cluster file (pids, hosts, ports) readable by its owner only, like the connection
    files the controller writes (0600): another user on a shared host learns nothing."""
    path = getattr(cl, "cluster_file", "")
    if path and os.path.exists(path):
        with contextlib.suppress(OSError):
            os.chmod(path, 0o600)


def _start_engines(cl: ipp.Cluster, prof: ClusterProfile, n: int) -> None:
    _owner_only(cl)
    threads = settings.threads_per_engine(prof.engines_per_host(n))
    env = prof.engine_env(n, threads)
    if prof.launcher != "ssh":
        cl.start_engines_sync(n, environment=env)
        return
    # SSH: every host must answer before any engine starts (a clear error naming the host,
    # instead of engines left running on the hosts that did answer).
    failed = ssh_preflight(prof)
    if failed:
        raise EnginesDidNotStart(
            "cannot reach " + "; ".join(f"host {h!r} over ssh ({why})"
                                        for h, why in failed.items()),
            "check that the host is up and its sshd runs, then `ssh "
            f"{' '.join(prof.ssh_argv(next(iter(failed)), 'true')[1:-1])} true` works; "
            "`course doctor --hosts PROFILE` checks every host",
        )
    # Set on every start, also on a cluster loaded from its file (a kernel that joined course
    # lab's cluster and restarts it): per host its engine count, interpreter, remote profile
    # folder and environment (with COURSE_NODE: which host), and the ssh/scp commands.
    for key, value in prof.ssh_launcher_settings(
            env, _remote_profile_base(cl.profile_dir)).items():
        setattr(cl.config.SSHEngineSetLauncher, key, value)
    from .ssh_launcher import CourseSSHEngineSetLauncher, HostStartError

    cl.engine_launcher_class = CourseSSHEngineSetLauncher
    try:
        cl.start_engines_sync(prof.engine_count(n), environment=env)
    except HostStartError as exc:
        raise EnginesDidNotStart(
            f"could not start engines on host {exc.host!r} over ssh: {exc.why}",
            "check the host's python path in the profile (the course's venv, with ipyparallel, "
            "at the same path on every host) and that the host can reach controller_ip; "
            "`course doctor --hosts PROFILE` names the failing check",
        ) from exc


def _stop_engines(cl: ipp.Cluster, kill: bool = False) -> None:
    """SIGTERM, then SIGKILL after 2 s; ``kill=True`` skips the polite step (a rank stuck in a
    C-level collective ignores SIGINT and may not reach a Python SIGTERM handler)."""
    for es in list(cl.engines.values()):
        for el in list(getattr(es, "launchers", {}).values()):
            with contextlib.suppress(Exception):
                el.stop_seconds_until_kill = 2
    if kill:
        with contextlib.suppress(Exception):
            cl.signal_engines_sync(signal.SIGKILL)
    with contextlib.suppress(Exception):
        cl.stop_engines_sync()


def _stop_cluster(cl: ipp.Cluster) -> None:
    """Stop every engine and the controller, then remove the cluster's files.

    The cluster file is read *first*: engines another kernel started (``cu.restart()``,
    every TF teardown) are recorded there, not in this process's ``cl``.
    """
    _adopt_recorded_engines(cl)
    _stop_engines(cl)
    with contextlib.suppress(Exception):
        engine.remove_stale_stack_files()
    with contextlib.suppress(Exception):
        cl.stop_controller_sync()
    with contextlib.suppress(Exception):
        cl.remove_cluster_file()
    with contextlib.suppress(Exception):
        _course_file_of(cl).unlink(missing_ok=True)


def _adopt_recorded_engines(cl: ipp.Cluster) -> None:
    """Add to ``cl`` the engine sets its cluster file lists that ``cl`` does not know."""
    path = getattr(cl, "cluster_file", None)
    if not path or not os.path.exists(path):
        return
    try:
        # CRITICAL: engines that already exited are expected here, not worth a log line
        recorded = ipp.Cluster.from_file(path, shutdown_atexit=False,
                                         log_level=logging.CRITICAL)
    except Exception:
        return
    for key, es in recorded.engines.items():
        if key not in cl.engines:
            cl.engines[key] = es


def _sync_engine_sets(cl: ipp.Cluster) -> None:
    """Make ``cl``'s engine sets those its cluster file lists: adopt the sets another kernel
    started, forget (without signalling) those it stopped, so that a later stop here signals
    the engines that run, never pids that are gone and may be reused."""
    path = getattr(cl, "cluster_file", None)
    if not path or not os.path.exists(path):
        return
    try:
        with open(path) as f:
            recorded = set((json.load(f).get("engines") or {}).get("sets", {}))
    except (OSError, ValueError, AttributeError):
        return
    for key in [k for k in cl.engines if k not in recorded]:
        es = cl.engines.pop(key)
        for el in list(getattr(es, "launchers", {}).values()):
            event = getattr(el, "_stop_waiting", None)
            if event is not None:  # its polling thread ends; the engine is already gone
                event.set()
    _adopt_recorded_engines(cl)


def _course_file_of(cl: ipp.Cluster) -> Path:
    return Path(cl.profile_dir) / "security" / f"course-{cl.cluster_id}.json"


def _engine_output(cl: ipp.Cluster, limit: int = 1500) -> str:
    out = []
    for es in cl.engines.values():
        with contextlib.suppress(Exception):
            text = es.get_output()
            if text:
                out.append(text.strip())
    text = "\n".join(out).strip()
    return text[-limit:] if text else "(no engine output)"


def _process_alive(proc: Any) -> bool:
    import psutil

    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _engines_all_exited(cl: ipp.Cluster) -> bool:
    """True when every engine process we launched has exited (checked on the processes
    themselves: the launchers' own state only updates while ipyparallel's loop runs)."""
    launchers = [el for es in cl.engines.values()
                 for el in getattr(es, "launchers", {}).values()]
    if not launchers:
        return all(getattr(es, "state", "running") == "after" for es in cl.engines.values())
    for el in launchers:
        proc = getattr(el, "process", None)
        if proc is None:
            if getattr(el, "state", "running") != "after":
                return False
        elif _process_alive(proc):
            return False
    return True


def _wait_for_engines(cl: ipp.Cluster, client: ipp.Client, n: int, timeout: float,
                      exclude: set[int] | None = None) -> None:
    """Wait until ``n`` engines (not in ``exclude``) registered; fail fast if they all died."""
    exclude = exclude or set()
    deadline = time.monotonic() + timeout
    while True:
        fresh = [e for e in client.ids if e not in exclude]
        if len(fresh) >= n:
            return
        # Hook: a Slurm job stuck in the queue or ended says so itself (cluster/slurm.py).
        stuck = slurm.engines_problem(cl, len(fresh), n, time.monotonic() > deadline)
        if stuck is not None:
            _stop_cluster(cl)
            raise stuck
        if time.monotonic() > deadline or _engines_all_exited(cl):
            died = _engines_all_exited(cl)
            output = _engine_output(cl)
            _stop_cluster(cl)
            reason = "exited before registering" if died else f"did not register in {timeout:g} s"
            raise EnginesDidNotStart(
                f"{n - len(fresh)} of {n} engines {reason}. Engine output:\n{output}",
                "run `course doctor` for the failing check; on a slow machine raise "
                "$COURSE_START_TIMEOUT; for remote hosts check the profile's python path "
                "and that the hosts can reach controller_ip",
            )
        time.sleep(0.02)


def _wait_unregistered(client: ipp.Client, old: set[int],
                       timeout: float = HEARTBEAT_MS * HEARTBEAT_MISSES / 1000 + 5) -> None:
    """Wait until the controller dropped the replaced engines ``old``, so the rank map and
    ``%%px`` see only the new ones. Locally an engine's nanny reports its death at once; a
    Slurm job's cancel kills the nannies too, and the controller notices only when the
    heartbeats stop (``HEARTBEAT_MISSES`` periods)."""
    deadline = time.monotonic() + timeout
    while set(client.ids) & old and time.monotonic() < deadline:
        time.sleep(0.05)


def _start_new(cid: str, prof: ClusterProfile, n: int, timeout: float) -> CourseCluster:
    stale = cluster_file(cid)
    stale.unlink(missing_ok=True)
    for kind in ("client", "engine"):  # left by a controller stopped while it started
        (stale.parent / f"ipcontroller-{cid}-{kind}.json").unlink(missing_ok=True)
    cl = _new_ipp_cluster(cid, prof, n)
    cl.start_controller_sync()
    try:
        _start_engines(cl, prof, n)
        client = cl.connect_client_sync()
    except CourseError:  # already says cause and fix (e.g. sbatch refused the engines' job)
        _stop_cluster(cl)
        raise
    except Exception as exc:
        _stop_cluster(cl)
        raise EnginesDidNotStart(
            f"could not launch engines: {exc}", "run `course doctor` to see which part fails"
        ) from exc
    _wait_for_engines(cl, client, n, timeout)
    return CourseCluster(cl, client, prof, owned=True, n=n)


def _connect_existing(cid: str, prof: ClusterProfile, want: int | None,
                      timeout: float) -> CourseCluster | None:
    """Connect to a running cluster with this id; ``None`` when there is none (a stale file is
    removed). Never stops a cluster another process started while it has engines: engines
    that do not answer because they run another notebook's cell are busy, not dead."""
    path = cluster_file(cid)
    if not path.exists():
        return None
    try:
        cl = ipp.Cluster.from_file(str(path), shutdown_atexit=False, log_level=logging.ERROR)
    except Exception:
        cl = None
    if cl is None or cl.controller is None:  # unreadable, or its controller process is gone
        path.unlink(missing_ok=True)
        course_file(cid).unlink(missing_ok=True)
        return None
    try:
        client = cl.connect_client_sync(timeout=5)
        _queue_status(client, timeout=5)  # the controller answers
    except Exception:
        raise ClusterNotRunning(
            f"the cluster {cid!r} has a controller process that does not answer",
            f"stop it with `course stop --cluster-id {cid}`, then run cu.start() again",
        ) from None
    have = sorted(client.ids)
    if not have:  # engines may be registering right now (course lab is starting)
        with contextlib.suppress(Exception):
            client.wait_for_engines(1, timeout=min(timeout, 10), interactive=False)
        have = sorted(client.ids)
    if not have:
        owner = _read_course_file(cid).get("owner_pid")
        if owner and owner != os.getpid() and _pid_alive(int(owner)):
            with contextlib.suppress(Exception):
                client.close()
            raise ClusterNotRunning(
                f"the cluster {cid!r} (started by process {owner}) has no engines",
                "in the notebook (or course lab) that started it run cu.restart(), or stop it "
                f"with `course stop --cluster-id {cid}` and run cu.start() again",
            )
        # No owner left and no engines: an orphan; stopping it loses nobody's work.
        with contextlib.suppress(Exception):
            client.close()
        _stop_cluster(cl)
        path.unlink(missing_ok=True)
        return None
    if want is not None and want != len(have):
        client.close()
        raise WorldSizeMismatch(
            f"the running cluster {cid!r} has {len(have)} engines, n={want} was asked",
            f"call cu.start() without n, or stop the running cluster (`course stop`) and "
            f"start it with COURSE_ENGINES={want}",
        )
    cc = CourseCluster(cl, client, prof, owned=False, n=len(have))
    with contextlib.suppress(Exception):
        busy = cc.busy()
        if busy:
            print(busy_line(busy))
    return cc


def busy_line(busy: dict[int, dict[str, Any]]) -> str:
    """One line for a kernel joining engines that run another notebook's cell."""
    since = [b["since"] for b in busy.values() if b.get("since") is not None]
    how_long = f"running for {max(since):.0f} s" if since else "busy"
    return (f"cu: connected; engines {sorted(busy)} are {how_long} with another notebook's "
            "cell: cells you run here queue behind it")


def _hub_request(client: ipp.Client, msg_type: str, content: dict[str, Any],
                 timeout: float) -> dict[str, Any]:
    """A request to the controller that gives up after ``timeout`` s (ipyparallel's own
    ``queue_status``/``db_query`` wait forever for a controller that does not answer)."""
    future = client._send(client._query_stream, msg_type, content=content)
    reply = future.result(timeout=timeout)
    body = dict(reply["content"])
    if body.pop("status", "ok") != "ok":
        raise client._unwrap_exception(body)
    return body


def _queue_status(client: ipp.Client, timeout: float = 5.0) -> dict[Any, Any]:
    """The controller's view: engine id -> ``{"queue": [msg ids], "completed", "tasks"}``."""
    from ipyparallel import util

    return util.int_keys(_hub_request(client, "queue_request",
                                      {"targets": None, "verbose": True}, timeout))


def _records(client: ipp.Client, msg_ids: Sequence[str], keys: Sequence[str],
             timeout: float = 5.0) -> list[dict[str, Any]]:
    """Task records from the controller's database; dates as aware datetimes."""
    from ipyparallel import util

    body = _hub_request(client, "db_request", {
        "query": {"msg_id": {"$in": list(msg_ids)}}, "keys": ["msg_id", *keys]}, timeout)
    out = []
    for rec in body.get("records", []):
        for key in ("submitted", "started", "completed"):
            when = rec.get(key)
            if isinstance(when, str):
                with contextlib.suppress(Exception):
                    when = util._parse_date(when)
            if isinstance(when, datetime.datetime):
                rec[key] = when if when.tzinfo else when.astimezone()
        out.append(rec)
    return out


def _submitted(client: ipp.Client, msg_ids: Sequence[str],
               timeout: float = 5.0) -> dict[str, datetime.datetime]:
    """When the controller received each task (its task database), as aware datetimes."""
    try:
        records = _records(client, msg_ids, ["submitted"], timeout)
    except Exception:
        return {}
    return {r["msg_id"]: r["submitted"] for r in records
            if isinstance(r.get("submitted"), datetime.datetime)}


def _is_engine(pid: int) -> bool:
    """True when ``pid`` is an ipyparallel engine (never signal a reused pid)."""
    import psutil

    try:
        return "ipyparallel" in " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return False


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_course_file(cid: str) -> dict[str, Any]:
    try:
        return json.loads(course_file(cid).read_text())
    except (OSError, ValueError):
        return {}


def _write_course_file(cc: CourseCluster, rank_map: RankMap | None) -> None:
    """Record the owner and the rank map just pushed, for kernels that join later."""
    path = _course_file_of(cc.cluster)
    data = _read_course_file(cc.cluster_id)
    if cc.owned or "owner_pid" not in data:
        data["owner_pid"] = os.getpid() if cc.owned else None
    if rank_map is not None:
        data["rank_map"] = rank_map.to_dicts()
        data["hosts"] = list(rank_map.hosts)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    with contextlib.suppress(OSError):
        # Owner-only, like ipyparallel's connection files next to it.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(data))
        os.replace(tmp, path)


def _read_rank_map(cid: str, engine_ids: Sequence[int]) -> RankMap | None:
    """The saved rank map, if it covers exactly these engines."""
    data = _read_course_file(cid)
    rows = data.get("rank_map") or []
    if sorted(r.get("engine_id") for r in rows) != sorted(engine_ids):
        return None
    try:
        infos = tuple(RankInfo(**r) for r in sorted(rows, key=lambda r: r["rank"]))
    except TypeError:
        return None
    return RankMap(ranks=infos, hosts=tuple(data.get("hosts", ())))
