"""``tf.distribute.Server`` tasks inside the engines: start, adopt, stop (units 4 and 5).

* **Ports and readiness** come from :mod:`.taskset` (each engine picks the ports it will listen
  on; every task answers within a bounded wait, or an error names the missing one). Every start
  picks fresh ports, so re-running a cell never collides.
* **Adopting** (:func:`adopt_servers`): unit 4's learner starts the servers by hand in a
  ``%%px`` cell; the check that each rank hosts exactly its tasks hands them to the helpers.
* **Stopping** (:func:`stop_servers`): a gRPC server cannot be stopped inside its process, so
  the engines that hosted servers are replaced (``cluster.restart()``). Servers are never
  ``join()``-ed on an engine: that blocks the engine for good.

The ``engine_*`` functions run on the engines.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..cluster import CourseCluster, current, ports
from ..errors import EngineError, PortInUse
from .coordinator import stop_coordinators
from .quiet import quiet_tensorflow
from .spec import (
    JOBS,
    READY_TIMEOUT,
    TFServerNotAnswering,
    cluster_dict,
    inter_op_threads,
    make_tf_config,
    plan_roles,
    server_config,
    split_address,
    tasks_on_rank,
    unanswered,
)
from .taskset import IN_ENGINES, TaskSet, active, pick_ports, set_active, wait_ready

#: How many times :func:`start_servers` picks ports when one was taken before its server bound it.
PORT_ATTEMPTS = 3
PORT_TAKEN = "the port is taken"
#: The fix for a second server on an engine.
RESTART_FIX = "call cu.tf_dist.stop_servers() (restarts the engines), then start again"


def start_servers(cluster: CourseCluster | None = None, num_ps: int = 1,
                  num_workers: int | None = None, ps_rank: int = 0,
                  timeout: float = READY_TIMEOUT) -> TaskSet:
    """Start a ``tf.distribute.Server`` for every ps and worker task on the engines.

    Idempotent: the same request while those servers still answer returns them. Any other
    request first replaces the engines that host servers (a gRPC server cannot be stopped),
    then starts fresh servers on fresh ports. Returns once every task answers (bounded wait).
    Each engine then has, in its ``%%px`` namespace: ``tf_cluster`` (the ClusterSpec dict),
    ``tf_servers`` (``{"worker:0": server, ...}`` for the tasks it hosts), ``worker_index``
    (its worker task, or ``None``) and ``TF_CONFIG`` in its environment.
    """
    cc = cluster or current()
    roles = plan_roles(cc.world_size, num_ps, num_workers, ps_rank)
    tfc = active()
    if tfc is not None and tfc.roles == roles and tfc.engine_ids == _engine_ids(cc) \
            and not unanswered(tfc.addresses(), timeout=2):
        return tfc
    t0 = time.perf_counter()
    for attempt in range(1, PORT_ATTEMPTS + 1):
        if any(cc.run(engine_hosted, timeout=30)):
            cc.restart()
        spec = cluster_dict(roles, [r.addr for r in cc.ranks], pick_ports(cc, roles))
        threads = inter_op_threads(spec)
        args = [(spec, tasks_on_rank(roles, r), threads) for r in range(cc.world_size)]
        try:
            cc.run_per_rank(engine_start, args, timeout=max(60.0, timeout + 40))
            break
        except EngineError as exc:
            # A free port can be taken before the server binds it (another program's outgoing
            # connection gets ports from the same range): the engines that started servers are
            # replaced and fresh ports picked, a few times.
            if PORT_TAKEN not in str(exc) or attempt == PORT_ATTEMPTS:
                raise
    tfc = _adopt(cc, TaskSet(roles=roles, cluster=spec, inter_op=threads), timeout)
    tfc.started_s = time.perf_counter() - t0
    return tfc


def adopt_servers(cluster: CourseCluster | None, roles: Mapping[str, Sequence[int]],
                  spec: Mapping[str, Sequence[str]],
                  timeout: float = READY_TIMEOUT) -> TaskSet:
    """Take over servers the learner started: every task must answer within ``timeout`` and
    every rank must host exactly its tasks. Returns the :class:`TaskSet` that ``restart_ps``,
    ``stop_servers`` and ``start_servers`` then use, as if ``start_servers`` had started it."""
    cc = cluster or current()
    t0 = time.perf_counter()
    roles = {job: list(ranks) for job, ranks in roles.items()}
    for rank, names in enumerate(hosted_by_rank(cc)):
        want = sorted(f"{job}:{i}" for job, i in tasks_on_rank(roles, rank))
        if sorted(names) != want:
            raise TFServerNotAnswering(
                f"rank {rank} hosts {sorted(names) or 'no server'}, but the roles give it {want}",
                "start a server only for the tasks whose rank in the roles is this rank, and "
                "return them all from your function; then re-run the cells from the ports cell")
    tfc = _adopt(cc, TaskSet(roles=roles, cluster={k: list(v) for k, v in spec.items()},
                             inter_op=inter_op_threads(spec)), timeout)
    tfc.started_s = time.perf_counter() - t0
    return tfc


def _adopt(cc: CourseCluster, tfc: TaskSet, timeout: float) -> TaskSet:
    """Make ``tfc`` this kernel's engine-hosted set, then wait until every task answers."""
    tfc.hosted_in, tfc.engine_ids = IN_ENGINES, _engine_ids(cc)
    tfc.stopper = lambda: stop_servers(cc)
    set_active(tfc)
    # Engines replaced by cu.restart() host no servers any more.
    cc.on_restart("tf", lambda c: set_active(None))
    # A course-lab cluster outlives this notebook: free its engines of our servers on cu.stop().
    cc.on_stop("tf", lambda c: None if c.owned else stop_servers(c))
    wait_ready(tfc, timeout=timeout)
    return tfc


def hosted_by_rank(cluster: CourseCluster | None = None) -> list[list[str]]:
    """The servers each rank's engine has registered (``[["ps:0", "worker:0"], ["worker:1"]]``)."""
    cc = cluster or current()
    return cc.run(engine_hosted, timeout=30)


def stop_servers(cluster: CourseCluster | None = None) -> bool:
    """Replace the engines that host TF servers (gRPC servers cannot be stopped in-process).

    First stops every ``ClusterCoordinator`` of this kernel (:func:`stop_coordinators`).
    Returns True when engines were restarted. Safe to call when nothing runs.
    """
    cc = cluster or current()
    set_active(None)
    stop_coordinators()  # the coordinators of these servers: stopped so none can hang later
    try:
        hosted = cc.run(engine_hosted, timeout=15)
    except Exception:  # an engine is gone (killed in a demo) or stuck: replace them anyway
        hosted = [True]
    if any(hosted):
        cc.restart()
        return True
    return False


def kill_rank(rank: int, cluster: CourseCluster | None = None) -> int:
    """Kill the engine process of ``rank`` (and every TF server it hosts); returns its pid.

    The engine exits on its own (``os._exit``), so this works on remote hosts too. Only
    :func:`stop_servers` (or ``cu.restart()``) brings the rank back.
    """
    cc = cluster or current()
    info = cc.ranks[rank]
    cc.client[info.engine_id].apply_async(os._exit, 1)
    return info.pid


def restart_ps(cluster: CourseCluster | None = None, tfc: TaskSet | None = None) -> None:
    """Start the ps/worker servers over empty (graph mode): every variable and queue they hold
    is cleared; the servers and their engines keep running.

    Variables on a ps outlive the sessions that made them; a second training run with the same
    names would start from the first run's values (and a non-chief would think it may start).
    """
    cc = cluster or current()
    tfc = tfc or active()
    if tfc is None:
        raise TFServerNotAnswering("no TF servers are running", "run cu.tf_dist.start_servers()")
    cc.run_on(tfc.rank_of("worker", 0), engine_restart_ps, timeout=30)


def _engine_ids(cc: CourseCluster) -> dict[int, int]:
    return {r.rank: r.engine_id for r in cc.ranks}


# ---- engine side ----------------------------------------------------------------------------
_SERVERS: dict[str, Any] = {}


def register_server(name: str, server: Any) -> None:
    """Engine side (unit 4): record a ``tf.distribute.Server`` started by hand as ``"job:index"``.

    Registered servers are what :func:`stop_servers` and :func:`start_servers` look for: the
    engine is replaced (a gRPC server cannot be stopped) and nothing collides on a re-run.
    """
    job, _, index = name.partition(":")
    if job not in JOBS or not index.isdigit():
        raise ValueError(f"name a server 'job:index' with job in {JOBS}, got {name!r}")
    if _SERVERS.get(name) not in (None, server):
        raise PortInUse(f"this engine already hosts a server for {name}", RESTART_FIX)
    _SERVERS[name] = server


def registered_servers() -> dict[str, Any]:
    """Engine side: the servers this engine hosts, ``{"ps:0": server, ...}`` (a copy)."""
    return dict(_SERVERS)


def engine_hosted() -> list[str]:
    """Engine side: the names of the servers this engine hosts, sorted."""
    return sorted(_SERVERS)


def engine_start(spec: dict[str, list[str]], tasks: list[tuple[str, int]],
                 inter_op: int) -> dict[str, Any]:
    """Engine side: start this rank's ``tasks``' servers and set its ``%%px`` names."""
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import __main__

    tasks = [tuple(t) for t in tasks]
    ns = vars(__main__)
    ns["tf_cluster"] = spec
    ns["tf_servers"] = {}
    ns["worker_index"] = next((i for job, i in tasks if job == "worker"), None)
    if not tasks:
        os.environ.pop("TF_CONFIG", None)
        return {"pid": os.getpid(), "tasks": []}
    if _SERVERS:
        raise PortInUse(f"this engine already hosts TF servers {sorted(_SERVERS)}", RESTART_FIX)
    tf = quiet_tensorflow()
    cfg = server_config(spec, inter_op)
    cluster_spec = tf.train.ClusterSpec(spec)
    for job, idx in tasks:
        host, port = split_address(spec[job][idx])
        if ports.port_in_use(port, host):
            raise PortInUse(f"{job}:{idx} cannot listen on {host}:{port}: {PORT_TAKEN}",
                            "run cu.tf_dist.start_servers() again: it picks fresh ports")
        server = tf.distribute.Server(cluster_spec, job_name=job, task_index=idx, config=cfg,
                                      protocol="grpc", start=True)
        _SERVERS[f"{job}:{idx}"] = server
        ns["tf_servers"][f"{job}:{idx}"] = server
    job0, idx0 = next(((j, i) for j, i in tasks if j == "worker"), tasks[0])
    os.environ["TF_CONFIG"] = json.dumps(make_tf_config(spec, job0, idx0))
    return {"pid": os.getpid(), "tasks": [f"{j}:{i}" for j, i in tasks]}


def engine_restart_ps() -> bool:
    """Engine side, on worker 0: clear every resource the cluster's servers hold."""
    import tensorflow as tf

    import __main__

    server = vars(__main__)["tf_servers"]["worker:0"]
    tf.compat.v1.Session.reset(server.target)
    return True
