"""Unit 7, exercise 2: work.wait() right after each launch inside the hook, so nothing overlaps."""

NOTEBOOK = "07_performance.ipynb"
GRADE_ID = "ex2-solution"
REGION = 1
BODY = """
self.bucket.append(param)
self.bucket_bytes += param.grad.numel() * param.grad.element_size()
if self.bucket_bytes >= self.cap:
    self._launch()
    self.pending[-1][0].wait()
"""
FAILS = "ex2-test"
MESSAGE = "wait only in sync()"
WITHIN_S = 30
