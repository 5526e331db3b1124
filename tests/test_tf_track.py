"""Units 4-5 beyond nbval: the pictures of the learner's TF cluster, the shard table, the step
guard and the graph probe behind unit 4's exercise 2. None needs a cluster.

The learners' typical mistakes in units 4-5 (the original program's loss on the ps, a missing
``global_step``, a spec indexed by task, one shard, no update, ...) live in the mistakes
catalogue, ``tests/mistakes/u04_*.py`` and ``u05_*.py``, run by ``tests/test_mistakes.py``.
"""

from __future__ import annotations

import sys
import time
from types import SimpleNamespace

import matplotlib
import pytest

matplotlib.use("Agg")

from course_utils import checks, tf_dist, viz  # noqa: E402

ROLES_4 = {"ps": [0], "worker": [0, 1]}
SPEC_4 = {"ps": ["127.0.0.1:2223"], "worker": ["127.0.0.1:2222", "127.0.0.1:2224"]}
ROLES_5 = {"ps": [0, 0], "worker": [0, 1]}


def _texts(fig):
    return [t.get_text() for ax in fig.axes for t in ax.texts]


# ---- pictures (pure) -----------------------------------------------------------------------
def test_ps_cluster_draws_every_task_on_its_rank_with_its_address():
    import matplotlib.pyplot as plt

    fig = viz.ps_cluster(ROLES_4, SPEC_4, hosts=["a", "b"])
    texts = "\n".join(_texts(fig))
    for job, addresses in SPEC_4.items():
        for i, addr in enumerate(addresses):
            assert f"{job}:{i}" in texts and addr in texts
    assert "(chief)" in texts and "engine on b" in texts
    arrows = [p for p in fig.axes[0].patches if type(p).__name__ == "FancyArrowPatch"]
    assert len(arrows) == 2 * len(ROLES_4["worker"]) * len(ROLES_4["ps"])  # a pull and a push
    plt.close(fig)
    plt.close(viz.ps_cluster({"ps": [0, 0], "worker": [0, 1, 2, 3]}))  # without addresses
    with pytest.raises(ValueError):
        viz.ps_cluster({"ps": [], "worker": [0]})


def test_ps_vs_all_reduce_has_both_panels_for_the_same_ranks():
    import matplotlib.pyplot as plt

    for n in (1, 2, 4):
        roles = tf_dist.plan_roles(n, num_ps=1)
        fig = viz.ps_vs_all_reduce(roles, n)
        assert len(fig.axes) == 2
        ring = "\n".join(t.get_text() for t in fig.axes[1].texts)
        assert all(f"rank {r}\n" in ring for r in range(n))
        plt.close(fig)


def test_coordinator_queue_lists_each_shard_on_its_ps():
    import matplotlib.pyplot as plt

    shards = [{"var": "W1", "ps": 0, "rows": (0, 32), "shape": (32, 32), "bytes": 4096,
               "split": True},
              {"var": "W1", "ps": 1, "rows": (32, 64), "shape": (32, 32), "bytes": 4096,
               "split": True},
              {"var": "b1", "ps": 0, "rows": (0, 32), "shape": (32,), "bytes": 128,
               "split": False}]
    fig = viz.coordinator_queue(ROLES_5, shards, {"scheduled": 300, "done": 40})
    texts = "\n".join(_texts(fig))
    assert "W1 rows 0-31" in texts and "W1 rows 32-63" in texts and "b1 whole" in texts
    assert "260 of 300" in texts and "worker:1" in texts and "ps:1" in texts
    plt.close(fig)
    plt.close(viz.coordinator_queue(ROLES_5, shards))  # no queue snapshot
    with pytest.raises(ValueError, match="ps:3"):
        viz.coordinator_queue(ROLES_5, [{**shards[0], "ps": 3}])


def test_variable_shards_reads_rows_and_ps_from_shape_and_device():
    f32 = SimpleNamespace(size=4)
    part = [SimpleNamespace(shape=(32, 32), dtype=f32, device=f"/job:ps/replica:0/task:{i}"
                            "/device:CPU:0") for i in (1, 0)]
    sharded = SimpleNamespace(variables=part)
    whole = SimpleNamespace(shape=(10,), dtype=f32, device="/job:ps/replica:0/task:1/device:CPU:0")
    got = tf_dist.variable_shards({"W": sharded, "b": whole})
    assert [(s["var"], s["ps"], s["rows"], s["bytes"], s["split"]) for s in got] == [
        ("W", 1, (0, 32), 4096, True), ("W", 0, (32, 64), 4096, True),
        ("b", 1, (0, 10), 40, False)]
    with pytest.raises(ValueError, match="strategy.scope"):
        tf_dist.variable_shards({"x": SimpleNamespace(shape=(1,), dtype=f32, device="")})


# ---- the step guard and the graph probe (real TensorFlow, in this process) ------------------
def test_guard_message_says_what_advanced_and_which_hook():
    cause, fix = tf_dist.guard_message(1, 5000, 0, 0, 200, 30.2)
    assert "stayed at 0" in cause and "global_step=global_step" in fix
    cause, fix = tf_dist.guard_message(0, 900, 0, 450, 200, 30.0)
    assert "StopAtStepHook(last_step=200) should have stopped" in cause and "should_stop" in fix
    cause, _ = tf_dist.guard_message(None, 10, 3, 9, 200, 31.0)
    assert "from 3 to 9" in cause and "too slowly" in cause


def _graph(with_global_step: bool):
    tf = tf_dist.quiet_tensorflow()
    graph = tf.Graph()
    with graph.as_default():
        w = tf.compat.v1.get_variable("w", [], initializer=tf.compat.v1.zeros_initializer())
        global_step = tf.compat.v1.train.get_or_create_global_step()
        loss = tf.square(w - 3.0)
        opt = tf.compat.v1.train.GradientDescentOptimizer(0.1)
        train_op = opt.minimize(loss, global_step=global_step if with_global_step else None)
    return graph, {"w": w, "loss": loss, "global_step": global_step, "train_op": train_op}


def test_step_guard_stops_a_loop_whose_global_step_never_moves():
    tf = tf_dist.quiet_tensorflow()
    graph, t = _graph(with_global_step=False)
    with graph.as_default():
        guard = tf_dist.step_guard(t["global_step"], last_step=5, limit_s=0.5, worker=0)
        stop = tf.compat.v1.train.StopAtStepHook(last_step=5)
        t0 = time.monotonic()
        with pytest.raises(tf_dist.TFTimeout) as err:
            with tf.compat.v1.train.MonitoredSession(hooks=[stop, guard]) as sess:
                while not sess.should_stop():
                    sess.run(t["train_op"])
    assert time.monotonic() - t0 < 20
    assert "global_step stayed at 0" in err.value.cause and "StopAtStepHook(last_step=5)" in \
        err.value.cause and "global_step=global_step" in err.value.fix


def test_step_guard_lets_a_correct_loop_finish():
    tf = tf_dist.quiet_tensorflow()
    graph, t = _graph(with_global_step=True)
    with graph.as_default():
        hooks = [tf.compat.v1.train.StopAtStepHook(last_step=5),
                 tf_dist.step_guard(t["global_step"], last_step=5, limit_s=30)]
        steps = 0
        with tf.compat.v1.train.MonitoredSession(hooks=hooks) as sess:
            while not sess.should_stop():
                sess.run(t["train_op"])
                steps += 1
    assert steps == 5


def test_engine_check_train_graph_names_missing_keys_and_a_still_global_step(monkeypatch):
    main = sys.modules["__main__"]
    monkeypatch.setattr(main, "worker_index", 0, raising=False)
    for with_step in (True, False):
        def build(worker_index, sync=False, _with=with_step):
            graph, t = _graph(_with)
            return graph, t, []

        monkeypatch.setattr(main, "probe_graph", build, raising=False)
        got = checks.engine_check_train_graph("probe_graph")
        assert got["advances_global_step"] is with_step
        assert "accuracy" in got["missing"] and "global_step" not in got["missing"]
