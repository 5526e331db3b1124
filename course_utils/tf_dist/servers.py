"""``tf.distribute.Server`` tasks on the engines: start, check, tear down (units 4 and 5).

* **Addresses and ports**: each engine that will listen picks its own free ports, so "free" is
  true where it matters; every start picks fresh ones, so re-running a cell never collides.
* **Readiness** (:func:`wait_ready`): before anything connects, every task must accept a
  connection within a bounded wait; otherwise a clear error names the missing task (a missing ps
  would make ``ParameterServerStrategy``'s constructor wait forever).
* **Teardown** (:func:`teardown`): a gRPC server cannot be stopped inside its process, so the
  engines that hosted servers are replaced (``cluster.restart()``). Servers are never ``join()``-ed
  on an engine: that blocks the engine for good.

The ``_engine_*`` functions run on the engines.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..cluster import CourseCluster, current, ports
from ..errors import EngineError, PortInUse
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


@dataclass
class TFCluster:
    """ps/worker servers running on the engines: roles, addresses and what each rank hosts."""

    roles: dict[str, list[int]]
    cluster: dict[str, list[str]]
    inter_op: int
    started_s: float = 0.0
    engine_ids: dict[int, int] = field(default_factory=dict)  # rank -> engine id at start

    def task_names(self) -> list[str]:
        return [f"{job}:{i}" for job in JOBS for i in range(len(self.cluster.get(job, ())))]

    def address(self, job: str, index: int) -> str:
        return self.cluster[job][index]

    def rank_of(self, job: str, index: int) -> int:
        return self.roles[job][index]

    def tf_config(self, job: str, index: int) -> str:
        return json.dumps(make_tf_config(self.cluster, job, index))

    def table(self) -> str:
        rows = [f"{'task':<9} {'rank':>4}  address"]
        for job in JOBS:
            for i, addr in enumerate(self.cluster.get(job, ())):
                rows.append(f"{job + ':' + str(i):<9} {self.roles[job][i]:>4}  {addr}")
        return "\n".join(rows)



_STATE: dict[str, Any] = {}



def active() -> TFCluster | None:
    """The TF cluster started from this kernel and still running, if any."""
    return _STATE.get("tfc")



#: How many times :func:`start_servers` picks ports when one was taken before its server bound it.
PORT_ATTEMPTS = 3
PORT_TAKEN = "the port is taken"


def start_servers(cluster: CourseCluster | None = None, num_ps: int = 1,
                  num_workers: int | None = None, ps_rank: int = 0,
                  timeout: float = READY_TIMEOUT) -> TFCluster:
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
            and not unanswered(_addresses(tfc), timeout=2):
        return tfc
    t0 = time.perf_counter()
    for attempt in range(1, PORT_ATTEMPTS + 1):
        hosted = cc.run(_engine_hosted, timeout=30)
        if any(hosted):
            cc.restart()
        rm = cc.ranks
        addr_by_rank = [r.addr for r in rm]
        counts = [len(tasks_on_rank(roles, r)) for r in range(rm.world_size)]
        picked = cc.run_per_rank(ports.free_ports, [(n, a) for n, a in zip(
            counts, addr_by_rank, strict=True)], timeout=30)
        ports_by_task: dict[tuple[str, int], int] = {}
        for rank in range(rm.world_size):
            for task, port in zip(tasks_on_rank(roles, rank), picked[rank], strict=True):
                ports_by_task[task] = port
        spec = cluster_dict(roles, addr_by_rank, ports_by_task)
        threads = inter_op_threads(spec)
        args = [(spec, tasks_on_rank(roles, r), threads) for r in range(rm.world_size)]
        try:
            cc.run_per_rank(_engine_start, args, timeout=max(60.0, timeout + 40))
            break
        except EngineError as exc:
            # A free port can be taken before the server binds it (another program's outgoing
            # connection gets ports from the same range): the engines that started servers are
            # replaced and fresh ports picked, a few times.
            if PORT_TAKEN not in str(exc) or attempt == PORT_ATTEMPTS:
                raise
    tfc = TFCluster(roles=roles, cluster=spec, inter_op=threads, engine_ids=_engine_ids(cc))
    _STATE["tfc"] = tfc
    _register_hooks(cc)
    wait_ready(tfc, timeout=timeout)
    tfc.started_s = time.perf_counter() - t0
    return tfc



def wait_ready(tfc: TFCluster | Mapping[str, Sequence[str]], timeout: float = READY_TIMEOUT,
               jobs: Sequence[str] = JOBS) -> float:
    """Wait until every ps/worker task accepts a connection; raise naming the missing ones.

    Returns the seconds it took. Run it before building a strategy or a session: a task that
    never started would otherwise make them wait forever, silently.
    """
    spec = tfc.cluster if isinstance(tfc, TFCluster) else dict(tfc)
    addrs = {f"{job}:{i}": a for job in jobs for i, a in enumerate(spec.get(job, ()))}
    t0 = time.monotonic()
    missing = unanswered(addrs, timeout=timeout)
    if missing:
        where = ", ".join(f"{m} at {addrs[m]}" + _rank_note(tfc, m) for m in missing)
        raise TFServerNotAnswering(
            f"{len(missing)} TF task(s) did not answer within {timeout:g} s: {where}",
            "start every task's server with cu.tf_dist.start_servers() (it starts all of them "
            "and checks them); if an engine was killed or restarted, run it again",
        )
    return time.monotonic() - t0



def teardown(cluster: CourseCluster | None = None) -> bool:
    """Replace the engines that host TF servers (gRPC servers cannot be stopped in-process).

    First stops every ``ClusterCoordinator`` of this kernel (:func:`retire_coordinators`).
    Returns True when engines were restarted. Safe to call when nothing runs.
    """
    from .coordinator import retire_coordinators

    cc = cluster or current()
    _STATE.clear()
    retire_coordinators()  # the coordinators of these servers: stopped so none can hang later
    try:
        hosted = cc.run(_engine_hosted, timeout=15)
    except Exception:  # an engine is gone (killed in a demo) or stuck: replace them anyway
        hosted = [True]
    if any(hosted):
        cc.restart()
        return True
    return False



def kill_rank(rank: int, cluster: CourseCluster | None = None) -> int:
    """Kill the engine process of ``rank`` (and every TF server it hosts); returns its pid.

    The engine exits on its own (``os._exit``), so this works on remote hosts too. Only
    :func:`teardown` (or ``cu.restart()``) brings the rank back.
    """
    cc = cluster or current()
    info = cc.ranks[rank]
    cc.client[info.engine_id].apply_async(os._exit, 1)
    return info.pid



def reset_ps(cluster: CourseCluster | None = None, tfc: TFCluster | None = None) -> None:
    """Clear every variable and queue the ps/worker servers hold (graph mode).

    Variables on a ps outlive the sessions that made them; a second training run with the same
    names would start from the first run's values (and a non-chief would think it may start).
    """
    cc = cluster or current()
    tfc = tfc or active()
    if tfc is None:
        raise TFServerNotAnswering("no TF servers are running", "run cu.tf_dist.start_servers()")
    cc.run_on(tfc.rank_of("worker", 0), _engine_reset, timeout=30)



def _addresses(tfc: TFCluster) -> dict[str, str]:
    return {f"{j}:{i}": a for j in JOBS for i, a in enumerate(tfc.cluster.get(j, ()))}



def _rank_note(tfc: Any, name: str) -> str:
    if isinstance(tfc, TFCluster):
        job, idx = name.split(":")
        return f" (rank {tfc.rank_of(job, int(idx))})"
    return ""



def _engine_ids(cc: CourseCluster) -> dict[int, int]:
    return {r.rank: r.engine_id for r in cc.ranks}



def _register_hooks(cc: CourseCluster) -> None:
    # Engines replaced by cu.restart() host no servers any more.
    cc.on_restart("tf", lambda c: _STATE.clear())
    # A course-lab cluster outlives this notebook: free its engines of our servers on cu.stop().
    cc.on_stop("tf", lambda c: None if c.owned else teardown(c))



_SERVERS: dict[str, Any] = {}



def register_server(name: str, server: Any) -> None:
    """Engine side (unit 4): record a ``tf.distribute.Server`` started by hand as ``"job:index"``.

    Registered servers are what :func:`teardown` and :func:`start_servers` look for: the engine
    is replaced (a gRPC server cannot be stopped) and nothing collides on a re-run.
    """
    job, _, index = name.partition(":")
    if job not in JOBS or not index.isdigit():
        raise ValueError(f"name a server 'job:index' with job in {JOBS}, got {name!r}")
    if _SERVERS.get(name) not in (None, server):
        raise PortInUse(f"this engine already hosts a server for {name}",
                        "call cu.tf_dist.teardown() (restarts the engines), then start again")
    _SERVERS[name] = server



def _engine_hosted() -> list[str]:
    return sorted(_SERVERS)



def _engine_start(spec: dict[str, list[str]], tasks: list[tuple[str, int]],
                  inter_op: int) -> dict[str, Any]:
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
        raise PortInUse(f"this engine already hosts TF servers {sorted(_SERVERS)}",
                        "call cu.tf_dist.teardown() (restarts the engines), then start again")
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



def _engine_reset() -> bool:
    import tensorflow as tf

    import __main__

    server = vars(__main__)["tf_servers"]["worker:0"]
    tf.compat.v1.Session.reset(server.target)
    return True
