"""Unit 3, exercise 4: ``torch.load(path)`` without ``map_location``: torch puts each tensor
back on the device it was saved from; the test's checkpoint says cuda:1, which this machine
does not have, so torch refuses it (on a CPU-only machine too)."""

NOTEBOOK = "03_pytorch_ddp.ipynb"
GRADE_ID = "ex4-solution"
BODY = """
state = torch.load(path, weights_only=True)
model.load_state_dict(state["model"])
optimizer.load_state_dict(state["optimizer"])
return state["epoch"]
"""
FAILS = "ex4-test"
MESSAGE = "pass map_location=device to torch.load"
WITHIN_S = 30
