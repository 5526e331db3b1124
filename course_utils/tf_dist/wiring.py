"""Unit 4's hand-built cluster: the learner writes the ``ClusterSpec`` and starts the servers;
these helpers do the parts around it.

* :func:`pick_ports`: every engine picks free ports for the tasks it will host (so "free" is
  true where the server will listen), before anyone writes the spec.
* :func:`adopt_servers`: after the learner's ``%%px`` cell started the servers, check that every
  task answers and that each rank hosts exactly its tasks, then hand the cluster to the other
  helpers (:func:`~course_utils.tf_dist.reset_ps`, :func:`~course_utils.tf_dist.teardown`, ...).
* :func:`run_training`: call a ``%%px`` training function on every rank with a timeout whose
  message speaks about TensorFlow (hooks, ``global_step``), not about collectives.

Introduced in ``04_tf_classic_ps``; the engines record the learner's servers with
:func:`course_utils.tf_dist.register_server`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..cluster import CourseCluster, current, ports
from ..errors import ClusterTimeout
from .servers import _STATE, TFCluster, _engine_hosted, _engine_ids, _register_hooks, wait_ready
from .spec import READY_TIMEOUT, TFServerNotAnswering, TFTimeout, inter_op_threads, tasks_on_rank


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


def hosted_by_rank(cluster: CourseCluster | None = None) -> list[list[str]]:
    """The servers each rank's engine has registered (``[["ps:0", "worker:0"], ["worker:1"]]``)."""
    cc = cluster or current()
    return cc.run(_engine_hosted, timeout=30)


def adopt_servers(cluster: CourseCluster | None, roles: Mapping[str, Sequence[int]],
                  spec: Mapping[str, Sequence[str]],
                  timeout: float = READY_TIMEOUT) -> TFCluster:
    """Take over servers the learner started: every task must answer within ``timeout`` and
    every rank must host exactly its tasks. Returns the :class:`TFCluster` that ``reset_ps``,
    ``teardown`` and ``start_servers`` then use, as if ``start_servers`` had started it."""
    cc = cluster or current()
    t0 = time.perf_counter()
    roles = {job: list(ranks) for job, ranks in roles.items()}
    hosted = hosted_by_rank(cc)
    for rank, names in enumerate(hosted):
        want = sorted(f"{job}:{i}" for job, i in tasks_on_rank(roles, rank))
        if sorted(names) != want:
            raise TFServerNotAnswering(
                f"rank {rank} hosts {sorted(names) or 'no server'}, but the roles give it {want}",
                "start a server only for the tasks whose rank in the roles is this rank, and "
                "return them all from your function; then re-run the cells from the ports cell")
    tfc = TFCluster(roles=roles, cluster={k: list(v) for k, v in spec.items()},
                    inter_op=inter_op_threads(spec), engine_ids=_engine_ids(cc))
    wait_ready(tfc, timeout=timeout)
    _STATE["tfc"] = tfc
    _register_hooks(cc)
    tfc.started_s = time.perf_counter() - t0
    return tfc


def run_training(cluster: CourseCluster | None, fn_name: str, *args: Any,
                 timeout: float = 90.0, **kwargs: Any) -> list[Any]:
    """``cluster.call(fn_name, ...)`` for a TF training loop; a timeout says what to check.

    The course's step guard (in the ``hooks`` every worker passes to its session) stops a loop
    that runs too long with a message about ``global_step``; if that never fired, the loop did
    not use the hooks at all, and this timeout says so.
    """
    cc = cluster or current()
    try:
        return cc.call(fn_name, *args, timeout=timeout, **kwargs)
    except ClusterTimeout as err:
        raise TFTimeout(
            f"{fn_name}() did not return within {timeout:g} s on every worker, and the course's "
            "step guard never fired: the session did not get the hooks (so neither "
            "StopAtStepHook nor the guard could stop it), or a worker waits for a task that "
            f"is gone ({_still_running(err.cause)}).",
            "pass hooks=[StopAtStepHook(last_step=steps), *hooks] to MonitoredTrainingSession "
            "and loop while not sess.should_stop(); the engines are still busy: run "
            "tf_dist.teardown(cluster), then re-run the notebook from the servers' cells",
        ) from None


def _still_running(cause: str) -> str:
    found = re.search(r"still running on ranks \[[^\]]*\]", cause)
    return found.group(0) if found else "some ranks did not answer"
