"""Unit 11, exercise 1: the row layer adds its bias before the all_reduce, so every rank's
copy of the bias is summed in: p times the bias."""

NOTEBOOK = "11_tensor_and_pipeline.ipynb"
GRADE_ID = "ex1-solution"
REGION = 3  # RowParallelLinear.forward
BODY = """
return ReduceFromTP.apply(F.linear(x, self.weight, self.bias))
"""
FAILS = "ex1-test"
MESSAGE = "bias added once, after it"
WITHIN_S = 20
