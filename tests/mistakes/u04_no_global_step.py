"""Unit 4, exercise 2: ``minimize(loss)`` without ``global_step=``; the counter never moves, so
``StopAtStepHook`` never fires (before: exercise 2 passed, then training hung for 180 s with a
message about collectives)."""

NOTEBOOK = "04_tf_classic_ps.ipynb"
GRADE_ID = "ex2-solution"
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("""\
    worker_device=f"/job:worker/task:{worker_index}",
    cluster=tf.train.ClusterSpec(tf_cluster))""",
     """\
    worker_device=f"/job:worker/task:{worker_index}", cluster=tf.train.ClusterSpec(tf_cluster))"""),
    ("""\
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y_, logits=logits),
        name="loss")
    accuracy = tf.reduce_mean(
        tf.cast(tf.equal(tf.argmax(logits, 1), y_), tf.float32), name="accuracy")""",
     """\
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y_, logits=logits), name="loss")
    accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), y_), tf.float32))"""),
    ("""\
    train_op = opt.minimize(loss, global_step=global_step)""",
     """\
    train_op = opt.minimize(loss)"""),
]
FAILS = "ex2-test"
MESSAGE = "opt.minimize(loss, global_step=global_step)"
WITHIN_S = 30
