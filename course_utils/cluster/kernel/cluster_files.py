"""Where a cluster's files live: ipyparallel's cluster file, and the course file beside it.

The course file records who started the cluster (``owner_pid``) and the rank map last pushed
to its engines, so a second kernel can join while the engines are busy with another
notebook's cell, and can follow engines another kernel replaced.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ipyparallel as ipp

from ... import settings
from ..ranks import RankInfo, RankMap


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
    """ipyparallel's file for a running cluster: controller, engine sets, their pids."""
    cid = cluster_id or settings.cluster_id()
    return Path(pdir or profile_dir()) / "security" / f"cluster-{cid}.json"


def course_file(cluster_id: str | None = None, pdir: str | None = None) -> Path:
    """The course's file beside the cluster file (see the module's docstring)."""
    cid = cluster_id or settings.cluster_id()
    return Path(pdir or profile_dir()) / "security" / f"course-{cid}.json"


def course_file_of(cl: ipp.Cluster) -> Path:
    return course_file(cl.cluster_id, cl.profile_dir)


def remove_stale(cluster_id: str, pdir: str | None = None) -> None:
    """Remove the files a cluster with this id left (before a new one takes the id, and after
    a stop)."""
    path = cluster_file(cluster_id, pdir)
    path.unlink(missing_ok=True)
    # The controller's connection files: it removes them as it exits, but not when it was
    # stopped while it started, or killed before it got there (a loaded machine).
    for kind in ("client", "engine"):
        (path.parent / f"ipcontroller-{cluster_id}-{kind}.json").unlink(missing_ok=True)


def owner_only(cl: ipp.Cluster) -> None:
    """The cluster file (pids, hosts, ports) readable by its owner only, like the connection
    files the controller writes (0600): another user on a shared host learns nothing."""
    path = getattr(cl, "cluster_file", "")
    if path and os.path.exists(path):
        with contextlib.suppress(OSError):
            os.chmod(path, 0o600)


def read_course_file(cluster_id: str) -> dict[str, Any]:
    try:
        return json.loads(course_file(cluster_id).read_text())
    except (OSError, ValueError):
        return {}


def write_course_file(cl: ipp.Cluster, owned: bool, rank_map: RankMap | None) -> None:
    """Record the owner and the rank map just pushed, for kernels that join later."""
    path = course_file_of(cl)
    data = read_course_file(cl.cluster_id)
    if owned or "owner_pid" not in data:
        data["owner_pid"] = os.getpid() if owned else None
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


def read_rank_map(cluster_id: str, engine_ids: Sequence[int]) -> RankMap | None:
    """The saved rank map, if it covers exactly these engines."""
    data = read_course_file(cluster_id)
    rows = data.get("rank_map") or []
    if sorted(r.get("engine_id") for r in rows) != sorted(engine_ids):
        return None
    try:
        infos = tuple(RankInfo(**r) for r in sorted(rows, key=lambda r: r["rank"]))
    except TypeError:
        return None
    return RankMap(ranks=infos, hosts=tuple(data.get("hosts", ())))


def recorded_engine_sets(cl: ipp.Cluster) -> set[str] | None:
    """The engine-set ids ``cl``'s cluster file lists (None: no readable file)."""
    path = getattr(cl, "cluster_file", None)
    if not path or not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            return set((json.load(f).get("engines") or {}).get("sets", {}))
    except (OSError, ValueError, AttributeError):
        return None
