"""Helpers behind unit 7's parameter-server table (``tf_dist.perf``) and unit 9's part B
(``tf_dist.models``, ``checks.check_tf_capstone``): the table's arithmetic, the graph's
placement, the model, the held-out check, and one real measurement on gRPC servers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from course_utils.tf_dist import models, perf

ROOT = Path(__file__).resolve().parents[1]


def _measured():
    return {"workers": 2, "bytes": 2**20, "batch": 64,
            "rows": {("async", 1): [100.0, 110.0, 90.0, 300.0], ("sync", 1): [100.0] * 4,
                     ("async", 2): [80.0, 80.0, 80.0, 80.0], ("sync", 2): [120.0] * 4}}


def test_ps_table_medians_updates_noise_and_ratio():
    rows = {(r["kind"], r["shards"]): r for r in perf.ps_table(_measured())}
    assert rows[("async", 1)]["batches_s"] == pytest.approx(105.0)   # a burst moves no median
    assert rows[("sync", 1)]["updates_s"] == pytest.approx(50.0)     # one update per 2 batches
    assert rows[("async", 2)]["updates_s"] == pytest.approx(80.0)
    assert rows[("sync", 2)]["noise"] == 0.0 and rows[("async", 1)]["noise"] > 0.1
    assert rows[("async", 2)]["vs_async_1"] == pytest.approx(80 / 105)
    text = perf.format_ps_table(perf.ps_table(_measured()), _measured())
    assert "1024 KiB" in text and "updates/s" in text and len(text.splitlines()) == 6


def test_nhwc_scales_and_transposes_and_rejects_other_layouts():
    x = np.zeros((2, 3, 32, 32), np.float32)
    x[0, 1, 4, 5] = 1.0
    out = models.nhwc(x)
    assert out.shape == (2, 32, 32, 3) and out.dtype == np.float32
    assert out[0, 4, 5, 1] == 1.0 and out[1, 0, 0, 0] == -1.0
    with pytest.raises(ValueError, match="N, 3, H, W"):
        models.nhwc(np.zeros((2, 32, 32, 3), np.float32))


def test_graph_places_shards_on_their_ps_and_the_model_scores_held_out_data(tmp_path):
    from course_utils import checks
    from course_utils.tf_dist import quiet_tensorflow

    tf = quiet_tensorflow()
    made = perf.build_ps_graph(tf, shards=2, workers=2, width=16, batch=4)
    variables = made["graph"].get_collection("variables")
    assert sorted(v.device.split("/device")[0] for v in variables) == ["/job:ps/task:0",
                                                                       "/job:ps/task:1"]
    assert sum(int(v.shape[0]) for v in variables) == 16 and len(made["train"]) == 2
    net = models.cnn(seed=0)
    logits = net(tf.zeros([2, 32, 32, 3]))
    assert logits.shape == (2, 10) and len(net.trainable_variables) == 6
    assert np.array_equal(models.cnn(seed=0).w.numpy(), net.w.numpy())
    score = checks.check_tf_capstone(net, str(tmp_path), n_test=50)
    assert score["n"] == 50 and 0.0 <= score["accuracy"] <= 1.0
    assert score["data"] == "sklearn-digits" and score["target"] == 0.85
    assert score["on_ps"] is False and score["devices"]   # made outside strategy.scope()


def _train_ps(tf, restore=True, count=True):
    """A ``train_ps`` as part B asks for, without a cluster (each "epoch" one SGD step on one
    batch), leaving its model in ``__main__.tf_model``; ``restore``/``count``: False for two of
    the mistakes the check names."""
    import __main__

    def train_ps(epochs, ckpt_dir, budget_s):
        net, counter = models.cnn(seed=0), tf.Variable(0, dtype=tf.int64)
        __main__.tf_model = net
        manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=net, epoch=counter),
                                             ckpt_dir, max_to_keep=2)
        if restore and manager.latest_checkpoint:
            manager.checkpoint.restore(manager.latest_checkpoint)
        out = []
        for ep in range(int(counter.numpy()), epochs):
            if budget_s <= 0:
                break
            x = tf.random.stateless_normal([8, 32, 32, 3], seed=[ep, 1])
            y = tf.constant([ep % 10] * 8, dtype=tf.int64)
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                    labels=y, logits=net(x)))
            for v, g in zip(net.trainable_variables, tape.gradient(
                    loss, net.trainable_variables), strict=True):
                v.assign_sub(0.05 * g)
            counter.assign(ep + 1 if count else ep)
            manager.save()
            out.append({"epoch": ep})
        return out
    return train_ps


def test_start_and_resume_check_passes_a_right_run_and_names_two_mistakes(tmp_path):
    from course_utils import checks
    from course_utils.tf_dist import quiet_tensorflow

    tf = quiet_tensorflow()
    probe = tf.random.stateless_normal([4, 32, 32, 3], seed=[9, 9])
    for kw, said in (({}, None), ({"restore": False}, "restored: False"),
                     ({"count": False}, "the epoch counter in the latest checkpoint")):
        folder = str(tmp_path / str(len(kw) and next(iter(kw))))
        fn = _train_ps(tf, **kw)
        history = fn(2, folder, 60)
        got = checks.tf_start_and_resume_problem(fn, history, folder, probe)
        assert (got is None) if said is None else (said in got), (kw, got)


_MEASURE = """
import json, sys
from course_utils.cluster.ports import free_ports
from course_utils.tf_dist import perf, quiet_tensorflow
from course_utils.tf_dist.spec import server_config
tf = quiet_tensorflow()
p = free_ports(4, "127.0.0.1")
spec = {"ps": [f"127.0.0.1:{p[0]}", f"127.0.0.1:{p[1]}"],
        "worker": [f"127.0.0.1:{p[2]}", f"127.0.0.1:{p[3]}"]}
servers = [tf.distribute.Server(tf.train.ClusterSpec(spec), job, i, protocol="grpc",
                                config=server_config(spec))
           for job in ("ps", "worker") for i in range(2)]
m = perf.measure_ps(spec, rounds=2, steps=2, width=32, batch=4, timeout_s=30)
print(json.dumps({f"{k}:{n}": v for (k, n), v in m["rows"].items()}))
"""


def test_measure_ps_times_four_configurations_on_real_servers():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run([sys.executable, "-c", _MEASURE], capture_output=True, text=True,
                          timeout=180, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(rows) == ["async:1", "async:2", "sync:1", "sync:2"]
    assert all(len(v) == 2 and min(v) > 0 for v in rows.values()), rows
