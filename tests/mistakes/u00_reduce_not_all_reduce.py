"""Unit 0, exercise 2: ``dist.reduce`` where ``all_reduce`` belongs; only rank 0 gets the sum
(at p = 2 with rank**2 rank 1 already held the answer, so this passed before)."""

NOTEBOOK = "00_cluster_tour.ipynb"
GRADE_ID = "ex2-solution"
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("""\
dist.all_reduce(t, op=dist.ReduceOp.SUM)""",
     """\
dist.reduce(t, dst=0, op=dist.ReduceOp.SUM)"""),
]
FAILS = "ex2-test"
MESSAGE = "one dist.all_reduce"
WITHIN_S = 30
