"""Unit 5's coordinator in the notebook kernel: a ``ParameterServerStrategy`` whose chief is
the kernel, a bounded ``join()`` and a counter of what the coordinator does about failures.

The kernel imports TensorFlow only inside :func:`prepare_chief` and :func:`start_coordinator`;
:func:`stop_coordinators` stops them without waiting on TensorFlow's locks.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from ..cluster import CourseCluster, current, ports
from .quiet import quiet_tensorflow, short_error
from .spec import READY_TIMEOUT, TFServerNotAnswering, TFTimeout, inter_op_threads, intra_op_threads
from .taskset import TaskSet, active, wait_ready


def _kernel_address(cc: CourseCluster) -> str:
    if cc.profile.is_local:
        return "127.0.0.1"
    from ..cluster.engines.engine import route_address

    return route_address(cc.ranks.master_addr)



def prepare_chief(tasks: TaskSet | Mapping[str, Sequence[str]] | None = None,
                  timeout: float = READY_TIMEOUT, cluster: CourseCluster | None = None) -> str:
    """Get this kernel ready to be the coordinator ("chief"); returns a fresh chief address.

    Checks that every ps and worker answers first (bounded: a missing task would make the
    strategy's constructor wait forever), sizes the kernel's thread pools (only possible before
    TensorFlow's runtime started here), and picks a fresh port: the kernel's own gRPC server
    cannot be stopped, so each new strategy needs a new one. Used by ``05_...`` before the
    learner builds ``TF_CONFIG`` and the strategy. ``tasks``: a :class:`TaskSet` or a cluster
    spec (default: the servers started from this kernel).
    """
    cc = cluster or current()
    tasks = tasks if tasks is not None else active()
    spec = _spec_of(tasks)
    wait_ready(tasks if isinstance(tasks, TaskSet) else spec, timeout=timeout)
    stop_coordinators(only_stuck=True)
    tf = quiet_tensorflow()
    try:  # only possible before TF's runtime started in this kernel; later runs keep the first
        tf.config.threading.set_inter_op_parallelism_threads(inter_op_threads(spec))
        tf.config.threading.set_intra_op_parallelism_threads(intra_op_threads())
    except RuntimeError:
        pass
    addr = _kernel_address(cc)
    return f"{addr}:{ports.free_port(addr)}"



def _spec_of(tasks: TaskSet | Mapping[str, Sequence[str]] | None) -> dict[str, list[str]]:
    tasks = tasks if tasks is not None else active()
    if tasks is None:
        raise TFServerNotAnswering("no TF servers are running on the engines",
                                   "run cu.tf_dist.start_servers() first")
    spec = tasks.cluster if isinstance(tasks, TaskSet) else tasks
    return {job: list(addrs) for job, addrs in spec.items()}


def start_coordinator(tasks: TaskSet | Mapping[str, Sequence[str]] | None = None,
                      variable_partitioner: Any = None, timeout: float = READY_TIMEOUT,
                      cluster: CourseCluster | None = None) -> Any:
    """A ``ParameterServerStrategy`` whose coordinator (the "chief") is this kernel.

    What ``05_...``'s exercise builds by hand, in one call: :func:`prepare_chief`, then a
    resolver on the tasks' spec plus the chief, then the strategy. ``tasks``: a
    :class:`TaskSet` or a cluster spec (default: the servers started from this kernel).
    """
    tasks = tasks if tasks is not None else active()
    chief = prepare_chief(tasks, timeout=timeout, cluster=cluster)
    tf = quiet_tensorflow()
    spec = {**_spec_of(tasks), "chief": [chief]}
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(spec), task_type="chief", task_id=0, rpc_layer="grpc")
    return tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=variable_partitioner)



def variable_shards(variables: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One dict per shard of each named variable: which ps task holds it and which rows.

    ``{"var": "W1", "ps": 1, "rows": (32, 64), "shape": (32, 32), "bytes": 4096, "split": True}``.
    A variable that is not sharded is one entry with ``split: False``. Reads only ``shape``,
    ``dtype`` and ``device``: no value crosses the network. Feeds
    :func:`course_utils.viz.coordinator_queue` in ``05_...``.
    """
    out = []
    for name, var in variables.items():
        parts = list(getattr(var, "variables", None) or [var])
        row = 0
        for part in parts:
            shape = tuple(int(d) for d in part.shape)
            rows = shape[0] if shape else 1
            size = getattr(part.dtype, "size", 4)
            count = 1
            for d in shape:
                count *= d
            out.append({"var": name, "ps": _ps_index(part.device), "rows": (row, row + rows),
                        "shape": shape, "bytes": count * size, "split": len(parts) > 1})
            row += rows
    return out



def examples_per_worker(coordinator: Any, dataset_fn: Callable[[Any], Any], batches: int = 12,
                        timeout: float = 120.0) -> dict[str, Any]:
    """Which examples each worker's pipeline gives it (unit 5). ``dataset_fn(input_context)``
    must yield batches of example numbers (a pipeline over ``tf.data.Dataset.range(n)``); it is
    distributed as the training data is (``distribute_datasets_from_function``, then
    ``create_per_worker_dataset``), ``batches`` steps that each take one batch are scheduled,
    and the result says, per worker index, the batches it drew in order, with the
    ``input_context`` values the strategy passed to ``dataset_fn``."""
    tf = quiet_tensorflow()
    strategy = coordinator.strategy
    contexts: list[tuple[int, int]] = []

    def traced(ctx: Any) -> Any:
        contexts.append((int(ctx.input_pipeline_id), int(ctx.num_input_pipelines)))
        return dataset_fn(ctx)

    @tf.function
    def per_worker() -> Any:
        return strategy.distribute_datasets_from_function(traced)

    iterator = iter(coordinator.create_per_worker_dataset(per_worker))

    @tf.function
    def take(it: Any) -> Any:
        return {"worker": tf.distribute.coordinator.experimental_get_current_worker_index(),
                "batch": next(it)}

    drawn = [coordinator.schedule(take, args=(iterator,)) for _ in range(batches)]
    join(coordinator, timeout=timeout)
    out: dict[int, list[list[int]]] = {}
    for value in drawn:
        got = value.fetch()
        out.setdefault(int(got["worker"]), []).append([int(i) for i in got["batch"]])
    return {"batches": dict(sorted(out.items())), "input_context": sorted(set(contexts))}


def _ps_index(device: str) -> int:
    found = re.search(r"/job:ps/(?:replica:\d+/)?task:(\d+)", device or "")
    if not found:
        raise ValueError(f"{device!r} is not a device on a ps task: create the variable "
                         "under strategy.scope()")
    return int(found.group(1))



def join(coordinator: Any, timeout: float = 300.0) -> float:
    """``coordinator.join()`` with a time limit: what unit 5's cells call, so that a task lost
    for good gives an error instead of a cell that never ends. Returns the seconds it waited.
    A step's own error (a mistake in the learner's step, a lost ps) is raised as ``join()``
    raised it; raises :class:`TFTimeout` if ``join()`` is still waiting after ``timeout`` s."""
    box: dict[str, BaseException] = {}

    def _join() -> None:
        try:
            coordinator.join()
        except Exception as exc:  # the coordinator re-raises what a step raised
            box["error"] = exc

    t0 = time.monotonic()
    if not _finished_within(_join, timeout, "course-join"):
        raise TFTimeout(f"coordinator.join() still waiting after {timeout:g} s: a step has not "
                        "finished, or a task it needs is gone",
                        "check the tasks with cu.tf_dist.wait_ready(tfc); if one is gone, run "
                        "cu.tf_dist.stop_servers(), restart the kernel and run the notebook from "
                        "the servers' cell")
    if "error" in box:
        raise box["error"]
    return time.monotonic() - t0


def join_within(coordinator: Any, timeout: float = 60.0,
                schedule: Sequence[Callable[[], Any]] = ()) -> tuple[str | None, float]:
    """``coordinator.join()``, waited for at most ``timeout`` seconds.

    ``schedule``: functions (without arguments) to ``coordinator.schedule`` first, inside the
    same bounded wait: after a step failed, ``schedule()`` itself waits for every step in flight
    before it re-raises the error (unit 5's lost ps). Returns ``(None, seconds)`` when every
    scheduled step finished, or ``(error, seconds)`` with the first line of the error ``join()``
    (or ``schedule()``, then marked so) raised, e.g. after a ps was lost. Raises
    :class:`TFTimeout` if it is still waiting (the call keeps waiting in a daemon thread).
    """
    box: dict[str, Any] = {}

    def _join() -> None:
        try:
            for fn in schedule:
                coordinator.schedule(fn)
        except Exception as exc:  # schedule() re-raises an error the coordinator already saw
            box["error"] = f"{short_error(exc)} (raised by schedule)"
            return
        try:
            coordinator.join()
            box["error"] = None
        except Exception as exc:  # the coordinator re-raises what a step raised
            box["error"] = short_error(exc)

    t0 = time.monotonic()
    if not _finished_within(_join, timeout, "course-join"):
        raise TFTimeout(f"coordinator.join() still waiting after {timeout:g} s",
                        "a task may be gone for good: run cu.tf_dist.stop_servers(), then "
                        "restart the kernel and the servers")
    return box["error"], time.monotonic() - t0



def _no_wait_stop() -> None:
    """A retired failure handler's ``stop``: it is stopped already (see
    :func:`stop_coordinators`)."""


def _finished_within(target: Callable[[], None], timeout: float, name: str) -> bool:
    """Run ``target`` in a daemon thread; False if it is still running after ``timeout`` s
    (TensorFlow's waits cannot be interrupted, so the thread is left to finish or not)."""
    import threading

    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    thread.join(timeout)
    return not thread.is_alive()


def stop_coordinators(only_stuck: bool = False, timeout: float = 10.0) -> int:
    """Stop every ``ClusterCoordinator`` this kernel still runs, without waiting on them;
    returns how many were stopped. Called by :func:`prepare_chief` (``only_stuck=True``: those
    that lost a worker) and by :func:`~course_utils.tf_dist.stop_servers` (all: their servers
    go).

    Why: a coordinator that lost a worker keeps one thread reconnecting it, and TensorFlow's
    ``update_server_def`` waits for the lost task *forever* while that thread holds the
    coordinator's failure lock. ``ClusterCoordinator.__del__`` takes that lock, and the garbage
    collector runs it in whichever thread happens to allocate, e.g. a worker thread of a *newer*
    coordinator with a step in flight: that step never ends, and the new ``join()`` or
    ``schedule()`` waits forever (unit 5's second whole pass hung so, in the lost-ps cell).
    Retiring does what ``stop()`` does without that lock, so a later ``__del__`` returns at once.
    """
    import threading

    handlers = []
    for thread in threading.enumerate():
        handler = getattr(getattr(thread, "_target", None), "__self__", None)
        if thread.name != "WorkerPreemptionHandler" or handler is None \
                or getattr(handler, "_course_retired", False):
            continue
        due = getattr(handler, "_cluster_due_for_update_or_finish", None)
        if due is None or not hasattr(handler, "_cluster"):
            continue
        if only_stuck and not due.is_set():  # not reconnecting a lost worker: stop() is safe
            continue
        handlers.append(handler)
    if not handlers:
        return 0

    def _retire() -> None:
        for handler in handlers:
            handler._course_retired = True
            handler._should_preemption_thread_run = False
            handler.stop = _no_wait_stop  # the instance's stop now skips the held lock
            handler._cluster_due_for_update_or_finish.set()  # the thread ends after its try
            handler._cluster.stop()  # workers, queue, cancellations (the handler's stop skipped)

    if not _finished_within(_retire, timeout, "course-retire"):
        raise TFTimeout(f"an old ClusterCoordinator did not stop within {timeout:g} s",
                        "restart the kernel (Kernel > Restart Kernel), then run the notebook "
                        "from the top")
    return len(handlers)


#: What the coordinator logs about failures: (text in the message, event, counter key).
_LOG_EVENTS = (
    ("Putting back a closure", "put_back", "retried"),
    (" failed with ", "failed", "worker_failures"),  # with "Worker" in it (see coordinator_event)
    ("being recovered", "recovering", "recovering"),
    ("has been recovered", "recovered", "recovered"),
)


def coordinator_event(message: str) -> tuple[str, str, int] | None:
    """``(event, counter key, worker index or -1)`` for a line of ``ClusterCoordinator``'s log
    about failures, ``None`` for any other line."""
    for text, event, key in _LOG_EVENTS:
        if text in message and (event != "failed" or "Worker" in message):
            found = re.search(r"\[Worker (\d+)\]", message) or re.search(r"task:(\d+)", message)
            return event, key, int(found.group(1)) if found else -1
    return None


class CoordinatorLog(Counter):  # type: ignore[type-arg]
    """What :func:`watch_coordinator` saw: counts by key (``worker_failures``, ``retried``,
    ``recovering``, ``recovered``) and ``events``, one ``{"time": s, "event": "failed" |
    "put_back" | "recovering" | "recovered", "worker": index or -1}`` per log line, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[dict[str, Any]] = []


@contextlib.contextmanager
def watch_coordinator() -> Iterator[CoordinatorLog]:
    """Count and timestamp what a ``ClusterCoordinator`` does about failures, without printing
    its log (unit 5).

    Yields a :class:`CoordinatorLog`: ``seen["worker_failures"]`` (a worker call failed),
    ``seen["retried"]`` (a closure was put back on the queue to run on another worker),
    ``seen["recovering"]`` (it started reconnecting), and ``seen.events`` with the time of each
    (for :func:`~course_utils.viz.closure_timeline`). Blocks nest (each sees every line).
    After the outermost block TensorFlow's Python log stays at CRITICAL in this kernel: the
    coordinator keeps trying to reconnect a lost worker in the background and would print
    each attempt.
    """
    import logging

    seen = CoordinatorLog()

    class _Watch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            found = coordinator_event(record.getMessage())
            if found:
                event, key, worker = found
                seen[key] += 1
                seen.events.append({"time": record.created, "event": event, "worker": worker})

    logger = logging.getLogger("tensorflow")
    saved = (logger.level, list(logger.handlers), logger.propagate)
    handler = _Watch()
    # An enclosing block's handler keeps counting; any other handler would print.
    logger.handlers = [h for h in saved[1] if type(h).__name__ == "_Watch"] + [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    try:
        yield seen
    finally:
        outer = [h for h in saved[1] if type(h).__name__ == "_Watch"]
        logger.handlers = [h for h in saved[1] if h is not handler] or [logging.NullHandler()]
        logger.propagate = saved[2] if not outer else False
        logger.setLevel(logging.INFO if outer else logging.CRITICAL)
