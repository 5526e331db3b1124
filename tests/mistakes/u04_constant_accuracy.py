"""Unit 4, exercise 2: a constant accuracy (``tf.constant(1.0)``): the names are all there, the
value is not."""

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
    accuracy = tf.constant(1.0)"""),
]
FAILS = "ex2-test"
MESSAGE = 'tf.argmax(logits, 1)'
WITHIN_S = 30
