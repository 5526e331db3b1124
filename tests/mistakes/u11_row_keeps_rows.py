"""Unit 11, exercise 1: the row-parallel layer slices rows of the weight (dim 0), as the
column-parallel one does, instead of columns."""

NOTEBOOK = "11_tensor_and_pipeline.ipynb"
GRADE_ID = "ex1-solution"
REGION = 2  # RowParallelLinear.__init__
REPLACE = [("linear.weight.detach()[:, rank * c:(rank + 1) * c]",
            "linear.weight.detach()[rank * c:(rank + 1) * c]")]
FAILS = "ex1-test"
MESSAGE = "the row layer keeps columns (dim 1)"
WITHIN_S = 20
