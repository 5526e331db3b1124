"""Unit 10, exercise 2a: the gradients without the factor scale (the derivative of x * w, not of
scale * x * w)."""

NOTEBOOK = "10_sharding_and_memory.ipynb"
GRADE_ID = "ex2a-solution"
REGION = 1
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("return ctx.scale * grad_y * w, ctx.scale * grad_y * x, None",
     "return grad_y * w, grad_y * x, None"),
]
FAILS = "ex2a-test"
MESSAGE = "lacks the factor scale"
WITHIN_S = 10
