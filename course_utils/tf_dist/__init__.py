"""TensorFlow parameter-server clusters on the course's engines (units 4 and 5).

What this sub-package decides, in one place:

* **Roles from the rank map** (:func:`plan_roles`): every ps task on rank 0 by default, worker
  ``i`` on rank ``i % world_size``. With the default 2 engines: rank 0 hosts ``ps:0`` (and
  ``ps:1`` when two are asked for) *and* ``worker:0``; rank 1 hosts ``worker:1``.
* **Thread pools** (:func:`inter_op_threads`): several TF servers sharing 2 cores hang forever with
  the default inter-op pool; every server gets ``tasks + 1`` threads.
* **Servers** (:mod:`.servers`): started on the engines with fresh ports, checked with a bounded
  wait, torn down by replacing the engines that hosted them.

Modules: :mod:`.spec` (pure: roles, ClusterSpec, TF_CONFIG), :mod:`.servers` (tasks on the
engines), :mod:`.wiring` (unit 4's hand-started servers: ports, adoption, training calls),
:mod:`.coordinator` (unit 5's kernel-side strategy), :mod:`.graph_v1` (unit 4's
``tf.compat.v1`` sessions, traffic and step guard), :mod:`.quiet` (TensorFlow, quietly),
:mod:`.faults` and :mod:`.task_server` (unit 8's drills: one process per task, killed alone).
Importing this package does not import TensorFlow.
"""

from __future__ import annotations

from .coordinator import (
    connect_coordinator,
    join,
    join_within,
    prepare_chief,
    retire_coordinators,
    variable_shards,
    watch_coordinator,
)
from .graph_v1 import (
    cross_task_traffic,
    guard_message,
    session_config,
    step_guard,
    step_timeout_ms,
    task_of,
    wait_for_chief,
)
from .quiet import quiet_tensorflow, short_error
from .servers import (
    TFCluster,
    active,
    kill_rank,
    register_server,
    reset_ps,
    start_servers,
    teardown,
    wait_ready,
)
from .spec import (
    JOBS,
    READY_TIMEOUT,
    TFServerNotAnswering,
    TFTimeout,
    cluster_dict,
    inter_op_threads,
    intra_op_threads,
    make_tf_config,
    plan_roles,
    server_config,
    split_address,
    tasks_on_rank,
    unanswered,
)
from .wiring import adopt_servers, hosted_by_rank, pick_ports, run_training

__all__ = [
    "JOBS", "READY_TIMEOUT", "TFCluster", "TFServerNotAnswering", "TFTimeout", "active",
    "adopt_servers", "cluster_dict", "connect_coordinator", "cross_task_traffic",
    "guard_message", "hosted_by_rank", "inter_op_threads", "intra_op_threads", "join",
    "join_within", "kill_rank", "make_tf_config", "pick_ports", "plan_roles", "prepare_chief",
    "quiet_tensorflow", "register_server", "reset_ps", "retire_coordinators", "run_training",
    "server_config",
    "session_config", "short_error", "split_address", "start_servers", "step_guard",
    "step_timeout_ms", "task_of", "tasks_on_rank", "teardown", "unanswered",
    "variable_shards", "wait_for_chief", "wait_ready", "watch_coordinator",
]
