"""Engine-side probes that graded tests call, kept apart from what learners are taught with.

Each ``engine_check_*`` runs on every rank (``cluster.run``), calls the learner's ``%%px``
function under observation and returns plain data for the test cell's asserts.
"""

from __future__ import annotations

from .capstone import engine_check_capstone, engine_check_resume
from .collectives import (
    engine_check_all_reduce,
    engine_check_point_to_point_only,
    learner_line,
    ring_problem,
)
from .data_parallel import dp_step_problem, engine_check_dp_step
from .faults import engine_check_atomic_save, engine_check_watchdog
from .feedback import feedback
from .performance import engine_check_overlap_dp
from .training import engine_check_checkpoint

__all__ = ["dp_step_problem", "engine_check_all_reduce", "engine_check_atomic_save",
           "engine_check_capstone", "engine_check_checkpoint", "engine_check_dp_step",
           "engine_check_overlap_dp", "engine_check_point_to_point_only", "engine_check_resume",
           "engine_check_watchdog", "feedback", "learner_line", "ring_problem"]
