"""Unit 10, exercise 1: the gradients reduce-scattered with a sum, not an average: each rank's
shard steps with p times DDP's gradient (AdamW's eps and SGD both feel the scale)."""

NOTEBOOK = "10_sharding_and_memory.ipynb"
GRADE_ID = "ex1-solution"
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("dist.reduce_scatter_single(mine, flat, op=dist.ReduceOp.AVG)",
     "dist.reduce_scatter_single(mine, flat)"),
]
REGION = 1  # step()
FAILS = "ex1-test"
MESSAGE = "op=dist.ReduceOp.AVG"
WITHIN_S = 30
