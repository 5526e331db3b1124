"""Unit 10, exercise 2a: x and w kept as ctx attributes instead of ctx.save_for_backward (the
gradients are right; autograd neither tracks nor checks them, the habit exercise 2 must not
have)."""

NOTEBOOK = "10_sharding_and_memory.ipynb"
GRADE_ID = "ex2a-solution"
BODY = """
ctx.x, ctx.w = x, w
ctx.scale = scale
return scale * x * w
"""
FAILS = "ex2a-test"
MESSAGE = "call ctx.save_for_backward(x, w) in forward"
WITHIN_S = 10
