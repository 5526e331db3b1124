"""Unit 3, exercise 1: a sampler without ``drop_last``; it pads the shards by repeating examples."""

NOTEBOOK = "03_pytorch_ddp.ipynb"
GRADE_ID = "ex1-solution"
BODY = """
sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
sampler.set_epoch(epoch)
return sampler
"""
FAILS = "ex1-test"
MESSAGE = "pass drop_last=True to DistributedSampler"
WITHIN_S = 30
