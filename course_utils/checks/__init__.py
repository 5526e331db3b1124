"""Engine-side probes that graded tests call, kept apart from what learners are taught with.

Each ``engine_check_*`` runs on every rank (``cluster.run``), calls the learner's ``%%px``
function under observation and returns plain data for the test cell's asserts.
"""

from __future__ import annotations

from .capstone import engine_check_capstone, engine_check_resume
from .collectives import engine_check_all_reduce, engine_check_point_to_point_only
from .faults import engine_check_atomic_save, engine_check_watchdog
from .performance import engine_check_overlap_dp
from .training import engine_check_checkpoint

__all__ = ["engine_check_all_reduce", "engine_check_capstone", "engine_check_resume",
           "engine_check_atomic_save", "engine_check_watchdog",
           "engine_check_checkpoint", "engine_check_overlap_dp",
           "engine_check_point_to_point_only"]
