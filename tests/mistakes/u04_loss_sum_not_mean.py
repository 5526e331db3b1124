"""Unit 4, exercise 2: the loss summed over the batch instead of averaged (every step 64 times
larger)."""

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
    loss = tf.reduce_sum(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y_, logits=logits), name="loss")
    accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), y_), tf.float32))"""),
]
FAILS = "ex2-test"
MESSAGE = 'tf.reduce_mean(...), not tf.reduce_sum'
WITHIN_S = 30
