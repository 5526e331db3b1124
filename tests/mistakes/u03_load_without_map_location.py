"""Unit 3, exercise 4: ``torch.load(path)`` without ``map_location``: torch puts each tensor
back on the device it was saved from; the test's checkpoint says cuda:1, which this machine
does not have, so torch refuses it (on a CPU-only machine too)."""

NOTEBOOK = "03_pytorch_ddp.ipynb"
GRADE_ID = "ex4-solution"
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("""\
state = torch.load(path, map_location=device, weights_only=True)""",
     """\
state = torch.load(path, weights_only=True)"""),
]
FAILS = "ex4-test"
MESSAGE = "pass map_location=device to torch.load"
WITHIN_S = 30
