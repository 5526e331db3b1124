"""Unit 10, exercise 2a: backward returns a gradient for x and w only, none for scale (forward
has three inputs, so autograd wants three gradients)."""

NOTEBOOK = "10_sharding_and_memory.ipynb"
GRADE_ID = "ex2a-solution"
REGION = 1
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("ctx.scale * grad_y * x, None", "ctx.scale * grad_y * x"),
]
FAILS = "ex2a-test"
MESSAGE = "return one gradient per input of forward"
WITHIN_S = 10
