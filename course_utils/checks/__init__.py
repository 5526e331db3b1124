"""Engine-side probes that graded tests call, kept apart from what learners are taught with.

Each ``engine_check_*`` runs on every rank (``cluster.run``), calls the learner's ``%%px``
function under observation and returns plain data for the test cell's asserts.
"""

from __future__ import annotations

from .collectives import engine_check_all_reduce, engine_check_point_to_point_only
from .feedback import feedback
from .tf_graph import engine_check_train_graph, engine_tf_one_step, engine_tf_servers
from .training import engine_check_checkpoint, engine_check_ddp, engine_check_sampler

__all__ = ["engine_check_all_reduce", "engine_check_checkpoint", "engine_check_ddp",
           "engine_check_point_to_point_only", "engine_check_sampler", "engine_check_train_graph",
           "engine_tf_one_step", "engine_tf_servers", "feedback"]
