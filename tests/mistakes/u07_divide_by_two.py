"""Unit 7, exercise 2: the sum divided by 2, the notebook's number of ranks, not world_size:
right on 2 ranks, wrong on 3 (the test's run on 3 ranks catches it)."""

NOTEBOOK = "07_performance.ipynb"
GRADE_ID = "ex2-solution"
REGION = 2
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("""\
    flat /= world_size""",
     """\
    flat /= 2"""),
]
FAILS = "ex2-test"
MESSAGE = "rank 0 of 3: your gradients are 1.5x torch DDP's"
WITHIN_S = 30
