"""No opt.zero_grad(): backward() adds into .grad, so the previous step's gradient piles up."""

NOTEBOOK = "02_data_parallel_from_scratch.ipynb"
GRADE_ID = "ex1-solution"
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("""\
opt.zero_grad()
""",
     """\
"""),
]
FAILS = "ex1-test-step"
MESSAGE = "call opt.zero_grad() at the start of every step"
WITHIN_S = 20
