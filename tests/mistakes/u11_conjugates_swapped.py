"""Unit 11, exercise 1: the conjugates swapped: the column layer's input through ReduceFromTP
(every rank's whole x summed: p·x) and the row layer's product through CopyToTP (the partial
sums never added)."""

NOTEBOOK = "11_tensor_and_pipeline.ipynb"
GRADE_ID = "ex1-solution"
REGION = 1  # ColumnParallelLinear.forward
REPLACE = [("CopyToTP.apply(x)", "ReduceFromTP.apply(x)")]
FAILS = "ex1-test"
MESSAGE = "CopyToTP before the column layer"
WITHIN_S = 20
