"""Unit 3, exercise 2: the model is moved to the device but never wrapped in DDP."""

NOTEBOOK = "03_pytorch_ddp.ipynb"
GRADE_ID = "ex2-solution"
BODY = """
return model.to(device)
"""
FAILS = "ex2-test"
MESSAGE = "return DDP(model), not the model itself"
WITHIN_S = 30
