"""Unit 10, exercise 1: the flat gradients not padded to chunk * world_size: with 1,797
parameters on 2 or 4 ranks the reduce-scatter's input is not p pieces of equal size."""

NOTEBOOK = "10_sharding_and_memory.ipynb"
GRADE_ID = "ex1-solution"
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("""\
flat = self.shard.new_zeros(self.chunk * self.world_size)
flat[:self.numel] = torch.cat([prm.grad.reshape(-1) for prm in self.params])""",
     """\
flat = torch.cat([prm.grad.reshape(-1) for prm in self.params])"""),
]
REGION = 1  # step()
FAILS = "ex1-test"
MESSAGE = "pad"
WITHIN_S = 30
