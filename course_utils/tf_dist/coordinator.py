"""Unit 5's coordinator in the notebook kernel: a ``ParameterServerStrategy`` whose chief is
the kernel, a bounded ``join()`` and a counter of what the coordinator does about failures.

The kernel imports TensorFlow only inside :func:`connect_coordinator`.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

from ..cluster import CourseCluster, current, ports
from .quiet import quiet_tensorflow, short_error
from .servers import _STATE, TFCluster, active, wait_ready
from .spec import READY_TIMEOUT, TFServerNotAnswering, TFTimeout, inter_op_threads, intra_op_threads


def _kernel_address(cc: CourseCluster) -> str:
    if cc.profile.is_local:
        return "127.0.0.1"
    from ..cluster.engine import _route_addr

    return _route_addr(cc.ranks.master_addr)



def connect_coordinator(tfc: TFCluster | None = None, variable_partitioner: Any = None,
                        timeout: float = READY_TIMEOUT,
                        cluster: CourseCluster | None = None) -> Any:
    """A ``ParameterServerStrategy`` whose coordinator (the "chief") is this kernel.

    Checks that every ps and worker answers first (bounded), then gives the kernel a fresh
    chief port (its own gRPC server cannot be stopped either, so a re-run needs a new one).
    """
    cc = cluster or current()
    tfc = tfc or active()
    if tfc is None:
        raise TFServerNotAnswering("no TF servers are running on the engines",
                                   "run cu.tf_dist.start_servers() first")
    wait_ready(tfc, timeout=timeout)
    tf = quiet_tensorflow()
    threads = inter_op_threads(tfc.cluster)
    try:  # only possible before TF's runtime started in this kernel; later runs keep the first
        tf.config.threading.set_inter_op_parallelism_threads(threads)
        tf.config.threading.set_intra_op_parallelism_threads(intra_op_threads())
    except RuntimeError:
        pass
    addr = _kernel_address(cc)
    spec = {**tfc.cluster, "chief": [f"{addr}:{ports.free_port(addr)}"]}
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(spec), task_type="chief", task_id=0, rpc_layer="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=variable_partitioner)
    _STATE["strategy_cluster"] = spec
    return strategy



def join_within(coordinator: Any, timeout: float = 60.0) -> tuple[str | None, float]:
    """``coordinator.join()``, waited for at most ``timeout`` seconds.

    Returns ``(None, seconds)`` when every scheduled step finished, or ``(error, seconds)`` with
    the first line of the error ``join()`` raised (e.g. after a ps was lost). Raises
    :class:`TFTimeout` if ``join()`` is still waiting (the call keeps waiting in a daemon thread).
    """
    import threading

    box: dict[str, Any] = {}

    def _join() -> None:
        try:
            coordinator.join()
            box["error"] = None
        except Exception as exc:  # the coordinator re-raises what a step raised
            box["error"] = short_error(exc)

    t0 = time.monotonic()
    thread = threading.Thread(target=_join, name="course-join", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TFTimeout(f"coordinator.join() still waiting after {timeout:g} s",
                        "a task may be gone for good: run cu.tf_dist.teardown(), then restart "
                        "the kernel and the servers")
    return box["error"], time.monotonic() - t0



@contextlib.contextmanager
def watch_coordinator() -> Iterator[Counter[str]]:
    """Count what a ``ClusterCoordinator`` does about failures, without printing its log.

    Yields a Counter: ``worker_failures`` (a worker call failed), ``retried`` (a closure was put
    back on the queue to run on another worker), ``recovering`` (it started reconnecting).
    After the block TensorFlow's Python log stays at CRITICAL in this kernel: the coordinator
    keeps trying to reconnect a lost worker in the background and would print each attempt.
    """
    import logging

    counts: Counter[str] = Counter()

    class _Count(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            msg = record.getMessage()
            if "Putting back a closure" in msg:
                counts["retried"] += 1
            elif " failed with " in msg and "Worker" in msg:
                counts["worker_failures"] += 1
            elif "being recovered" in msg:
                counts["recovering"] += 1

    logger = logging.getLogger("tensorflow")
    saved = (logger.level, list(logger.handlers), logger.propagate)
    handler = _Count()
    logger.handlers = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    try:
        yield counts
    finally:
        logger.handlers = [h for h in saved[1] if h is not handler] or [logging.NullHandler()]
        logger.propagate = saved[2]
        logger.setLevel(logging.CRITICAL)
