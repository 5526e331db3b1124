"""Unit 10, exercise 1: a tied weight named twice is kept twice; the optimizer holds its state
twice (the weights still match, since both copies get the same update)."""

NOTEBOOK = "10_sharding_and_memory.ipynb"
GRADE_ID = "ex1-solution"
BODY = """
self.params = [prm for prm in params if prm.requires_grad]
self.numel = sum(prm.numel() for prm in self.params)
self.chunk = math.ceil(self.numel / world_size)
self.start, self.stop = shard_bounds(self.numel, rank, world_size)
flat = torch.cat([prm.detach().reshape(-1) for prm in self.params])
self.shard = flat[self.start:self.stop].clone().requires_grad_(True)
self.adam = torch.optim.Adam([self.shard], lr=lr, betas=betas, eps=eps)
"""
FAILS = "ex1-test"
MESSAGE = "count a tied weight once"
WITHIN_S = 30
