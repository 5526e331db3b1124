"""Unit 10, exercise 2: each gradient reduce-scattered with a sum, not an average: every shard
steps with p times the gradient one process would compute."""

NOTEBOOK = "10_sharding_and_memory.ipynb"
GRADE_ID = "ex2-solution"
REGION = 3  # reduce()
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("dist.reduce_scatter_single(piece, padded, op=dist.ReduceOp.AVG)",
     "dist.reduce_scatter_single(piece, padded)"),
]
FAILS = "ex2-test"
MESSAGE = "op=dist.ReduceOp.AVG"
WITHIN_S = 30
