"""Unit 10, exercise 2: the gathered parameter keeps its padding rows: the last Linear (5
rows, padded to 6 or 8) computes outputs that do not exist."""

NOTEBOOK = "10_sharding_and_memory.ipynb"
GRADE_ID = "ex2-solution"
REGION = 2  # gather()
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("fulls.append(full[:shape[0]])", "fulls.append(full)"),
]
FAILS = "ex2-test"
MESSAGE = "cut each gathered parameter to its rows"
WITHIN_S = 30
