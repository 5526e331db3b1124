"""The framework-free cluster layer: lifecycle, calls on ranks, rank map, profiles, ports.

Introduced in ``00_cluster_tour``. Nothing in this sub-package imports torch or TensorFlow:
frameworks attach through :meth:`CourseCluster.on_restart` / :meth:`CourseCluster.on_stop`.

Modules: :mod:`.lifecycle` (start/connect/restart/stop and calls on the engines),
:mod:`.ranks` (who is rank what), :mod:`.profiles` (local, ssh, slurm), :mod:`.slurm`
(engines as a Slurm job, a job stuck in the queue), :mod:`.ports`
(free ports on the host that listens), :mod:`.engine` (what runs *on* an engine: its report
about itself, its rank, calling a ``%%px``-defined function).
"""

from __future__ import annotations

from . import engine, ports, profiles, ranks
from .lifecycle import (
    CourseCluster,
    cluster_file,
    current,
    profile_dir,
    restart,
    start,
    stop,
    stop_running,
)
from .profiles import ClusterProfile, load_profile
from .ranks import RankInfo, RankMap

__all__ = [
    "ClusterProfile", "CourseCluster", "RankInfo", "RankMap", "cluster_file", "current",
    "engine", "load_profile", "ports", "profile_dir", "profiles", "ranks", "restart", "start",
    "stop", "stop_running",
]
