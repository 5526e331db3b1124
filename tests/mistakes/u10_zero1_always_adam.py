"""Unit 10, exercise 1: the shard's optimizer is always Adam with the given learning rate, not
the class it was given: no weight decay for AdamW, no momentum for SGD."""

NOTEBOOK = "10_sharding_and_memory.ipynb"
GRADE_ID = "ex1-solution"
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("self.optimizer = optimizer_cls([self.shard], **kwargs)",
     "self.optimizer = torch.optim.Adam([self.shard], lr=kwargs['lr'])"),
]
FAILS = "ex1-test"
MESSAGE = "optimizer_cls([your shard], **kwargs)"
WITHIN_S = 30
