"""Unit 10, exercise 1: the gradients all-reduced (as DDP does), then sliced; the weights are
right, but a step sends 1.5 times DDP's bytes (all_reduce, then all_gather on top)."""

NOTEBOOK = "10_sharding_and_memory.ipynb"
GRADE_ID = "ex1-solution"
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("""\
mine = self.shard.new_empty(self.chunk)
dist.reduce_scatter_single(mine, flat, op=dist.ReduceOp.AVG)""",
     """\
dist.all_reduce(flat)
mine = flat[self.start:self.start + self.chunk] / self.world_size"""),
]
REGION = 1  # step()
FAILS = "ex1-test"
MESSAGE = "no all_reduce"
WITHIN_S = 30
