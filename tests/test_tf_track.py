"""Units 4-5 beyond nbval: the graded tests catch the mistakes learners (and the seed) make, and
every cell re-runs in the same kernel (servers reused or replaced, fresh chief port)."""

from __future__ import annotations

import pytest

from course_utils.instructor.grading import (
    NOTEBOOK_DIR,
    failed_by_test,
    read,
    with_solution,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


# The seed's mistake (loss pinned to the ps) and a sync check that only compares global steps.
SEED_LOSS_ON_PS = """
setter = tf.compat.v1.train.replica_device_setter(
    worker_device=f"/job:worker/task:{worker_index}", cluster=tf.train.ClusterSpec(tf_cluster))
with tf.compat.v1.device(setter):
    x = tf.compat.v1.placeholder(tf.float32, [None, 64], name="x")
    y_ = tf.compat.v1.placeholder(tf.int64, [None], name="y_")
    zeros = tf.compat.v1.zeros_initializer()
    W = tf.compat.v1.get_variable("W", [64, 10], initializer=zeros)
    b = tf.compat.v1.get_variable("b", [10], initializer=zeros)
    logits = tf.add(tf.matmul(x, W), b, name="logits")
    with tf.compat.v1.device("/job:ps/task:0"):
        loss = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y_, logits=logits), name="loss")
    accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), y_), tf.float32))
    global_step = tf.compat.v1.train.get_or_create_global_step()
    opt = tf.compat.v1.train.GradientDescentOptimizer(0.5)
    hooks = []
    if sync:
        opt = tf.compat.v1.train.SyncReplicasOptimizer(
            opt, replicas_to_aggregate=n_workers, total_num_replicas=n_workers)
        hooks.append(opt.make_session_run_hook(is_chief=(worker_index == 0)))
    train_op = opt.minimize(loss, global_step=global_step)
"""
MUTANTS = {
    "04_tf_classic_ps.ipynb": (
        {"ex1-solution": SEED_LOSS_ON_PS,
         "ex3-solution": 'return len({r["global_step"] for r in runs}) == 1'},
        {"ex1-test": True, "ex2-test": False, "ex3-test": True},
    ),
    "05_tf2_parameter_server_strategy.ipynb": (
        {"ex1-solution": """
spec = {job: [f"{addr_by_rank[i]}:{ports_by_task[(job, i)]}" for i, _ in enumerate(ranks)]
        for job, ranks in roles.items()}
return {"cluster": spec, "task": {"type": task_type, "index": task_index}}
""",
         "ex2-solution": """
return tf.distribute.experimental.partitioners.MinSizePartitioner(
    min_shard_bytes=64, max_shards=1)
""",
         "ex3-solution": """
logits = model(x)
loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
steps_done.assign_add(1)
return loss
"""},
        {"ex1-test": True, "ex2-test": True, "ex3-test": True},
    ),
}


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_graded_tests_catch_wrong_solutions(name):
    """ex1 mistakes: 04 the seed's loss on the ps; 05 addresses indexed by task, not by rank.
    ex2/ex3 mistakes: 04 a sync check that only compares global steps; 05 one shard only, and a
    step that never applies its gradients."""
    bodies, want_failed = MUTANTS[name]
    nb = read(NOTEBOOK_DIR / name)
    for gid, body in bodies.items():
        with_solution(nb, gid, body)
    got = failed_by_test(nb)
    assert got == want_failed, got
