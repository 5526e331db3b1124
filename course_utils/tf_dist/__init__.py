"""TensorFlow parameter-server clusters on the course's engines (units 4, 5, 7, 8 and 9).

What this sub-package decides, in one place:

* **Roles from the rank map** (:func:`plan_roles`): every ps task on rank 0 by default, worker
  ``i`` on rank ``i % world_size``. With the default 2 engines: rank 0 hosts ``ps:0`` (and
  ``ps:1`` when two are asked for) *and* ``worker:0``; rank 1 hosts ``worker:1``.
* **Thread pools** (:func:`inter_op_threads`): several TF servers sharing 2 cores hang forever with
  the default inter-op pool; every server gets ``tasks + 1`` threads.
* **One task set** (:class:`TaskSet`): the tasks' ports are picked by the engines that will
  listen (:func:`pick_ports`) and every task must answer within a bounded wait
  (:func:`wait_ready`), whether the servers run inside the engines or as processes of their own.
* **One lifecycle vocabulary**: ``start_servers``/``stop_servers`` (servers in the engines),
  ``tasks.start``/``tasks.stop`` (one process per task), ``restart_ps`` (the ps start over
  empty), ``start_coordinator``/``stop_coordinators`` (the kernel as the chief); a task set's
  ``.stop()`` stops it the way it was started.

Modules: :mod:`.spec` (pure: roles, ClusterSpec, TF_CONFIG), :mod:`.taskset` (the task set,
ports, readiness), :mod:`.servers` (tasks inside the engines, unit 4's hand-started servers
adopted), :mod:`.coordinator` (unit 5's kernel-side strategy), :mod:`.graph_v1` (unit 4's
``tf.compat.v1`` sessions, traffic, step guard and training call), :mod:`.quiet` (TensorFlow,
quietly), :mod:`.tasks` and :mod:`.task_server` (units 7-9: one process per task, killed alone),
:mod:`.record`, :mod:`.perf`, :mod:`.models`.
Importing this package does not import TensorFlow.
"""

from __future__ import annotations

from .coordinator import (
    examples_per_worker,
    join,
    join_within,
    prepare_chief,
    start_coordinator,
    stop_coordinators,
    variable_shards,
    watch_coordinator,
)
from .graph_v1 import (
    cross_task_traffic,
    guard_message,
    guarded_session,
    run_training,
    session_config,
    step_guard,
    step_timeout_ms,
    task_of,
    wait_for_chief,
)
from .quiet import quiet_tensorflow, short_error
from .servers import (
    adopt_servers,
    hosted_by_rank,
    kill_rank,
    register_server,
    restart_ps,
    start_servers,
    stop_servers,
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
from .taskset import TaskSet, active, pick_ports, wait_ready

__all__ = [
    "JOBS", "READY_TIMEOUT", "TFServerNotAnswering", "TFTimeout", "TaskSet", "active",
    "adopt_servers", "cluster_dict", "cross_task_traffic", "examples_per_worker",
    "guard_message", "guarded_session", "hosted_by_rank",
    "inter_op_threads", "intra_op_threads", "join", "join_within", "kill_rank",
    "make_tf_config", "pick_ports", "plan_roles", "prepare_chief", "quiet_tensorflow",
    "register_server", "restart_ps", "run_training", "server_config", "session_config",
    "short_error", "split_address", "start_coordinator", "start_servers", "step_guard",
    "step_timeout_ms", "stop_coordinators", "stop_servers", "task_of", "tasks_on_rank",
    "unanswered", "variable_shards", "wait_for_chief", "wait_ready", "watch_coordinator",
]
