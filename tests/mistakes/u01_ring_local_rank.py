"""local_rank where rank belongs: on one host they are equal (2 engines), on the check's two
simulated hosts of two ranks each they are not."""

NOTEBOOK = "01_collectives.ipynb"
GRADE_ID = "ex1-solution"
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("""\
p, r = world_size, rank""",
     """\
p, r = world_size, local_rank"""),
]
FAILS = "ex1-test-correct"
MESSAGE = "Use rank, the global rank"
WITHIN_S = 30
