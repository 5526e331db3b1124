"""Unit 7, exercise 2: the sum divided by 2, the notebook's number of ranks, not world_size:
right on 2 ranks, wrong on 3 (the test's run on 3 ranks catches it)."""

NOTEBOOK = "07_performance.ipynb"
GRADE_ID = "ex2-solution"
REGION = 2
BODY = """
if self.bucket:
    self._launch()
for work, flat, params in self.pending:
    work.wait()
    flat /= 2
    offset = 0
    for prm in params:
        n = prm.grad.numel()
        prm.grad.copy_(flat[offset:offset + n].view_as(prm.grad))
        offset += n
self.pending = []
"""
FAILS = "ex2-test"
MESSAGE = "rank 0 of 3: your gradients are 1.5x torch DDP's"
WITHIN_S = 30
