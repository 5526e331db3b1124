"""Unit 4, exercise 3: the loop runs ``train_op`` but never counts its steps."""

NOTEBOOK = "04_tf_classic_ps.ipynb"
GRADE_ID = "ex3-solution"
BODY = """
stop = tf.compat.v1.train.StopAtStepHook(last_step=steps)
with tf.compat.v1.train.MonitoredTrainingSession(
        master=target, is_chief=(worker_index == 0), config=config,
        hooks=[stop, *hooks], stop_grace_period_secs=2, save_checkpoint_secs=None,
        save_summaries_steps=None, log_step_count_steps=None) as sess:
    while not sess.should_stop():
        batch = rng.integers(0, len(y_shard), 64)
        sess.run(t["train_op"], {t["x"]: x_shard[batch], t["y_"]: y_shard[batch]})
"""
FAILS = "ex3-test"
MESSAGE = "add 1 to local_steps after each sess.run"
WITHIN_S = 30
