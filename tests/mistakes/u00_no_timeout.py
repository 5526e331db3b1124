"""No timeout: a missing rank would block the others for torch's default 30 minutes."""

NOTEBOOK = "00_cluster_tour.ipynb"
GRADE_ID = "ex1-solution"
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("""\
                        rank=rank, world_size=world_size,
                        timeout=datetime.timedelta(seconds=timeout_s))""",
     """\
                        rank=rank, world_size=world_size)"""),
]
FAILS = "ex1-test"
MESSAGE = "pass timeout=datetime.timedelta(seconds=timeout_s)"
WITHIN_S = 15
