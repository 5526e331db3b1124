"""The original PyTorch program's call: rank=0 on every host. Two ranks claim rank 0; one gets
'address already in use' at once, the other waits for its timeout."""

NOTEBOOK = "00_cluster_tour.ipynb"
GRADE_ID = "ex1-solution"
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("""\
                        rank=rank, world_size=world_size,""",
     """\
                        rank=0, world_size=world_size,"""),
]
FAILS = "ex1-test"
MESSAGE = "two ranks claimed rank 0"
WITHIN_S = 15
