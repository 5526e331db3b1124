"""Unit 4, exercise 2: ``replicas_to_aggregate=2`` typed for the default 2 workers: wrong on any
other cluster."""

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
            opt, replicas_to_aggregate=n_workers, total_num_replicas=n_workers)""",
     """\
            opt, replicas_to_aggregate=2, total_num_replicas=2)"""),
]
FAILS = "ex2-test"
MESSAGE = 'not a fixed number'
WITHIN_S = 30
