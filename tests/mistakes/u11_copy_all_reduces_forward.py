"""Unit 11, exercise 1a: an all_reduce in f's forward (the column layer's input summed over the
ranks, p times x), as if f were g."""

NOTEBOOK = "11_tensor_and_pipeline.ipynb"
GRADE_ID = "ex1a-solution"
REGION = 0  # CopyToTP.forward
BODY = """
x = x.clone()
dist.all_reduce(x)
return x
"""
FAILS = "ex1a-test"
MESSAGE = "f's forward is the identity"
WITHIN_S = 15
