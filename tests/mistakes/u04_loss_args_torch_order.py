"""Unit 4, exercise 2: the loss called in PyTorch's order, ``(logits, labels)`` by position:
TensorFlow takes the labels first."""

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
        tf.nn.sparse_softmax_cross_entropy_with_logits(logits, y_), name="loss")
    accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), y_), tf.float32))"""),
]
FAILS = "ex2-test"
MESSAGE = 'labels=y_, logits=logits'
WITHIN_S = 30
