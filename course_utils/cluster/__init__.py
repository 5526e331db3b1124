"""The framework-free cluster layer. Introduced in ``00_cluster_tour``. Nothing in this
sub-package imports torch or TensorFlow: frameworks attach through
:meth:`CourseCluster.on_restart` / :meth:`CourseCluster.on_stop`.

A module's folder says in which process it runs:

- :mod:`.kernel`: in the notebook's kernel (start, join, restart, stop; calls on ranks; ``%%px``
  output and errors);
- :mod:`.engines`: in each engine process (what the kernel calls there; the engine's entry);
- :mod:`.launchers`: what starts the controller and the engines (local, forked from one
  server; SSH; Slurm);
- here, pure and used by all three: :mod:`.ranks` (who is rank what), :mod:`.profiles` (local,
  ssh, slurm) and :mod:`.ports` (free ports on the host that listens).
"""

from __future__ import annotations

from . import ports, profiles, ranks
from .engines import engine
from .kernel.cluster_files import cluster_file, profile_dir
from .kernel.course_cluster import CourseCluster
from .kernel.lifecycle import current, launch, restart, start, stop, stop_running
from .profiles import ClusterProfile, load_profile
from .ranks import RankInfo, RankMap

__all__ = [
    "ClusterProfile", "CourseCluster", "RankInfo", "RankMap", "cluster_file", "current",
    "engine", "launch", "load_profile", "ports", "profile_dir", "profiles", "ranks", "restart",
    "start", "stop", "stop_running",
]
