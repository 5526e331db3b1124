"""Unit 4, exercise 3: the loop runs ``train_op`` but never counts its steps."""

NOTEBOOK = "04_tf_classic_ps.ipynb"
GRADE_ID = "ex3-solution"
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("""\
        local_steps += 1""",
     """\
"""),
]
FAILS = "ex3-test"
MESSAGE = "add 1 to local_steps after each sess.run"
WITHIN_S = 30
