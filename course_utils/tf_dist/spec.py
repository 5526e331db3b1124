"""The cluster spec, pure: roles from the rank map, ``ClusterSpec`` dicts, ``TF_CONFIG``,
pool sizes.

Introduced in ``04_tf_classic_ps`` (roles, cluster dict, thread pools) and
``05_tf2_parameter_server_strategy`` (``TF_CONFIG``). Nothing here imports TensorFlow at module
level, so these functions run in the kernel and are unit-tested without a cluster.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import CourseError, WorldSizeMismatch

JOBS = ("ps", "worker")



#: Seconds a coordinator or a readiness check waits for every task to answer.
READY_TIMEOUT = 20.0



class TFServerNotAnswering(CourseError):
    """A ps/worker task in the cluster spec does not accept connections."""



class TFTimeout(CourseError):
    """A TensorFlow step or session did not finish within its bound."""



def plan_roles(world_size: int, num_ps: int = 1, num_workers: int | None = None,
               ps_rank: int = 0) -> dict[str, list[int]]:
    """Which rank hosts each task: ``{"ps": [rank of ps:0, ...], "worker": [...]}``.

    Every ps task sits on ``ps_rank``; worker ``i`` on rank ``i % world_size`` (one per rank
    by default). Several tasks may share an engine: each is its own gRPC server.
    """
    if world_size < 1:
        raise WorldSizeMismatch("the cluster has no engines", "start it with cu.start()")
    workers = world_size if num_workers is None else int(num_workers)
    if num_ps < 1 or workers < 1:
        raise ValueError(f"need at least one ps and one worker (got {num_ps}, {workers})")
    if not 0 <= ps_rank < world_size:
        raise ValueError(f"ps_rank {ps_rank} is not in 0..{world_size - 1}")
    return {"ps": [ps_rank] * int(num_ps), "worker": [i % world_size for i in range(workers)]}



def tasks_on_rank(roles: Mapping[str, Sequence[int]], rank: int) -> list[tuple[str, int]]:
    """The ``(job, index)`` tasks that ``rank`` hosts, ps first."""
    return [(job, i) for job in JOBS for i, r in enumerate(roles.get(job, ())) if r == rank]



def cluster_dict(roles: Mapping[str, Sequence[int]], addr_by_rank: Sequence[str],
                 ports_by_task: Mapping[tuple[str, int], int],
                 chief: str | None = None) -> dict[str, list[str]]:
    """The dict behind ``tf.train.ClusterSpec``: job -> ``["addr:port", ...]`` in task order."""
    out: dict[str, list[str]] = {}
    for job in JOBS:
        out[job] = [f"{addr_by_rank[r]}:{int(ports_by_task[(job, i)])}"
                    for i, r in enumerate(roles.get(job, ()))]
    if chief:
        out["chief"] = [chief]
    return out



def make_tf_config(cluster: Mapping[str, Sequence[str]], task_type: str,
                   task_index: int) -> dict[str, Any]:
    """The ``TF_CONFIG`` a task reads: the whole cluster plus who *this* task is."""
    if task_type not in cluster:
        raise ValueError(f"job {task_type!r} is not in the cluster (jobs: {sorted(cluster)})")
    if not 0 <= task_index < len(cluster[task_type]):
        raise ValueError(f"{task_type} has tasks 0..{len(cluster[task_type]) - 1}, "
                         f"not {task_index}")
    return {"cluster": {k: list(v) for k, v in cluster.items()},
            "task": {"type": task_type, "index": int(task_index)}}



def inter_op_threads(cluster: Mapping[str, Sequence[str]]) -> int:
    """Inter-op threads for every server: one per task in the cluster, plus one, at least 4.

    A worker running a remote step holds a pool thread while it waits on a ps (and in unit 4 on
    other workers' gradients); with fewer threads than tasks that can wait at once, co-located
    servers on a 2-core machine starve and hang forever (measured: > 10 min vs 0.4 s).
    """
    return max(4, sum(len(v) for v in cluster.values()) + 1)



def intra_op_threads() -> int:
    """Threads inside one op: the engine's share of the cores ($COURSE_THREADS)."""
    from ..settings import env_threads

    return max(1, env_threads() or 1)



def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)



def unanswered(addresses: Mapping[str, str], timeout: float = READY_TIMEOUT,
               poll: float = 0.1) -> list[str]:
    """Names (``"ps:0"``) of the tasks whose address does not accept a TCP connection within
    ``timeout`` seconds, polling every ``poll`` seconds. Empty when every task answers."""
    pending = dict(addresses)
    deadline = time.monotonic() + timeout
    while pending:
        for name, addr in list(pending.items()):
            host, port = split_address(addr)
            try:
                with socket.create_connection((host, port), timeout=min(1.0, timeout)):
                    pass
                pending.pop(name)
            except OSError:
                pass
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(poll)
    return sorted(pending)



def server_config(cluster: Mapping[str, Sequence[str]], inter_op: int | None = None,
                  device_filters: Sequence[str] | None = None) -> Any:
    """The ConfigProto every server (and session) uses: sized pools, optional device filters."""
    import tensorflow as tf

    cfg = tf.compat.v1.ConfigProto()
    cfg.inter_op_parallelism_threads = int(inter_op or inter_op_threads(cluster))
    cfg.intra_op_parallelism_threads = intra_op_threads()
    if device_filters:
        cfg.device_filters.extend(device_filters)
    return cfg
