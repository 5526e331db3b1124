"""Unit 11, exercise 2c: the bubble with m and p swapped."""

NOTEBOOK = "11_tensor_and_pipeline.ipynb"
GRADE_ID = "ex2c-solution"
BODY = """
return (m - 1) / (m + p - 1)
"""
FAILS = "ex2c-test"
MESSAGE = "(p - 1) / (m + p - 1)"
WITHIN_S = 5
