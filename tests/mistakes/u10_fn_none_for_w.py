"""Unit 10, exercise 2a: None returned for w, an input that needs a gradient (None is for the
inputs that are not tensors)."""

NOTEBOOK = "10_sharding_and_memory.ipynb"
GRADE_ID = "ex2a-solution"
REGION = 1
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("ctx.scale * grad_y * x, None", "None, None"),
]
FAILS = "ex2a-test"
MESSAGE = "None is only for an input that is not a tensor"
WITHIN_S = 10
