"""Unit 7, exercise 2: the parameters found by walking the modules, so a tied weight gets two
hooks and is all-reduced twice."""

NOTEBOOK = "07_performance.ipynb"
GRADE_ID = "ex2-solution"
REGION = 0
BODY = """
for module in model.modules():
    for prm in module.parameters(recurse=False):
        dist.broadcast(prm.data, src=0)
        if prm.requires_grad:
            prm.register_post_accumulate_grad_hook(self._hook)
"""
FAILS = "ex2-test"
MESSAGE = "register one hook per parameter"
WITHIN_S = 30
