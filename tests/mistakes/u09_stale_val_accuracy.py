"""Unit 9, exercise 2: the validation accuracy is computed before the epoch's training, so the
score reported is the previous epoch's model's."""

NOTEBOOK = "09_capstone.ipynb"
GRADE_ID = "ex2-solution"
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("""\
    sampler.set_epoch(epoch)
""",
     """\
    sampler.set_epoch(epoch)
    val = train.evaluate(ddp.module, val_x.to(device), val_y.to(device))
"""),
    ("""\
    val = train.evaluate(ddp.module, val_x.to(device), val_y.to(device))
    save_checkpoint(ddp, opt, epoch + 1, ckpt_path)
""",
     """\
    save_checkpoint(ddp, opt, epoch + 1, ckpt_path)
"""),
]
FAILS = "ex2-test"
MESSAGE = "after the epoch's training"
WITHIN_S = 30
