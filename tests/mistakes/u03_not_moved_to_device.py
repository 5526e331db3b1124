"""Unit 3, exercise 2: ``DDP(model)`` without ``model.to(device)``: on the CPU nothing shows,
so the test also calls wrap_ddp with ``device`` set to the meta device and sees the model
stay on the CPU."""

NOTEBOOK = "03_pytorch_ddp.ipynb"
GRADE_ID = "ex2-solution"
BODY = """
return DDP(model)
"""
FAILS = "ex2-test"
MESSAGE = "call model = model.to(device) before wrapping"
WITHIN_S = 30
