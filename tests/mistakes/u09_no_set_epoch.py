"""Unit 9, exercise 2: ``set_epoch`` forgotten; every epoch reads epoch 0's order."""

NOTEBOOK = "09_capstone.ipynb"
GRADE_ID = "ex2-solution"
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("""\
    sampler.set_epoch(epoch)
""",
     """\
"""),
]
FAILS = "ex2-test"
MESSAGE = 'call sampler.set_epoch(epoch)'
WITHIN_S = 30
