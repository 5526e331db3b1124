"""Unit 10, exercise 2: the forward keeps the gathered full weights on ctx for backward; every
layer's full weights stay alive until backward (the memory FSDP is there to save)."""

NOTEBOOK = "10_sharding_and_memory.ipynb"
GRADE_ID = "ex2-solution"
BODY = """
full = fsdp.gather(i, shard)
y = fsdp.run_layer(i, full, x)
ctx.save_for_backward(x, shard)
ctx.fsdp, ctx.i, ctx.full = fsdp, i, full
return y
"""
FAILS = "ex2-test"
MESSAGE = "not the full weights"
WITHIN_S = 30
