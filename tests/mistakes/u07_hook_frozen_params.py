"""Unit 7, exercise 2: a hook on every parameter, frozen ones too (torch refuses)."""

NOTEBOOK = "07_performance.ipynb"
GRADE_ID = "ex2-solution"
REGION = 0
BODY = """
for prm in model.parameters():
    dist.broadcast(prm.data, src=0)
    prm.register_post_accumulate_grad_hook(self._hook)
"""
FAILS = "ex2-test"
MESSAGE = "register hooks only on parameters that require grad"
WITHIN_S = 30
