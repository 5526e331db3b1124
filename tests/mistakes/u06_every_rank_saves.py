"""Unit 6, exercise 3: every rank saves the checkpoint (no `if rank == 0`): the ranks write over
each other's file."""

NOTEBOOK = "06_two_hosts.ipynb"
GRADE_ID = "ex3-solution"
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("""\
    if rank == 0:  # every rank holds the same weights: one writer
        save_checkpoint(args.checkpoint, model, opt, args.steps)""",
     """\
    save_checkpoint(args.checkpoint, model, opt, args.steps)"""),
]
FAILS = "ex3-test"
MESSAGE = "save only on rank 0"
WITHIN_S = 30
