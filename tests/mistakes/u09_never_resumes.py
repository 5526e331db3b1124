"""Unit 9, exercise 2: the loop always starts at epoch 0; resume_or_start's epoch is ignored
(the weights are loaded, the epochs run again)."""

NOTEBOOK = "09_capstone.ipynb"
GRADE_ID = "ex2-solution"
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("""\
first = resume_or_start(model, opt, ckpt_path)""",
     """\
resume_or_start(model, opt, ckpt_path)"""),
    ("""\
for epoch in range(first, epochs):""",
     """\
for epoch in range(epochs):"""),
    ("""\
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)   # one decision, the same on every rank""",
     """\
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)"""),
]
FAILS = "ex2-test"
MESSAGE = 'start the loop at the epoch resume_or_start returns'
WITHIN_S = 30
