"""Engine-side probes behind the graded tests of ``04_tf_classic_ps``.

They inspect the servers the learner started and the graph the learner builds, and return plain
data for the test cells' asserts. Teaching helpers live in :mod:`course_utils.tf_dist`.
"""

from __future__ import annotations

from typing import Any

from ..cluster.engines.engine import px_name

#: What later cells of unit 4 read from the dict ``build_graph`` returns.
GRAPH_KEYS = ("x", "y_", "W", "b", "logits", "loss", "accuracy", "global_step", "train_op")


def engine_tf_servers() -> dict[str, dict[str, Any]]:
    """The servers this engine registered: ``{"ps:0": {"job", "task", "port", "inter_op"}}``,
    read from each server's own definition (so a server started for the wrong task shows);
    ``inter_op``: the size of its inter-op pool (0: TensorFlow's default)."""
    from ..tf_dist.servers import registered_servers

    out = {}
    for name, server in sorted(registered_servers().items()):
        sd = server.server_def
        port = int(server.target.rsplit(":", 1)[-1])
        out[name] = {"job": sd.job_name, "task": int(sd.task_index), "port": port,
                     "inter_op": int(sd.default_session_config.inter_op_parallelism_threads)}
    return out


def engine_tf_one_step() -> float:
    """One SGD step (lr 0.1) on ``(w - 3)^2`` with ``w`` on the ps, run through this engine's
    worker server; returns ``w`` after the step (0.6). Needs ``tf_cluster``, ``tf_servers``
    and ``worker_index`` in the ``%%px`` namespace. Also ``course doctor``'s and unit 6's
    check that a step crosses the tasks."""
    import __main__

    from ..tf_dist import quiet_tensorflow, session_config

    tf = quiet_tensorflow()
    ns = vars(__main__)
    spec = ns["tf_cluster"]
    wi = ns["worker_index"]
    graph = tf.Graph()
    with graph.as_default():
        setter = tf.compat.v1.train.replica_device_setter(
            worker_device=f"/job:worker/task:{wi}", cluster=tf.train.ClusterSpec(spec))
        with tf.compat.v1.device(setter):
            w = tf.compat.v1.get_variable("doctor_w", [],
                                          initializer=tf.compat.v1.zeros_initializer())
            loss = tf.square(w - 3.0)
            step = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        with tf.compat.v1.Session(ns["tf_servers"][f"worker:{wi}"].target,
                                  config=session_config(wi, spec)) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(step)
            return float(sess.run(w))


def engine_tf_one_step_within(seconds: float = 20.0) -> dict[str, Any]:
    """:func:`engine_tf_one_step` in a thread of its own, waited for ``seconds``: ``{"w": ...}``,
    ``{"error": ...}``, or ``{"stuck": True}`` when no answer came (a server made with
    ``start=False`` accepts connections but never answers). The engine stays free either way:
    a step stuck inside TensorFlow cannot be interrupted, so it is left to its thread, which
    goes with the engine when the servers are stopped. Used by ``04_tf_classic_ps``'s test."""
    import threading

    out: dict[str, Any] = {}

    def step() -> None:
        try:
            out["w"] = engine_tf_one_step()
        except Exception as exc:  # noqa: BLE001  # said in the test's message
            out["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"

    worker = threading.Thread(target=step, name="course-tf-one-step", daemon=True)
    worker.start()
    worker.join(seconds)
    return out if not worker.is_alive() else {"stuck": True}


def engine_check_train_graph(fn_name: str = "build_graph",
                             keys: tuple[str, ...] = GRAPH_KEYS) -> dict[str, Any]:
    """Build this worker's graph with the ``%%px`` function ``fn_name(worker_index)`` and report
    the error building it raised (``None`` if none), the keys its dict lacks and whether running
    ``train_op`` advances ``global_step`` (an assign-add on the ``global_step`` variable among
    ``train_op``'s inputs)."""
    import __main__

    ns = vars(__main__)
    fn = px_name(fn_name, to_call=True)
    try:
        graph, t, _hooks = fn(ns["worker_index"])
    except Exception as exc:  # the learner's graph code: report it, the test names the fix
        return {"error": _short(exc), "error_fix": build_fix(exc), "missing": list(keys),
                "advances_global_step": None, "graph_ops": 0}
    missing = [k for k in keys if k not in t]
    advances = None
    if "train_op" in t and "global_step" in t:
        advances = _advances(t["train_op"], t["global_step"])
    return {"error": None, "error_fix": "", "missing": missing, "advances_global_step": advances,
            "graph_ops": len(graph.get_operations())}


def build_fix(exc: BaseException) -> str:
    """The fix for an error raised while building unit 4's graph."""
    text = str(exc)
    if isinstance(exc, NotImplementedError):
        return "complete build_graph: replace the raise NotImplementedError by your code"
    if "labels" in text or "logits" in text:
        return ("TensorFlow takes the labels first: call tf.nn.sparse_softmax_cross_entropy_with_"
                "logits(labels=y_, logits=logits) with keywords (the reverse of PyTorch's "
                "F.cross_entropy(input, target))")
    return "fix the line the error names, then re-run the build_graph cell"


def _short(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()] or [""]
    return f"{type(exc).__name__}: {lines[0][:240]}"


def _advances(train_op: Any, global_step: Any) -> bool:
    target = getattr(global_step, "op", global_step)
    handle = getattr(global_step, "handle", None)
    handle_op = getattr(handle, "op", target)
    start = getattr(train_op, "op", train_op)
    seen, todo = set(), [start]
    while todo:
        op = todo.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        if op.type in ("AssignAddVariableOp", "AssignAdd") and op.inputs and \
                op.inputs[0].op.name in (target.name, handle_op.name):
            return True
        todo.extend(i.op for i in op.inputs)
        todo.extend(op.control_inputs)
    return False


def reference_batch(n: int = 16, seed: int = 0) -> dict[str, Any]:
    """A fixed batch and fixed weights for unit 4's graph (64 inputs, 10 classes), with the loss
    and accuracy NumPy computes for them: the labels are the argmax of the logits for the first
    half of the batch and another class for the rest, so the accuracy is exactly 0.5."""
    import numpy as np

    rng = np.random.default_rng(seed)
    w = (rng.normal(size=(64, 10)) * 0.3).astype(np.float32)
    b = (rng.normal(size=10) * 0.3).astype(np.float32)
    x = rng.random((n, 64)).astype(np.float32)
    z = (x @ w + b).astype(np.float64)
    best = z.argmax(1)
    y = np.where(np.arange(n) < n // 2, best, (best + 1 + rng.integers(0, 9, n)) % 10)
    logp = z - z.max(1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(1, keepdims=True))
    ce = -logp[np.arange(n), y]
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    logq = p - np.log(np.exp(p).sum(1, keepdims=True))   # CE taken on softmax(logits)
    return {"W": w, "b": b, "x": x, "y": y.astype(np.int64), "loss": float(ce.mean()),
            "loss_sum": float(ce.sum()), "loss_on_softmax": float(-logq[np.arange(n), y].mean()),
            "accuracy": float((best == y).mean())}


def _loss_fix(got: float, ref: dict[str, Any]) -> str:
    def near(a: float, b: float) -> bool:
        return abs(a - b) <= 1e-4 * max(1.0, abs(b))

    if near(got, ref["loss_sum"]):
        return ("take the mean over the batch, tf.reduce_mean(...), not tf.reduce_sum: a sum "
                "makes every step 64 times larger")
    if near(got, ref["loss_on_softmax"]):
        return ("pass the logits themselves, logits=logits: sparse_softmax_cross_entropy_with_"
                "logits applies the softmax itself")
    return ("loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y_, "
            "logits=logits)), with logits = x @ W + b")


def engine_graph_values(fn_name: str = "build_graph") -> dict[str, Any]:
    """Build unit 4's graph with the ``%%px`` function ``fn_name(worker_index)``, note the
    largest initial value of ``W`` and ``b`` (``start``), set them to the fixed values of
    :func:`reference_batch`, and return the ``loss`` and ``accuracy`` it computes on that batch
    next to NumPy's, with the fix for each that differs. Runs in a local session on a copy of
    the graph with its devices cleared: it touches no server and no variable on the ps."""
    import __main__

    from ..tf_dist import quiet_tensorflow

    tf = quiet_tensorflow()
    ns = vars(__main__)
    graph, t, _hooks = ns[fn_name](ns["worker_index"])
    ref = reference_batch()
    with graph.as_default():
        meta = tf.compat.v1.train.export_meta_graph(clear_devices=True)
    copy = tf.Graph()
    with copy.as_default():
        tf.compat.v1.train.import_meta_graph(meta)
        by_name = {v.op.name: v for v in tf.compat.v1.global_variables()}
        wanted = {k: by_name.get(getattr(t[k], "op", t[k]).name) for k in ("W", "b")}
        if any(v is None for v in wanted.values()):
            raise TypeError("W and b must be variables: create them with "
                            "tf.compat.v1.get_variable (see the hint)")
        tensor = {k: copy.get_tensor_by_name(t[k].name) for k in ("x", "y_", "loss", "accuracy")}
        with tf.compat.v1.Session(graph=copy) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            start = {k: float(abs(var.eval(sess)).max()) for k, var in wanted.items()}
            for k, var in wanted.items():
                var.load(ref[k], sess)
            loss, acc = sess.run([tensor["loss"], tensor["accuracy"]],
                                 {tensor["x"]: ref["x"], tensor["y_"]: ref["y"]})
    return {"loss": float(loss), "want_loss": ref["loss"], "loss_fix": _loss_fix(float(loss), ref),
            "accuracy": float(acc), "want_accuracy": ref["accuracy"], "start": start}


#: Op types ``SyncReplicasOptimizer`` adds to a graph (one accumulator per variable).
ACCUMULATORS = ("ConditionalAccumulator", "ResourceConditionalAccumulator")


def engine_graph_sync(fn_name: str = "build_graph", workers: int = 3) -> dict[str, Any]:
    """Build unit 4's graph with ``sync=False`` and ``sync=True`` for the last worker of a
    cluster of ``workers`` workers (``tf_cluster`` is swapped for such a spec while building,
    then restored: building a graph contacts no server). For each mode: the gradient
    accumulators, the ``replicas_to_aggregate`` they wait for, the hooks returned, and the
    devices of ``loss`` and ``W``; and ``chief``: per worker, the ``is_chief`` of its sync
    hooks."""
    import __main__

    ns = vars(__main__)
    real = ns["tf_cluster"]
    spec = {"ps": list(real["ps"]), "worker": [f"127.0.0.1:{1 + i}" for i in range(workers)]}
    out: dict[str, Any] = {"workers": workers}
    ns["tf_cluster"] = spec
    try:
        for sync in (False, True):
            graph, t, hooks = ns[fn_name](workers - 1, sync)
            ops = graph.get_operations()
            required = sorted({int(op.inputs[1].op.get_attr("value").int_val[0]) for op in ops
                               if op.type.endswith("AccumulatorTakeGradient")
                               and op.inputs[1].op.type == "Const"})
            out["sync" if sync else "async"] = {
                "accumulators": sum(op.type in ACCUMULATORS for op in ops),
                "replicas_to_aggregate": required,
                "hooks": [type(h).__name__ for h in hooks],
                "loss": t["loss"].device, "W": t["W"].device}
        # which worker's sync hook acts as the chief (the hook keeps is_chief as _is_chief)
        out["chief"] = [[getattr(h, "_is_chief", None) for h in ns[fn_name](w, True)[2]
                         if hasattr(h, "_is_chief")] for w in range(workers)]
    finally:
        ns["tf_cluster"] = real
    return out
