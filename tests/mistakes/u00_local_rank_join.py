"""rank=local_rank in init_process_group: on one host (2 engines) local rank equals rank and the
group forms; on two hosts two processes claim rank 0. The test's own 4 ranks on two simulated
hosts show it."""

NOTEBOOK = "00_cluster_tour.ipynb"
GRADE_ID = "ex1-solution"
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("""\
                        rank=rank, world_size=world_size,""",
     """\
                        rank=local_rank, world_size=world_size,"""),
]
FAILS = "ex1-test"
MESSAGE = "use rank, not local_rank"
WITHIN_S = 30
