"""Unit 10, exercise 2a: backward returns the derivative of the output, not of the loss (grad_y,
the gradient that arrives from above, is left out of the chain rule)."""

NOTEBOOK = "10_sharding_and_memory.ipynb"
GRADE_ID = "ex2a-solution"
REGION = 1
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("return ctx.scale * grad_y * w, ctx.scale * grad_y * x, None",
     "return ctx.scale * w, ctx.scale * x, None"),
]
FAILS = "ex2a-test"
MESSAGE = "multiply by grad_y"
WITHIN_S = 10
