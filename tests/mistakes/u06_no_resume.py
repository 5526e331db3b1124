"""Unit 6, exercise 3: the checkpoint is saved but never loaded: run again, the job starts over
at step 0."""

NOTEBOOK = "06_two_hosts.ipynb"
GRADE_ID = "ex3-solution"
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("""\
    start = load_checkpoint(args.checkpoint, model, opt)  # 0 on the first run""",
     """\
    start = 0"""),
]
FAILS = "ex3-test"
MESSAGE = "call load_checkpoint(args.checkpoint, model, opt) before training"
WITHIN_S = 30
