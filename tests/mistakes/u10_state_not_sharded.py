"""Unit 10, exercise 1: every rank keeps Adam's state of all parameters (no sharding); the
weights are right, the memory is DDP's."""

NOTEBOOK = "10_sharding_and_memory.ipynb"
GRADE_ID = "ex1-solution"
BODY = """
self.params, seen = [], set()
for prm in params:
    if prm.requires_grad and id(prm) not in seen:
        seen.add(id(prm))
        self.params.append(prm)
self.numel = sum(prm.numel() for prm in self.params)
self.chunk = self.numel
self.start, self.stop = 0, self.numel
flat = torch.cat([prm.detach().reshape(-1) for prm in self.params])
self.shard = flat.clone().requires_grad_(True)
self.adam = torch.optim.Adam([self.shard], lr=lr, betas=betas, eps=eps)
"""
FAILS = "ex1-test"
MESSAGE = "keep Adam's state for this rank's shard only"
WITHIN_S = 30
