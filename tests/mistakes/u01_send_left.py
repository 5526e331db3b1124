"""Sending to the left neighbour and receiving from the right, with the chunk schedule of a
rightward ring. With 2 ranks left and right are the same rank, so it passes there."""

NOTEBOOK = "01_collectives.ipynb"
GRADE_ID = "ex1-solution"
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("""\
right, left = (r + 1) % p, (r - 1) % p""",
     """\
right, left = (r - 1) % p, (r + 1) % p"""),
]
FAILS = "ex1-test-correct"
MESSAGE = "Send to the right"
WITHIN_S = 30
