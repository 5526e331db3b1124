"""Unit 3, exercise 1: ``set_epoch`` forgotten; every epoch reuses epoch 0's order."""

NOTEBOOK = "03_pytorch_ddp.ipynb"
GRADE_ID = "ex1-solution"
BODY = """
return DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=0,
                          drop_last=True)
"""
FAILS = "ex1-test"
MESSAGE = "call sampler.set_epoch(epoch)"
WITHIN_S = 30
