"""Unit 0, exercise 2: the values summed but not squared (at p = 2 the sum of r and of r**2
were both 1, so this passed before)."""

NOTEBOOK = "00_cluster_tour.ipynb"
GRADE_ID = "ex2-solution"
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("""\
t = torch.tensor([float(rank + 1) ** 2])""",
     """\
t = torch.tensor([float(rank + 1)])"""),
]
FAILS = "ex2-test"
MESSAGE = "(rank + 1)**2 into a tensor"
WITHIN_S = 30
