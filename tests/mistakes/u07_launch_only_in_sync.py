"""Unit 7, exercise 2: the hook only collects; every gradient is launched in sync(), after
backward, as one bucket."""

NOTEBOOK = "07_performance.ipynb"
GRADE_ID = "ex2-solution"
REGION = 1
BODY = """
self.bucket.append(param)
self.bucket_bytes += param.grad.numel() * param.grad.element_size()
"""
FAILS = "ex2-test"
MESSAGE = "launch full buckets from the hook, not in sync()"
WITHIN_S = 30
