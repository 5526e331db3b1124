"""(local_rank + 1)**2 where rank belongs: right on one host, 1 + 4 + 1 + 4 = 10 instead of 30 on
two hosts of two ranks each."""

NOTEBOOK = "00_cluster_tour.ipynb"
GRADE_ID = "ex2-solution"
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("""\
t = torch.tensor([float(rank + 1) ** 2])""",
     """\
t = torch.tensor([float(local_rank + 1) ** 2])"""),
]
FAILS = "ex2-test"
MESSAGE = "use rank, not local_rank"
WITHIN_S = 30
