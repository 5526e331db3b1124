"""Unit 11, exercise 1a: g's forward all-reduces the tensor it was given, in place (the
caller's tensor changes under it)."""

NOTEBOOK = "11_tensor_and_pipeline.ipynb"
GRADE_ID = "ex1a-solution"
REGION = 2  # ReduceFromTP.forward
BODY = """
dist.all_reduce(x, op=dist.ReduceOp.SUM)
return x
"""
FAILS = "ex1a-test"
MESSAGE = "all-reduce a copy"
WITHIN_S = 15
