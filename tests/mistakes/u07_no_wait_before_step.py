"""Unit 7, exercise 2: sync() copies the buckets back without waiting for their all_reduce,
so the optimizer step may read half-reduced gradients."""

NOTEBOOK = "07_performance.ipynb"
GRADE_ID = "ex2-solution"
REGION = 2
BODY = """
if self.bucket:
    self._launch()
for work, flat, params in self.pending:
    flat /= world_size
    offset = 0
    for prm in params:
        n = prm.grad.numel()
        prm.grad.copy_(flat[offset:offset + n].view_as(prm.grad))
        offset += n
self.pending = []
"""
FAILS = "ex2-test"
MESSAGE = "call work.wait() on every pending bucket"
WITHIN_S = 30
