"""Unit 11, exercise 2: each microbatch's loss backpropagated as it is, not divided by m: the
accumulated gradients are m times the batch's."""

NOTEBOOK = "11_tensor_and_pipeline.ipynb"
GRADE_ID = "ex2-solution"
REPLACE = [("(loss / m).backward()", "loss.backward()")]
FAILS = "ex2-test"
MESSAGE = "divide each microbatch's loss by m"
WITHIN_S = 30
