"""Unit 4, exercise 2: ``sync`` ignored: the plain optimizer in both modes, so synchronous training
is asynchronous."""

NOTEBOOK = "04_tf_classic_ps.ipynb"
GRADE_ID = "ex2-solution"
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("""\
    if sync:
        opt = tf.compat.v1.train.SyncReplicasOptimizer(
            opt, replicas_to_aggregate=n_workers, total_num_replicas=n_workers)
        hooks.append(opt.make_session_run_hook(is_chief=(worker_index == 0)))
""",
     """\
"""),
]
FAILS = "ex2-test"
MESSAGE = 'SyncReplicasOptimizer(opt, replicas_to_aggregate=n_workers'
WITHIN_S = 30
