"""Unit 10, exercise 2: the forward keeps the gathered full parameters on ctx for backward;
every unit's full parameters stay alive until backward (the memory FSDP is there to save)."""

NOTEBOOK = "10_sharding_and_memory.ipynb"
GRADE_ID = "ex2-solution"
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("""\
ctx.fsdp, ctx.i = fsdp, i""",
     """\
ctx.fsdp, ctx.i, ctx.fulls = fsdp, i, fulls"""),
]
FAILS = "ex2-test"
MESSAGE = "not the full parameters"
WITHIN_S = 30
