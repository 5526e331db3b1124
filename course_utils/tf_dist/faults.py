"""The TensorFlow drills of ``08_hangs_and_faults``: a ps that never started, a worker lost
under ``ParameterServerStrategy``, a ps lost and the restore, each with a bounded wait.

Every ps/worker task here is a real ``tf.distribute.Server`` in a process of its own
(:mod:`.task_server`), started by the engine of the rank the rank map gives it, on that
engine's host. Killing a task kills that process only: the engines, their torch process group
and the other tasks live on, so the drills need no engine restart. Units 4-5 host their
servers inside the engines (:mod:`.servers`) instead.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..cluster import CourseCluster, current, ports
from .spec import (
    JOBS,
    TFServerNotAnswering,
    cluster_dict,
    inter_op_threads,
    plan_roles,
    split_address,
    tasks_on_rank,
    unanswered,
)


@dataclass
class TaskProcesses:
    """ps/worker tasks running as processes on the engines' hosts: spec, roles, pids."""

    roles: dict[str, list[int]]
    cluster: dict[str, list[str]]
    pids: dict[str, int] = field(default_factory=dict)   # "ps:0" -> pid
    started_s: float = 0.0

    def rank_of(self, task: str) -> int:
        job, _, idx = task.partition(":")
        return self.roles[job][int(idx)]

    def table(self) -> str:
        rows = [f"{'task':<9} {'rank':>4} {'pid':>7}  address"]
        for job in JOBS:
            for i, addr in enumerate(self.cluster.get(job, ())):
                name = f"{job}:{i}"
                rows.append(f"{name:<9} {self.roles[job][i]:>4} {self.pids.get(name, 0):>7}  "
                            f"{addr}")
        return "\n".join(rows)


def start_tasks(cluster: CourseCluster | None = None, num_ps: int = 1, num_workers: int = 2,
                timeout: float = 60.0) -> TaskProcesses:
    """Start one process per ps/worker task (ps on rank 0, worker ``i`` on rank ``i % p``),
    each started by its rank's engine, and wait (bounded) until every task answers.
    Raises :class:`TFServerNotAnswering` naming the tasks that did not."""
    cc = cluster or current()
    roles = plan_roles(cc.world_size, num_ps, num_workers)
    rm = cc.ranks
    addrs = [r.addr for r in rm]
    counts = [len(tasks_on_rank(roles, r)) for r in range(rm.world_size)]
    t0 = time.perf_counter()
    picked = cc.run_per_rank(ports.free_ports, [(n, a) for n, a in zip(counts, addrs,
                                                                       strict=True)], timeout=30)
    by_task = {task: port for r in range(rm.world_size)
               for task, port in zip(tasks_on_rank(roles, r), picked[r], strict=True)}
    spec = cluster_dict(roles, addrs, by_task)
    threads = inter_op_threads(spec)
    args = [(spec, [f"{j}:{i}" for j, i in tasks_on_rank(roles, r)], threads)
            for r in range(rm.world_size)]
    pids: dict[str, int] = {}
    for got in cc.run_per_rank(engine_spawn_tasks, args, timeout=30):
        pids.update(got)
    tp = TaskProcesses(roles=roles, cluster=spec, pids=pids)
    wait_tasks(tp, timeout=timeout)
    tp.started_s = time.perf_counter() - t0
    return tp


def wait_tasks(tp: TaskProcesses, timeout: float = 60.0) -> None:
    """Bounded: every task of ``tp`` accepts a connection within ``timeout`` s, or
    :class:`TFServerNotAnswering` names the ones that do not, with the fix."""
    addrs = {f"{j}:{i}": a for j in JOBS for i, a in enumerate(tp.cluster.get(j, ()))}
    missing = unanswered(addrs, timeout=timeout)
    if missing:
        where = ", ".join(f"{m} at {addrs[m]} (rank {tp.rank_of(m)})" for m in missing)
        raise TFServerNotAnswering(f"{len(missing)} TF task(s) did not answer within "
                                   f"{timeout:g} s: {where}",
                                   "start them again with tf_dist.faults.start_tasks(); on a "
                                   "busy machine pass a larger timeout=")


def with_missing_ps(tp: TaskProcesses, index: int = 0) -> dict[str, list[str]]:
    """``tp``'s cluster spec with ``ps:index`` moved to a free port nobody serves: the spec of a
    job whose ps task never started."""
    host, _ = split_address(tp.cluster["ps"][index])
    ps = list(tp.cluster["ps"])
    ps[index] = f"{host}:{ports.free_port(host)}"
    return {**tp.cluster, "ps": ps}


def kill_task(tp: TaskProcesses, task: str, cluster: CourseCluster | None = None) -> int:
    """SIGKILL the process of ``task`` (``"worker:1"``) from the engine that started it; returns
    its pid. The engine and every other task keep running."""
    cc = cluster or current()
    return int(cc.run_on(tp.rank_of(task), engine_kill_task, task, timeout=15))


def stop_tasks(cluster: CourseCluster | None = None) -> int:
    """Kill every task process the engines started; returns how many were still running."""
    cc = cluster or current()
    return sum(cc.run(engine_stop_tasks, timeout=30))


def coordinator_for(spec: dict[str, list[str]], timeout: float = 10.0,
                    cluster: CourseCluster | None = None) -> tuple[Any, Any]:
    """A ``ParameterServerStrategy`` for ``spec`` with this kernel as the chief, and its
    ``ClusterCoordinator``. Checks first (bounded) that every task answers: a missing one
    raises :class:`TFServerNotAnswering` naming it, instead of a constructor that waits
    forever."""
    from .coordinator import prepare_chief
    from .quiet import quiet_tensorflow
    from .servers import TFCluster

    roles = {j: [0] * len(spec.get(j, ())) for j in JOBS}
    chief = prepare_chief(TFCluster(roles=roles, cluster=spec, inter_op=inter_op_threads(spec)),
                          timeout=timeout, cluster=cluster)
    tf = quiet_tensorflow()
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec({**spec, "chief": [chief]}), task_type="chief", task_id=0,
        rpc_layer="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    return strategy, tf.distribute.coordinator.ClusterCoordinator(strategy)


def wait_for_steps(variable: Any, at_least: int, timeout: float = 30.0) -> int:
    """Poll a ps-held counter until it reaches ``at_least`` (bounded); returns its value."""
    deadline = time.monotonic() + timeout
    value = int(variable.numpy())
    while value < at_least and time.monotonic() < deadline:
        time.sleep(0.02)
        value = int(variable.numpy())
    return value


# ---- engine side ----------------------------------------------------------------------------
_PROCS: dict[str, subprocess.Popen[bytes]] = {}


def engine_spawn_tasks(spec: dict[str, list[str]], tasks: list[str], inter_op: int
                       ) -> dict[str, int]:
    """*Not collective.* Start one :mod:`.task_server` process per task (``"ps:0"``) on this
    host; returns their pids. Their standard input is a pipe from this engine: when the engine
    dies, they exit."""
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "TF_CPP_MIN_LOG_LEVEL": "3", "TF_CONFIG": ""}
    env.pop("TF_CONFIG")
    out = {}
    for task in tasks:
        old = _PROCS.pop(task, None)
        if old is not None and old.poll() is None:
            old.kill()
        job, _, idx = task.partition(":")
        proc = subprocess.Popen([sys.executable, "-m", "course_utils.tf_dist.task_server",
                                 json.dumps(spec), job, idx, str(inter_op)],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=env)
        _PROCS[task] = proc
        out[task] = proc.pid
    return out


def engine_kill_task(task: str) -> int:
    """*Not collective.* SIGKILL this engine's process of ``task``; returns its pid."""
    proc = _PROCS.get(task)
    if proc is None:
        raise KeyError(f"this engine started no process for {task}")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    return proc.pid


def engine_stop_tasks() -> int:
    """*Not collective.* Kill every task process this engine started; how many were alive."""
    alive = 0
    for task, proc in list(_PROCS.items()):
        if proc.poll() is None:
            alive += 1
            proc.kill()
            proc.wait(timeout=10)
        _PROCS.pop(task)
    return alive
