"""Unit 10, exercise 1b: each gradient reduce-scattered with a sum, not an average."""

NOTEBOOK = "10_sharding_and_memory.ipynb"
GRADE_ID = "ex1b-solution"
REGION = 1  # reduce_gradient()
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("dist.reduce_scatter_single(out, padded, op=dist.ReduceOp.AVG)",
     "dist.reduce_scatter_single(out, padded)"),
]
FAILS = "ex1b-test"
MESSAGE = "op=dist.ReduceOp.AVG"
WITHIN_S = 30
