"""Unit 4's classic (``tf.compat.v1``) graph side: session configs, waiting for the chief,
which tensors one step moves between tasks, and the step guard with the kernel's call that
runs training (:func:`run_training`, a timeout that speaks about TensorFlow).

All but :func:`run_training` run on the engines (inside ``%%px`` cells), where TensorFlow is
imported.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from .. import settings
from ..cluster import CourseCluster, current
from ..errors import ClusterTimeout
from .quiet import quiet_tensorflow
from .spec import TFTimeout, server_config


def step_timeout_ms() -> int:
    """Milliseconds one session step may wait (on a ps, on other workers) before it raises
    DeadlineExceeded instead of hanging."""
    return int(min(settings.call_timeout(), 60) * 1000)



def session_config(worker_index: int, cluster: Mapping[str, Sequence[str]] | None = None) -> Any:
    """ConfigProto for worker ``worker_index``'s session: sized pools, a step timeout, and
    device filters so it talks to the ps tasks and itself only (never to the other workers)."""
    import __main__

    spec = cluster or vars(__main__)["tf_cluster"]
    cfg = server_config(spec, device_filters=["/job:ps", f"/job:worker/task:{worker_index}"])
    cfg.operation_timeout_in_ms = step_timeout_ms()
    return cfg



def wait_for_chief(target: str, timeout: float = 60.0, poll: float = 0.1) -> float:
    """On a non-chief worker: wait until the chief has initialized the variables of the current
    default graph on the ps, then return the seconds waited.

    Without it, ``MonitoredTrainingSession`` on a non-chief checks once and then sleeps a fixed
    30 s before looking again. Raises :class:`TFTimeout` if the chief never initializes them.
    """
    import tensorflow as tf

    graph = tf.compat.v1.get_default_graph()
    with graph.as_default():
        probe = tf.compat.v1.report_uninitialized_variables(tf.compat.v1.global_variables())
    t0 = time.monotonic()
    cfg = tf.compat.v1.ConfigProto(operation_timeout_in_ms=int(timeout * 1000))
    with tf.compat.v1.Session(target, graph=graph, config=cfg) as sess:
        while True:
            left = sess.run(probe)
            if len(left) == 0:
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                names = ", ".join(n.decode() for n in left[:5])
                raise TFTimeout(
                    f"the chief (worker 0) did not initialize {names} within {timeout:g} s",
                    "worker 0 must run the same graph with is_chief=True at the same time",
                )
            time.sleep(poll)



def guard_message(worker: int | None, runs: int, first: int, last: int, last_step: int,
                  seconds: float) -> tuple[str, str]:
    """(cause, fix) for a training loop stopped by :func:`step_guard`: did ``global_step``
    advance, and which hook should have stopped the loop."""
    who = "this worker" if worker is None else f"worker {worker}"
    head = f"{who} ran {runs} session steps in {seconds:.0f} s without stopping"
    if last == first:
        return (f"{head}, and global_step stayed at {last}: train_op does not advance it, so "
                f"StopAtStepHook(last_step={last_step}) can never fire",
                "in build_graph, pass global_step to the optimizer: "
                "opt.minimize(loss, global_step=global_step); then re-run the cells from there")
    if last >= last_step:
        return (f"{head}; global_step advanced from {first} to {last}, past last_step="
                f"{last_step}, so StopAtStepHook(last_step={last_step}) should have stopped the "
                "loop: the session does not have it, or the loop ignores sess.should_stop()",
                "pass hooks=[tf.compat.v1.train.StopAtStepHook(last_step=steps), *hooks] to "
                "MonitoredTrainingSession and loop `while not sess.should_stop():`")
    return (f"{head}; global_step advanced from {first} to {last} of last_step={last_step}, "
            "too slowly: each update waits on another task (a stuck worker, or a "
            "SyncReplicasOptimizer waiting for gradients that never come)",
            "check every worker runs the same graph with the same sync setting; run "
            "tf_dist.stop_servers(cluster) and start the servers again")



#: The target and device filters of the last session a :func:`step_guard` saw opened.
GUARDED_SESSION: dict[str, Any] = {}


def guarded_session() -> dict[str, Any]:
    """What :data:`GUARDED_SESSION` holds on this engine (for ``cluster.run``)."""
    return dict(GUARDED_SESSION)


def step_guard(global_step: Any, last_step: int, limit_s: float = 30.0,
               worker: int | None = None) -> Any:
    """A ``SessionRunHook`` that ends a training loop still running after ``limit_s`` seconds
    with a :class:`TFTimeout` saying whether ``global_step`` advanced and which hook should have
    stopped the loop (instead of a silent multi-minute wait); it also notes the session's target
    and device filters (:func:`guarded_session`). Used by ``04_tf_classic_ps``."""
    tf = quiet_tensorflow()

    class StepGuard(tf.compat.v1.train.SessionRunHook):
        def begin(self) -> None:
            self.t0: float | None = None
            self.first: int | None = None
            self.runs = 0

        def after_create_session(self, session: Any, coord: Any) -> None:
            # what the learner's session was opened with, for unit 4's test (reads only)
            cfg = getattr(session, "_config", None)
            GUARDED_SESSION.clear()
            GUARDED_SESSION.update(
                target=session.sess_str.decode() if isinstance(session.sess_str, bytes)
                else str(session.sess_str),
                device_filters=sorted(cfg.device_filters) if cfg is not None else None)

        def before_run(self, run_context: Any) -> Any:
            if self.t0 is None:
                self.t0 = time.monotonic()
            return tf.compat.v1.train.SessionRunArgs(global_step)

        def after_run(self, run_context: Any, run_values: Any) -> None:
            step = int(run_values.results)
            self.runs += 1
            if self.first is None:
                self.first = step
            seconds = time.monotonic() - (self.t0 or 0.0)
            if seconds > limit_s:
                raise TFTimeout(*guard_message(worker, self.runs, self.first, step, last_step,
                                               seconds))

    return StepGuard()



def task_of(device: str) -> str:
    """``"/job:ps/task:0/device:CPU:0"`` -> ``"/job:ps/task:0"`` (``""`` when unplaced)."""
    return device.split("/device")[0] if device else ""



def cross_task_traffic(graph: Any, batch: int) -> list[dict[str, Any]]:
    """Every tensor one training step sends from one task to another in ``graph``.

    Each entry: tensor name, source and destination task, and its size in bytes for a batch of
    ``batch`` (unknown dimensions are the batch). Ops without a device are skipped.
    """
    seen = set()
    out = []
    for op in graph.get_operations():
        dst = task_of(op.device)
        for tensor in op.inputs:
            src = task_of(tensor.op.device)
            if not src or not dst or src == dst or (tensor.name, dst) in seen:
                continue
            seen.add((tensor.name, dst))
            if tensor.op.type == "VarHandleOp":  # a remote read moves the variable's value
                shape = [d.size for d in tensor.op.get_attr("shape").dim]
                itemsize = tensor.op.get_attr("dtype").size
            else:
                shape = tensor.shape.as_list() if tensor.shape.rank is not None else [None]
                itemsize = tensor.dtype.size or 8
            size = itemsize
            for d in shape:
                size *= batch if d is None else d
            out.append({"tensor": tensor.name, "from": src, "to": dst, "bytes": size,
                        "per_example": None in shape})
    return out


def run_training(cluster: CourseCluster | None, fn_name: str, *args: Any,
                 timeout: float = 60.0, **kwargs: Any) -> list[Any]:
    """``cluster.call(fn_name, ...)`` for a TF training loop; a timeout says what to check.

    The course's step guard (in the ``hooks`` every worker passes to its session) stops a loop
    that runs too long with a message about ``global_step``; if that never fired, the loop did
    not use the hooks at all (or never called ``sess.run``), and this timeout says so, names
    each rank's line, and interrupts the loops (SIGINT, as Ctrl-C would) so that the next cell
    finds the engines free.
    """
    cc = cluster or current()
    try:
        return cc.call(fn_name, *args, timeout=timeout, **kwargs)
    except ClusterTimeout as err:
        _timed_out(cc, fn_name, timeout, err)
    except Exception:
        # a worker raised while another still waits (for the chief, for a step): free it
        if not cc.ping(timeout=1.0):
            interrupt_loops(cc)
        raise


def _timed_out(cc: CourseCluster, fn_name: str, timeout: float, err: ClusterTimeout) -> NoReturn:
    """Raise the TFTimeout that names each rank's line, after interrupting the loops."""
    lines = "; ".join(f"rank {r}: {at}" for r, at in sorted(cc.where().items()))
    freed = interrupt_loops(cc)
    raise TFTimeout(
        f"{fn_name}() did not return within {timeout:g} s on every worker, and the course's "
        "step guard never fired: the session did not get the hooks (so neither "
        "StopAtStepHook nor the guard could stop it), the loop never called sess.run, or "
        f"a worker waits for a task that is gone ({_still_running(err.cause)}"
        + (f"; {lines}" if lines else "") + "). "
        + ("The course interrupted the loops: the engines are free again."
           if freed else "The engines are still busy."),
        "pass hooks=[StopAtStepHook(last_step=steps), *hooks] to MonitoredTrainingSession "
        "and run t['train_op'] in every pass of `while not sess.should_stop()`"
        + ("" if freed else "; then run tf_dist.stop_servers(cluster) and re-run the "
           "notebook from the servers' cells"),
    ) from None


def interrupt_loops(cluster: CourseCluster, wait: float = 15.0) -> bool:
    """*In the kernel.* Send SIGINT to every rank's engine (a ``KeyboardInterrupt`` in the
    Python code it runs, as Ctrl-C would) and wait up to ``wait`` s for the engines to answer
    again. True when they do; a call stuck inside C code that never returns stays stuck."""
    import signal

    try:
        cluster.client.send_signal(signal.SIGINT, targets=cluster.ranks.engine_ids, block=True)
    except Exception:
        return False
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if cluster.ping(timeout=2.0):
            return True
    return False


def _still_running(cause: str) -> str:
    found = re.search(r"still running on ranks \[[^\]]*\]", cause)
    return found.group(0) if found else "some ranks did not answer"
