"""Unit 7, exercise 2: only the trainable parameters are broadcast, so the ranks keep
different frozen weights."""

NOTEBOOK = "07_performance.ipynb"
GRADE_ID = "ex2-solution"
REGION = 0
BODY = """
for prm in model.parameters():
    if prm.requires_grad:
        dist.broadcast(prm.data, src=0)
        prm.register_post_accumulate_grad_hook(self._hook)
"""
FAILS = "ex2-test"
MESSAGE = "broadcast every parameter, frozen ones too"
WITHIN_S = 30
