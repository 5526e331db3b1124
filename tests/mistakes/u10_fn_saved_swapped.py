"""Unit 10, exercise 2a: ctx.saved_tensors unpacked in the wrong order (x and w swapped), so
each gradient uses the wrong tensor."""

NOTEBOOK = "10_sharding_and_memory.ipynb"
GRADE_ID = "ex2a-solution"
REGION = 1
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("x, w = ctx.saved_tensors", "w, x = ctx.saved_tensors"),
]
FAILS = "ex2a-test"
MESSAGE = "in the order you passed them to ctx.save_for_backward"
WITHIN_S = 10
