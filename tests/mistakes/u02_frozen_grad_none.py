"""All-reduce every parameter's .grad, frozen ones too: a frozen parameter (requires_grad=False)
has no gradient, so ``dist.all_reduce(None)`` raises (torch's DDP skips such parameters)."""

NOTEBOOK = "02_data_parallel_from_scratch.ipynb"
GRADE_ID = "ex1-solution"
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("""\
    if prm.grad is None:   # frozen (requires_grad=False): no gradient, like DDP skips it
        continue
""",
     """\
"""),
]
FAILS = "ex1-test-step"
MESSAGE = "skip a parameter whose .grad is None"
WITHIN_S = 20
