"""Engine-side probes that graded tests call, kept apart from what learners are taught with.

Each ``engine_check_*`` runs on every rank (``cluster.run``), calls the learner's ``%%px``
function under observation and returns plain data for the test cell's asserts.
"""

from __future__ import annotations

from .capstone import engine_check_capstone, engine_check_resume
from .collective_calls import engine_check_collectives
from .common import learner_line
from .custom_function import function_problem
from .data_parallel import dp_step_problem, engine_check_dp_step
from .feedback_format import feedback
from .parallelism import (
    engine_check_conjugates,
    engine_check_pipeline,
    engine_check_torch_2d,
    engine_check_tp,
)
from .performance import (
    alpha_beta_problem,
    engine_check_overlap_dp,
    overlap_dp_at,
    overlap_dp_problem,
)
from .ps_capstone import check_tf_capstone, tf_start_and_resume_problem
from .ring_allreduce import engine_check_all_reduce, engine_check_point_to_point_only, ring_problem
from .sharding import engine_check_bounds, engine_check_fsdp, engine_check_zero1
from .spawn import RankFailed, first_failure, spawn
from .tf_graph import (
    engine_check_train_graph,
    engine_tf_one_step,
    engine_tf_one_step_within,
    engine_tf_servers,
)
from .training import (
    engine_check_checkpoint,
    engine_check_ddp,
    engine_check_load,
    engine_check_sampler,
    save_as_if_on,
)
from .watchdog_and_save import engine_check_atomic_save, engine_check_watchdog, watchdog_at

__all__ = ["alpha_beta_problem", "check_tf_capstone", "dp_step_problem",
           "engine_check_all_reduce", "engine_check_atomic_save", "engine_check_bounds",
           "engine_check_capstone", "engine_check_checkpoint", "engine_check_collectives",
           "engine_check_conjugates", "engine_check_ddp", "engine_check_dp_step",
           "engine_check_fsdp", "engine_check_load", "engine_check_overlap_dp",
           "engine_check_pipeline", "engine_check_point_to_point_only", "engine_check_resume",
           "engine_check_sampler", "engine_check_torch_2d", "engine_check_tp",
           "engine_check_train_graph", "engine_check_watchdog", "engine_check_zero1",
           "engine_tf_one_step", "engine_tf_one_step_within", "engine_tf_servers", "feedback",
           "first_failure",
           "function_problem", "learner_line", "overlap_dp_at", "overlap_dp_problem",
           "RankFailed", "ring_problem", "save_as_if_on", "spawn", "tf_start_and_resume_problem",
           "watchdog_at"]
