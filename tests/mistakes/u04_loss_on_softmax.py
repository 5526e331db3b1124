"""Unit 4, exercise 2: the softmax applied twice (the loss given ``softmax(logits)``)."""

NOTEBOOK = "04_tf_classic_ps.ipynb"
GRADE_ID = "ex2-solution"
BODY = """
setter = tf.compat.v1.train.replica_device_setter(
    worker_device=f"/job:worker/task:{worker_index}", cluster=tf.train.ClusterSpec(tf_cluster))
with tf.compat.v1.device(setter):
    x = tf.compat.v1.placeholder(tf.float32, [None, 64], name="x")
    y_ = tf.compat.v1.placeholder(tf.int64, [None], name="y_")
    zeros = tf.compat.v1.zeros_initializer()
    W = tf.compat.v1.get_variable("W", [64, 10], initializer=zeros)
    b = tf.compat.v1.get_variable("b", [10], initializer=zeros)
    logits = tf.add(tf.matmul(x, W), b, name="logits")
    loss = tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y_, logits=tf.nn.softmax(logits)),
        name="loss")
    accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), y_), tf.float32))
    global_step = tf.compat.v1.train.get_or_create_global_step()
    opt = tf.compat.v1.train.GradientDescentOptimizer(0.5)
    if sync:
        opt = tf.compat.v1.train.SyncReplicasOptimizer(
            opt, replicas_to_aggregate=n_workers, total_num_replicas=n_workers)
        hooks.append(opt.make_session_run_hook(is_chief=(worker_index == 0)))
    train_op = opt.minimize(loss, global_step=global_step)
"""
FAILS = "ex2-test"
MESSAGE = 'pass the logits themselves'
WITHIN_S = 30
