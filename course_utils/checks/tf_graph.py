"""Engine-side probes behind the graded tests of ``04_tf_classic_ps``.

They inspect the servers the learner started and the graph the learner builds, and return plain
data for the test cells' asserts. Teaching helpers live in :mod:`course_utils.tf_dist`.
"""

from __future__ import annotations

from typing import Any

#: What later cells of unit 4 read from the dict ``build_graph`` returns.
GRAPH_KEYS = ("x", "y_", "W", "b", "logits", "loss", "accuracy", "global_step", "train_op")


def engine_tf_servers() -> dict[str, dict[str, Any]]:
    """The servers this engine registered: ``{"ps:0": {"job", "task", "port"}}``, read from
    each server's own definition (so a server started for the wrong task shows)."""
    from ..tf_dist.servers import registered_servers

    out = {}
    for name, server in sorted(registered_servers().items()):
        sd = server.server_def
        port = int(server.target.rsplit(":", 1)[-1])
        out[name] = {"job": sd.job_name, "task": int(sd.task_index), "port": port}
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


def engine_check_train_graph(fn_name: str = "build_graph",
                             keys: tuple[str, ...] = GRAPH_KEYS) -> dict[str, Any]:
    """Build this worker's graph with the ``%%px`` function ``fn_name(worker_index)`` and report
    the keys its dict lacks and whether running ``train_op`` advances ``global_step`` (an
    assign-add on the ``global_step`` variable among ``train_op``'s inputs)."""
    import __main__

    ns = vars(__main__)
    fn = ns.get(fn_name)
    if fn is None:
        raise NameError(f"{fn_name!r} is not defined on this engine: run the %%px cell first")
    graph, t, _hooks = fn(ns["worker_index"])
    missing = [k for k in keys if k not in t]
    advances = None
    if "train_op" in t and "global_step" in t:
        advances = _advances(t["train_op"], t["global_step"])
    return {"missing": missing, "advances_global_step": advances,
            "graph_ops": len(graph.get_operations())}


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
