"""Unit 10, exercise 1: every rank keeps the optimizer's state of all parameters (no
sharding); the weights are right, the memory is DDP's."""

NOTEBOOK = "10_sharding_and_memory.ipynb"
GRADE_ID = "ex1-solution"
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("""\
self.chunk = math.ceil(self.numel / self.world_size)
self.start, self.stop = shard_bounds(self.numel, self.rank, self.world_size)""",
     """\
self.chunk = self.numel
self.start, self.stop = 0, self.numel"""),
    ("""\
self.shard = flat[self.start:self.stop].clone().requires_grad_(True)""",
     """\
self.shard = flat.clone().requires_grad_(True)"""),
]
FAILS = "ex1-test"
MESSAGE = "keep the optimizer's state for this rank's shard only"
WITHIN_S = 30
