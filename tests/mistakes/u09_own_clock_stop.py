"""Unit 9, exercise 2: each rank decides the budget stop from its own clock; when the clocks
disagree one rank leaves while another waits in the next epoch's all_reduce."""

NOTEBOOK = "09_capstone.ipynb"
GRADE_ID = "ex2-solution"
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("""\
    elapsed = torch.tensor([time.time() - start])
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)   # one decision, the same on every rank
    if elapsed.item() > budget_s:""",
     """\
    if time.time() - start > budget_s:"""),
]
FAILS = "ex2-test"
MESSAGE = 'dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)'
WITHIN_S = 30
