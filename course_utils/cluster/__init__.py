"""The framework-free cluster layer: lifecycle, calls on ranks, rank map, profiles, ports.

Introduced in ``00_cluster_tour``. Nothing in this sub-package imports torch or TensorFlow:
frameworks attach through :meth:`CourseCluster.on_restart` / :meth:`CourseCluster.on_stop`.

Modules, top to bottom:

- :mod:`.lifecycle`: ``start`` (this kernel's current cluster), ``launch`` (a side cluster,
  never current), ``stop``, ``restart``, ``stop_running``;
- :mod:`.course_cluster`: ``CourseCluster``, calls on ranks (``run``, ``call``, ``pull``...);
- :mod:`.launching`: controller and engines started and stopped; :mod:`.ssh_launcher`,
  :mod:`.slurm` (engines on SSH hosts, as a Slurm job);
- :mod:`.sharing`: one cluster shared by several kernels (busy queues, replaced engines);
- :mod:`.stuck_calls`: calls that timed out, where each rank is stuck;
- :mod:`.engine_errors`: errors from the engines as the course shows them;
- :mod:`.controller`: the ipyparallel internals the course relies on, in one place;
- :mod:`.cluster_files`: the cluster file and the course file beside it;
- :mod:`.registry`: this kernel's current cluster; :mod:`.pxoutput`: ``%%px`` output by rank;
  :mod:`.pxwait`: a ``%%px`` cell in which a rank raised fails in seconds;
- :mod:`.ranks` (who is rank what), :mod:`.profiles` (local, ssh, slurm), :mod:`.ports`
  (free ports on the host that listens), :mod:`.engine` (what runs *on* an engine: its report
  about itself, its rank, calling a ``%%px``-defined function), :mod:`.slurm_script`.
"""

from __future__ import annotations

from . import engine, ports, profiles, ranks
from .cluster_files import cluster_file, profile_dir
from .course_cluster import CourseCluster
from .lifecycle import current, launch, restart, start, stop, stop_running
from .profiles import ClusterProfile, load_profile
from .ranks import RankInfo, RankMap

__all__ = [
    "ClusterProfile", "CourseCluster", "RankInfo", "RankMap", "cluster_file", "current",
    "engine", "launch", "load_profile", "ports", "profile_dir", "profiles", "ranks", "restart",
    "start", "stop", "stop_running",
]
