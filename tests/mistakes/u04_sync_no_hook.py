"""Unit 4, exercise 2: the sync optimizer without its hook: nobody starts the chief's queue runner
or fills the token queue."""

NOTEBOOK = "04_tf_classic_ps.ipynb"
GRADE_ID = "ex2-solution"
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("""\
        hooks.append(opt.make_session_run_hook(is_chief=(worker_index == 0)))
""",
     """\
"""),
]
FAILS = "ex2-test"
MESSAGE = 'opt.make_session_run_hook(is_chief'
WITHIN_S = 30
