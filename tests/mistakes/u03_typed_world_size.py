"""Unit 3, exercise 1: ``num_replicas=2`` typed instead of ``world_size``: right on 2 ranks only;
the test's 3-rank run catches it."""

NOTEBOOK = "03_pytorch_ddp.ipynb"
GRADE_ID = "ex1-solution"
BODY = """
sampler = DistributedSampler(dataset, num_replicas=2, rank=rank, shuffle=True, seed=0,
                             drop_last=True)
sampler.set_epoch(epoch)
return sampler
"""
FAILS = "ex1-test"
MESSAGE = "pass num_replicas=world_size and rank=rank"
WITHIN_S = 30
