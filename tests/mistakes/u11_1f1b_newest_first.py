"""Unit 11, exercise 2b: the newest kept microbatch's backward first (a stack, not a queue):
each gradient received from the next stage is applied to another microbatch's activations."""

NOTEBOOK = "11_tensor_and_pipeline.ipynb"
GRADE_ID = "ex2b-solution"
REPLACE = [("x, y, i = kept.pop(0)", "x, y, i = kept.pop()")]
FAILS = "ex2b-test"
MESSAGE = "oldest first"
WITHIN_S = 30
