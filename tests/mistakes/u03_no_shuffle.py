"""Unit 3, exercise 1: ``shuffle=False``: every epoch gives each rank the same items in the
dataset's order, so set_epoch changes nothing (before: the test named set_epoch, not shuffle)."""

NOTEBOOK = "03_pytorch_ddp.ipynb"
GRADE_ID = "ex1-solution"
BODY = """
sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=False, seed=0,
                             drop_last=True)
sampler.set_epoch(epoch)
return sampler
"""
FAILS = "ex1-test"
MESSAGE = "pass shuffle=True"
WITHIN_S = 30
