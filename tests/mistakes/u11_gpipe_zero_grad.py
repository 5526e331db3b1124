"""Unit 11, exercise 2: the gradients zeroed before each microbatch's backward, as in a plain
training loop: only the last microbatch's gradient is left, none accumulated."""

NOTEBOOK = "11_tensor_and_pipeline.ipynb"
GRADE_ID = "ex2-solution"
REPLACE = [("    x, y = kept[i]\n", "    x, y = kept[i]\n    stage.zero_grad()\n")]
FAILS = "ex2-test"
MESSAGE = "no zero_grad inside the step"
WITHIN_S = 30
