"""Unit 4, exercise 2: the original program's mistake, the loss pinned to the ps (every worker
then ships its predictions to the ps every step)."""

NOTEBOOK = "04_tf_classic_ps.ipynb"
GRADE_ID = "ex2-solution"
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("""\
    worker_device=f"/job:worker/task:{worker_index}",
    cluster=tf.train.ClusterSpec(tf_cluster))""",
     """\
    worker_device=f"/job:worker/task:{worker_index}", cluster=tf.train.ClusterSpec(tf_cluster))"""),
    ("""\
    loss = tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y_, logits=logits),
        name="loss")
    accuracy = tf.reduce_mean(
        tf.cast(tf.equal(tf.argmax(logits, 1), y_), tf.float32), name="accuracy")""",
     """\
    with tf.compat.v1.device("/job:ps/task:0"):
        loss = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y_, logits=logits), name="loss")
    accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), y_), tf.float32))"""),
]
FAILS = "ex2-test"
MESSAGE = "the device of loss"
WITHIN_S = 30
