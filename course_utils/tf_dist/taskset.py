"""One TF task set: the ps/worker tasks of one cluster spec, wherever they run.

Units 4-5 host the tasks' servers inside the engines (:mod:`.servers`); unit 8's drills (and
units 7, 9) run each task as a process of its own (:mod:`.tasks`). Both pick their ports here
(:func:`pick_ports`: each engine picks the ports for the tasks its rank hosts, so "free" is
true where the server will listen) and both wait here (:func:`wait_ready`: every task answers
within a bounded wait, or an error names the missing ones). The kernel's running set is
:func:`active`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..cluster import CourseCluster, current, ports
from .spec import (
    JOBS,
    READY_TIMEOUT,
    TFServerNotAnswering,
    make_tf_config,
    tasks_on_rank,
    unanswered,
)

#: How a set's tasks run: servers inside the engines, or one process per task.
IN_ENGINES = "engines"
IN_PROCESSES = "processes"


@dataclass
class TaskSet:
    """ps/worker tasks: roles (rank of each task), the cluster spec, and what hosts them."""

    roles: dict[str, list[int]]
    cluster: dict[str, list[str]]
    inter_op: int = 0
    hosted_in: str = IN_ENGINES
    started_s: float = 0.0
    engine_ids: dict[int, int] = field(default_factory=dict)  # rank -> engine id at start
    pids: dict[str, int] = field(default_factory=dict)        # "ps:0" -> pid (processes)
    started_by: dict[str, int] = field(default_factory=dict)  # "ps:0" -> rank that forked it
    stopper: Callable[[], Any] | None = field(default=None, repr=False, compare=False)

    def address(self, job: str, index: int) -> str:
        return self.cluster[job][index]

    def rank_of(self, task: str, index: int | None = None) -> int:
        """The rank hosting ``rank_of("worker", 1)`` or ``rank_of("worker:1")``."""
        if index is None:
            task, _, idx = task.partition(":")
            index = int(idx)
        return self.roles[task][index]

    def addresses(self) -> dict[str, str]:
        """``{"ps:0": "host:port", ...}``"""
        return {f"{j}:{i}": a for j in JOBS for i, a in enumerate(self.cluster.get(j, ()))}

    def tf_config(self, job: str, index: int) -> str:
        return json.dumps(make_tf_config(self.cluster, job, index))

    def table(self) -> str:
        pid_col = bool(self.pids)
        rows = [f"{'task':<9} {'rank':>4}" + (f" {'pid':>7}" if pid_col else "") + "  address"]
        for name, addr in self.addresses().items():
            pid = f" {self.pids.get(name, 0):>7}" if pid_col else ""
            rows.append(f"{name:<9} {self.rank_of(name):>4}{pid}  {addr}")
        return "\n".join(rows)

    def wait(self, timeout: float = READY_TIMEOUT) -> float:
        """:func:`wait_ready` on this set."""
        return wait_ready(self, timeout=timeout)

    def stop(self) -> Any:
        """Stop the tasks the way they were started (``stop_servers`` or ``tasks.stop``)."""
        if self.stopper is None:
            raise TFServerNotAnswering("this task set was not started by the course's helpers",
                                       "stop its servers the way you started them")
        return self.stopper()


_ACTIVE: dict[str, TaskSet] = {}


def active() -> TaskSet | None:
    """The engine-hosted task set started from this kernel and still running, if any."""
    return _ACTIVE.get("servers")


def set_active(tasks: TaskSet | None) -> None:
    """Record (or with ``None`` forget) this kernel's engine-hosted task set."""
    if tasks is None:
        _ACTIVE.clear()
    else:
        _ACTIVE["servers"] = tasks


def pick_ports(cluster: CourseCluster | None, roles: Mapping[str, Sequence[int]]
               ) -> dict[tuple[str, int], int]:
    """``{("ps", 0): port, ("worker", 0): port, ...}``: each port picked free by the engine of
    the rank that will host that task (``roles`` from :func:`plan_roles`)."""
    cc = cluster or current()
    rm = cc.ranks
    counts = [len(tasks_on_rank(roles, r)) for r in range(rm.world_size)]
    picked = cc.run_per_rank(ports.free_ports,
                             [(n, rm[r].addr) for r, n in enumerate(counts)], timeout=30)
    out: dict[tuple[str, int], int] = {}
    for rank in range(rm.world_size):
        for task, port in zip(tasks_on_rank(roles, rank), picked[rank], strict=True):
            out[task] = int(port)
    return out


_FIX = {
    IN_ENGINES: "start every task's server with cu.tf_dist.start_servers() (it starts all of "
                "them and checks them); if an engine was killed or restarted, run it again",
    IN_PROCESSES: "start the missing task (tf_dist.tasks.start() starts every task and checks "
                  "it), or correct its address in the cluster spec",
    "spec": "start the missing task, or correct its address in the cluster spec "
            "(cu.tf_dist.start_servers() and tf_dist.tasks.start() start every task and check it)",
}


def wait_ready(tasks: TaskSet | Mapping[str, Sequence[str]], timeout: float = READY_TIMEOUT,
               jobs: Sequence[str] = JOBS) -> float:
    """Wait until every ps/worker task accepts a connection; raise naming the missing ones.

    ``tasks``: a :class:`TaskSet` or a cluster spec. Returns the seconds it took. Run it before
    building a strategy or a session: a task that never started would otherwise make them wait
    forever, silently.
    """
    import time

    spec = tasks.cluster if isinstance(tasks, TaskSet) else dict(tasks)
    addrs = {f"{job}:{i}": a for job in jobs for i, a in enumerate(spec.get(job, ()))}
    t0 = time.monotonic()
    missing = unanswered(addrs, timeout=timeout)
    if missing:
        where = ", ".join(f"{m} at {addrs[m]}" + (f" (rank {tasks.rank_of(m)})" if isinstance(
            tasks, TaskSet) else "") for m in missing)
        kind = tasks.hosted_in if isinstance(tasks, TaskSet) else "spec"
        raise TFServerNotAnswering(
            f"{len(missing)} TF task(s) did not answer within {timeout:g} s: {where}; a "
            "ParameterServerStrategy or a session would wait for them forever", _FIX[kind])
    return time.monotonic() - t0
