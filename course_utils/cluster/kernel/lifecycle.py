"""Cluster lifecycle: start or connect, restart, stop; this kernel's current cluster.

Introduced in ``00_cluster_tour``. This layer imports neither torch nor TensorFlow: frameworks
attach to it through :meth:`CourseCluster.on_restart` / :meth:`CourseCluster.on_stop` hooks.

Typical notebook use::

    import course_utils as cu
    cluster = cu.start()          # idempotent: reuses a running cluster (course lab's or ours)
    cu.start_torch()              # process group on every engine
    %%px                          # every later cell runs on every rank

Starting: :func:`start` (the kernel's current cluster, made or joined) and :func:`launch` (a
cluster of its own, never current: a side cluster for a recording, a gallery, a bench).
Stopping: :func:`stop` (the current one), :meth:`CourseCluster.stop` (any one object), and
:func:`stop_running` (a cluster another process started, from its cluster file).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Sequence

import ipyparallel as ipp

from ... import settings
from ...errors import ClusterNotRunning, WorldSizeMismatch
from ...procs import pid_alive
from ..launchers import launching, slurm
from ..profiles import ClusterProfile, load_profile
from . import controller, registry
from .cluster_files import (
    cluster_file,
    course_file,
    profile_dir,
    read_course_file,
    write_course_file,
)
from .course_cluster import CourseCluster
from .sharing import busy_line

__all__ = ["CourseCluster", "cluster_file", "course_file", "current", "launch", "profile_dir",
           "restart", "start", "stop", "stop_running"]


def current() -> CourseCluster:
    """The cluster this kernel is using; raises a clear error when there is none."""
    cc = registry.current_or_none()
    if cc is None:
        raise ClusterNotRunning("no cluster is connected in this kernel", "run cu.start() first")
    return cc


def _profile(profile: str | ClusterProfile | None) -> ClusterProfile:
    return load_profile(profile if profile is not None else settings.cluster_profile())


def start(
    n: int | None = None,
    profile: str | ClusterProfile | None = None,
    timeout: float | None = None,
    cluster_id: str | None = None,
    preload: Sequence[str] = (),
) -> CourseCluster:
    """Start or connect to the course cluster and give every engine its rank. Idempotent.

    1. the cluster already connected in this kernel, if it still answers;
    2. else a running cluster with the same id (e.g. started by ``course lab``);
    3. else a new one with ``n`` engines (default ``$COURSE_ENGINES`` or 2).

    ``n=None`` accepts whatever is running; an explicit ``n`` that differs is an error.
    ``preload``: modules a new cluster's engines import before their first call, and so
    do the engines that replace them (``04_tf_classic_ps`` passes TensorFlow: every engine
    of its cluster needs it, and local engines then get it from their fork server's one
    import instead of importing it each).
    """
    prof = _profile(profile)
    want = prof.engine_count(n)
    if want is not None and want < 1:
        raise WorldSizeMismatch(f"n={want} engines asked for", "use n >= 1")
    timeout = settings.start_timeout() if timeout is None else timeout
    cid = cluster_id or settings.cluster_id()

    cc = registry.current_or_none()
    if cc is not None and cc.cluster_id == cid:
        # Asks the controller, not the engines: busy engines are alive, never replaced here.
        alive = cc.alive()
        if alive and (want is None or want == cc.n):
            cc.activate()
            return cc
        if want is not None and want != cc.n and alive and not cc.owned:
            raise WorldSizeMismatch(
                f"the running cluster {cid!r} has {cc.n} engines, n={want} was asked",
                f"call cu.start() without n, or stop course lab and start it with "
                f"COURSE_ENGINES={want}",
            )
        cc.stop()

    cc = connect_existing(cid, prof, want, timeout)
    if cc is None:
        cc = _start_new(cid, prof, want or settings.default_engines(), timeout,
                        tuple(preload))
    try:
        cc.refresh_ranks()
    except BaseException:
        # A start that fails half-way must not leave engines (on Slurm: a job holding GPUs)
        # that no cu.stop() can find: one started here goes; one found stays findable.
        if cc.owned:
            cc.stop(kill=True)
        else:
            registry.make_current(cc)
        raise
    cc.activate()
    registry.make_current(cc)
    return cc


def launch(
    n: int | None = None,
    profile: str | ClusterProfile | None = None,
    timeout: float | None = None,
    cluster_id: str | None = None,
) -> CourseCluster:
    """A new cluster of ``n`` engines with ranks, owned here and *not* made current.

    ``%%px`` and ``cu.current()`` keep using this kernel's cluster; stop this one with its
    :meth:`CourseCluster.stop` (``kill=True`` when nothing on it is worth a polite stop).
    ``cluster_id`` (default: this kernel's id plus ``-side``) must not be a running cluster's:
    one left by a crashed run is replaced.
    """
    prof = _profile(profile)
    timeout = settings.start_timeout() if timeout is None else timeout
    cid = cluster_id or f"{settings.cluster_id()}-side"
    count = prof.engine_count(n) or settings.default_engines()
    cc = _start_new(cid, prof, count, timeout)
    try:
        cc.refresh_ranks()
    except BaseException:
        cc.stop(kill=True)
        raise
    return cc


def stop(force: bool = False) -> None:
    """Tear down: stop hooks (process groups), then the cluster if this kernel started it.
    Later calls on it, and ``%%px`` cells, say so and name ``cu.start()``."""
    cc = registry.current_or_none()
    if cc is not None:
        cc.stop(force=force)
        cc.refuse_calls(stopped_it=cc.owned or force)
        return
    cid = settings.cluster_id()
    if _profile(None).slurm is not None and not cluster_file(cid).exists():
        # no cluster here nor on record: a job of ours under this name is one left behind
        for job in slurm.cancel_own_jobs(cid):
            print(f"cu.stop(): cancelled Slurm job {job}, engines left by an earlier start")


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
    launching.stop_cluster(cl)
    path.unlink(missing_ok=True)
    return True


def _start_new(cid: str, prof: ClusterProfile, n: int, timeout: float,
               preload: tuple[str, ...] = ()) -> CourseCluster:
    cl, client = launching.start_ipp_cluster(cid, prof, n, timeout, preload)
    cc = CourseCluster(cl, client, prof, owned=True, n=n, preload=preload)
    write_course_file(cl, True, None)
    return cc


def connect_existing(cid: str, prof: ClusterProfile, want: int | None,
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
        controller.queue_status(client, timeout=5)  # the controller answers
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
        _no_engines(cid, cl, client)
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


def _no_engines(cid: str, cl: ipp.Cluster, client: ipp.Client) -> None:
    """A running controller without engines: its owner's to fix if it lives, else stopped
    (an orphan: stopping it loses nobody's work)."""
    with contextlib.suppress(Exception):
        client.close()
    owner = read_course_file(cid).get("owner_pid")
    if owner and owner != os.getpid() and pid_alive(int(owner)):
        raise ClusterNotRunning(
            f"the cluster {cid!r} (started by process {owner}) has no engines",
            "in the notebook (or course lab) that started it run cu.restart(), or stop it "
            f"with `course stop --cluster-id {cid}` and run cu.start() again",
        )
    launching.stop_cluster(cl)
    cluster_file(cid).unlink(missing_ok=True)
