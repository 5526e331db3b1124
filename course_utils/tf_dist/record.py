"""Recorders for the TensorFlow track's figures (units 4 and 5); they return plain data.

Unit 4 (on the engines): :func:`engine_record_ps` runs the learner's own ``train`` with the
learner's own ``build_graph`` and records, for every step of this worker, when it ran, the
``global_step`` just before it read the variables and just after its update (staleness), and
which tensors the graph sends between tasks (bytes per step, per ps shard).
:func:`engine_placement` lists where the key ops of a graph were placed and the bytes that cross
tasks, for the placement diagram. In the kernel, :func:`record_ps` (async then sync, each from a
cleared ps) and :func:`placement` call them; unit 4 draws their results.

Unit 5 (in the kernel, where the coordinator runs): :func:`timed` wraps a scheduled
``tf.function`` so each closure reports its worker, start and end; the coordinator's failure
handling (a worker failed, a closure put back) is timestamped by
:func:`~course_utils.tf_dist.watch_coordinator` (``seen.events``; :func:`record_coordinator`
yields just those).

TensorFlow is imported only inside the functions.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..cluster.engines.engine import px_name
from .coordinator import watch_coordinator
from .graph_v1 import task_of

if TYPE_CHECKING:
    from ..cluster import CourseCluster


# ---- unit 4: per-step staleness, timing and traffic ----------------------------------------
def _step_hook(global_step: Any, after: Any, local_step: Any, ready: tuple[Any, Any],
               workers: int,
               timeout: float = 60.0) -> Any:
    """A SessionRunHook that lines the workers up after their first step, times every step and
    reads, in its own small run just before the step (before the step reads the variables),
    ``global_step`` (the version this step reads) and, with ``SyncReplicasOptimizer``, the
    worker's ``local_step`` (the round its gradient is tagged for); then ``after``, a read of
    ``global_step`` that waits for the train op."""
    import tensorflow as tf

    class StepRecorder(tf.compat.v1.train.SessionRunHook):
        def __init__(self) -> None:
            self.rows: list[dict[str, Any]] = []
            self._pending: dict[str, Any] = {}

        def before_run(self, run_context: Any) -> Any:
            fetch = [global_step] + ([local_step] if local_step is not None else [])
            got = run_context.session.run(fetch)
            self._pending = {"gs_before": float(got[0]), "start": time.time()}
            if local_step is not None:
                self._pending["tag"] = float(got[1])
            return tf.compat.v1.train.SessionRunArgs(after)

        def after_run(self, run_context: Any, run_values: Any) -> None:
            row = dict(self._pending, end=time.time(), gs_after=float(run_values.results),
                       first=not self.rows)
            row.update(step_staleness(row))
            self.rows.append(row)
            if row["first"]:
                # A start line after each worker's first step, which sets the graph up on every
                # task (up to a second here): without it worker 0 runs most steps alone.
                arrive, count = ready
                run_context.session.run(arrive)
                deadline = time.monotonic() + timeout
                while run_context.session.run(count) < workers and time.monotonic() < deadline:
                    time.sleep(0.01)

    return StepRecorder()


def step_staleness(row: dict[str, Any]) -> dict[str, Any]:
    """Staleness of one recorded step: the version its update was applied to minus the version
    it read. Async: ``gs_after - 1 - gs_before`` (updates by others in between). Sync: the round
    its gradient is tagged for minus the version it read: 0, or negative for a gradient that
    ``SyncReplicasOptimizer`` drops as stale (it never reaches the variables)."""
    if "tag" in row:
        stale = row["tag"] - row["gs_before"]
        return {"staleness": 0.0 if stale >= 0 else stale, "dropped": stale < 0}
    return {"staleness": row["gs_after"] - 1 - row["gs_before"], "dropped": False}


def _needed_ops(targets: list[Any]) -> list[Any]:
    """Every op a run of ``targets`` executes (inputs and control inputs, transitively)."""
    seen: dict[str, Any] = {}
    todo = [t.op if hasattr(t, "op") else t for t in targets]
    while todo:
        op = todo.pop()
        if op.name in seen:
            continue
        seen[op.name] = op
        todo += [x.op for x in op.inputs] + list(op.control_inputs)
    return list(seen.values())


def _task(op: Any, memo: dict[str, str]) -> str:
    """The task an op runs on: its device, else (as TensorFlow's placer does for a variable
    read) the task of the resource it reads, else of its first placed input."""
    if op.name in memo:
        return memo[op.name]
    memo[op.name] = ""  # cycles (none in a training graph) resolve to unplaced
    task = task_of(op.device)
    if not task:
        inputs = list(op.inputs)
        resources = [x for x in inputs if x.dtype.name == "resource"]
        for x in resources + inputs:
            task = _task(x.op, memo)
            if task:
                break
    memo[op.name] = task
    return task


def step_traffic(targets: list[Any], batch: int) -> list[dict[str, Any]]:
    """Every tensor that running ``targets`` (e.g. ``train_op``) once sends from one task to
    another: tensor, from, to, bytes for a batch of ``batch`` (unknown dimensions are the
    batch) and ``per_example``. Only the ops the run executes count, and an unplaced variable
    read runs where its variable lives, so a read of ``W`` on the ps moves ``W``'s value."""
    memo: dict[str, str] = {}
    out: list[dict[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    for op in _needed_ops(targets):
        dst = _task(op, memo)
        for tensor in op.inputs:
            src = _task(tensor.op, memo)
            if not src or not dst or src == dst or tensor.dtype.name == "resource":
                continue
            if (tensor.name, dst) in seen:
                continue
            seen.add((tensor.name, dst))
            shape = tensor.shape.as_list() if tensor.shape.rank is not None else [None]
            size = tensor.dtype.size or 8
            for d in shape:
                size *= batch if d is None else d
            out.append({"tensor": tensor.name, "from": src, "to": dst, "bytes": int(size),
                        "per_example": None in shape})
    return out


def engine_record_ps(steps: int = 40, sync: bool = False, batch: int = 64,
                     train_name: str = "train", build_name: str = "build_graph"
                     ) -> dict[str, Any] | None:
    """*All ranks.* Run the ``%%px`` function ``train_name(steps, sync=sync)`` (unit 4's
    training loop) while recording each step of this worker; ``None`` on a rank without a
    worker.

    The learner's ``build_name(worker_index, sync)`` is wrapped for the call: its graph gets a
    read of ``global_step`` that waits for ``train_op`` and a start-line counter on ``ps:0``,
    and its hooks get a step recorder, so ``train`` must pass the hooks ``build_graph`` returns
    to its session (the exercise does). Returns ``steps`` (start/end wall time, ``gs_before``,
    ``gs_after``, ``staleness``, ``dropped``; see :func:`step_staleness`), ``traffic`` (every
    tensor one training step sends between tasks, from the graph, for a batch of ``batch``),
    ``variables`` (name, task, bytes) and ``train``'s own result.
    """
    import __main__

    ns = vars(__main__)
    if ns.get("worker_index") is None:
        return None
    for name in (train_name, build_name):
        px_name(name, to_call=True)
    import tensorflow as tf

    build = ns[build_name]
    workers = len(ns["tf_cluster"]["worker"])
    seen: dict[str, Any] = {}

    def recorded_build(worker_index: int, sync: bool = False) -> Any:
        graph, t, hooks = build(worker_index, sync)
        with graph.as_default():
            gs = t["global_step"]
            with tf.control_dependencies([t["train_op"]]):
                after = tf.identity(gs.read_value() if hasattr(gs, "read_value") else gs)
            with tf.compat.v1.device("/job:ps/task:0"):
                ready = tf.compat.v1.get_variable(
                    "course_record_ready", [], tf.int32, trainable=False,
                    initializer=tf.compat.v1.zeros_initializer())
                ready_ops = (ready.assign_add(1), ready.read_value())
            local = [v for v in graph.get_collection(tf.compat.v1.GraphKeys.LOCAL_VARIABLES)
                     if "sync_rep_local_step" in v.op.name]
        hook = _step_hook(gs, after, local[0] if local else None, ready_ops, workers)
        seen.update(graph=graph, hook=hook, targets=[t["train_op"]])
        return graph, t, [*list(hooks), hook]

    ns[build_name] = recorded_build
    try:
        result = ns[train_name](steps, sync=sync)
    finally:
        ns[build_name] = build
    if "hook" not in seen or not seen["hook"].rows:
        raise RuntimeError(f"{train_name}() recorded no step: pass the hooks {build_name}() "
                           "returns to MonitoredTrainingSession(hooks=...)")
    graph = seen["graph"]
    variables = [{"name": v.op.name, "task": task_of(v.device),
                  "bytes": int(v.shape.num_elements() or 0) * v.dtype.size}
                 for v in graph.get_collection("variables")
                 if not v.op.name.startswith("course_record")]
    traffic = step_traffic(seen["targets"], batch)
    return {"worker": int(ns["worker_index"]), "sync": bool(sync), "steps": seen["hook"].rows,
            "traffic": traffic, "variables": variables, "batch": int(batch), "result": result}


def record_ps(cluster: CourseCluster | None = None, steps: int = 60,
              modes: Sequence[tuple[str, bool]] = (("async", False), ("sync", True)),
              timeout: float = 120.0) -> dict[str, list[dict[str, Any]]]:
    """*In the kernel* (unit 4): for each ``(mode, sync)``, clear the ps (``restart_ps``), then
    run the engines' ``train(steps, sync)`` under :func:`engine_record_ps`. Returns
    ``{"async": [one record per worker], "sync": [...]}`` for :mod:`course_utils.viz.ps`."""
    from ..cluster import current
    from .servers import restart_ps

    cc = cluster or current()
    out: dict[str, list[dict[str, Any]]] = {}
    for mode, sync in modes:
        restart_ps(cc)
        out[mode] = [r for r in cc.run(engine_record_ps, steps, sync, timeout=timeout) if r]
    return out


def placement(cluster: CourseCluster | None, graph_fns: Sequence[tuple[str, str]],
              timeout: float = 60.0) -> dict[str, Any]:
    """*In the kernel* (unit 4): :func:`engine_placement` on every rank, and the record of the
    highest worker index (the original program pins its compute to worker 0, so the last
    worker shows what crosses the network), for ``viz.placement_diagram``."""
    from ..cluster import current

    cc = cluster or current()
    recs = [r for r in cc.run(engine_placement, list(graph_fns), timeout=timeout) if r]
    if not recs:
        raise RuntimeError("no rank hosts a worker: start the servers first")
    return max(recs, key=lambda r: r["worker"])


def _train_targets(graph: Any, made: Any) -> list[Any]:
    """The op(s) one training step runs: ``t["train_op"]`` when the builder returned its dict,
    else the graph's sinks that apply updates (a ``minimize`` NoOp, an apply op)."""
    for item in made if isinstance(made, tuple) else ():
        if isinstance(item, dict) and "train_op" in item:
            return [item["train_op"]]
    consumed = {x.op.name for op in graph.get_operations() for x in op.inputs}
    consumed |= {c.name for op in graph.get_operations() for c in op.control_inputs}
    skip = ("init", "save", "report_uninitialized")
    return [op for op in graph.get_operations()
            if op.name not in consumed and not op.name.startswith(skip)
            and (op.type == "NoOp" or "Apply" in op.type)]


def engine_placement(graph_fns: dict[str, str] | list[tuple[str, str]], batch: int = 64
                     ) -> dict[str, Any] | None:
    """*All ranks.* For each ``(label, name)`` of a ``%%px`` function that builds a graph
    (returning it, or a tuple starting with it), called with this rank's ``worker_index`` if it
    takes an argument: on which task each op of one training step runs (counted by role:
    inputs, variables, forward, loss, gradients, update) and which tensors that step sends
    between tasks (:func:`step_traffic`). ``None`` on a rank without a worker. Unit 4."""
    import inspect

    import __main__

    ns = vars(__main__)
    if ns.get("worker_index") is None:
        return None
    # A list keeps the order (the figure draws them left to right; dicts may arrive sorted).
    pairs = list(graph_fns.items()) if isinstance(graph_fns, dict) else list(graph_fns)
    out: dict[str, Any] = {}
    for label, name in pairs:
        fn = px_name(name, to_call=True)
        takes = len(inspect.signature(fn).parameters) > 0
        made = fn(ns["worker_index"]) if takes else fn()
        graph = made[0] if isinstance(made, tuple) else made
        targets = _train_targets(graph, made)
        memo: dict[str, str] = {}
        ops_by_task: dict[str, list[Any]] = {}
        for op in _needed_ops(targets):
            ops_by_task.setdefault(_task(op, memo) or "(anywhere)", []).append(op)
        out[label] = {"ops": {k: _roles(v) for k, v in ops_by_task.items()},
                      "traffic": step_traffic(targets, batch)}
    return {"worker": int(ns["worker_index"]), "batch": int(batch), "graphs": out,
            "order": [label for label, _ in pairs]}


#: Op types, grouped into what a learner recognises in a placement diagram.
_ROLE_OF = {
    "VarHandleOp": "variables", "VariableV2": "variables", "ReadVariableOp": "variables",
    "Placeholder": "inputs",
    "MatMul": "forward", "BiasAdd": "forward", "AddV2": "forward", "Add": "forward",
    "Softmax": "forward", "Log": "loss", "Mean": "loss", "Neg": "loss", "Mul": "loss",
    "SparseSoftmaxCrossEntropyWithLogits": "loss", "Sum": "loss",
    "ResourceApplyGradientDescent": "update", "ApplyGradientDescent": "update",
    "AssignAddVariableOp": "update", "ConditionalAccumulator": "update",
    "ResourceAccumulatorApplyGradient": "update", "AccumulatorApplyGradient": "update",
}


def _role(op: Any) -> str:
    """What an op does in a training step, for the placement diagram."""
    name, kind = op.name, op.type
    if kind in ("VarHandleOp", "VariableV2", "ReadVariableOp", "Placeholder"):
        return _ROLE_OF[kind]
    if "Apply" in kind or "Accumulator" in kind or name.startswith(("GradientDescent",
                                                                    "sync_replicas")):
        return "update"
    if name.startswith("gradients"):
        return "gradients"
    return _ROLE_OF.get(kind, "other")


def _roles(ops: list[Any]) -> dict[str, int]:
    roles: dict[str, int] = {}
    for op in ops:
        role = _role(op)
        roles[role] = roles.get(role, 0) + 1
    return roles


# ---- unit 5: closures on the coordinator ---------------------------------------------------
def timed(step_fn: Any) -> Any:
    """Wrap a scheduled ``tf.function`` ``step_fn(*args)`` so each closure returns
    ``{"out": ..., "worker": index, "start": s, "end": s, "closure": id}``: its worker and its
    wall-clock span measured *on the worker*. Schedule it with the closure's id as the last
    argument: ``coordinator.schedule(timed_fn, args=(iterator, tf.constant(i)))``. Unit 5."""
    import tensorflow as tf

    @tf.function
    def run(*args: Any) -> Any:
        *rest, closure = args
        start = tf.timestamp()
        with tf.control_dependencies([start]):
            out = step_fn(*rest)
        with tf.control_dependencies(tf.nest.flatten(out)):
            end = tf.timestamp()
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        return {"out": out, "worker": worker, "start": start, "end": end, "closure": closure}

    return run


@contextlib.contextmanager
def record_coordinator() -> Iterator[list[dict[str, Any]]]:
    """Timestamp what a ``ClusterCoordinator`` does about failures (unit 5): the ``events``
    of :func:`~course_utils.tf_dist.watch_coordinator` (the one reader of its log), as a list
    of ``{"time": s, "event": "failed"|"put_back"|"recovering"|"recovered", "worker": index}``.
    """
    with watch_coordinator() as seen:
        yield seen.events


def closure_rows(results: list[Any], scheduled_at: list[float]) -> list[dict[str, Any]]:
    """Plain rows from fetched :func:`timed` results: closure, worker, scheduled, start, end
    (``None`` values for closures that never returned)."""
    rows = []
    for i, res in enumerate(results):
        if res is None:
            rows.append({"closure": i, "worker": None, "scheduled": scheduled_at[i],
                         "start": None, "end": None})
            continue
        rows.append({"closure": int(res["closure"]), "worker": int(res["worker"]),
                     "scheduled": scheduled_at[i], "start": float(res["start"]),
                     "end": float(res["end"])})
    return rows


def fetch_all(remote_values: list[Any], fetch: Callable[[Any], Any] | None = None
              ) -> list[Any]:
    """``RemoteValue.fetch()`` of each, ``None`` for one that failed."""
    out = []
    for rv in remote_values:
        try:
            out.append(fetch(rv) if fetch else rv.fetch())
        except Exception:
            out.append(None)
    return out
