"""Unit 11, exercise 1a: f's backward averages the partial gradients instead of adding them
(the habit of DDP's gradients, wrong here: each rank's part is a term of the sum)."""

NOTEBOOK = "11_tensor_and_pipeline.ipynb"
GRADE_ID = "ex1a-solution"
REGION = 1  # CopyToTP.backward
REPLACE = [("dist.all_reduce(grad, op=dist.ReduceOp.SUM)",
            "dist.all_reduce(grad, op=dist.ReduceOp.AVG)")]
FAILS = "ex1a-test"
MESSAGE = "sum, not average"
WITHIN_S = 15
