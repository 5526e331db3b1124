"""Unit 3, exercise 2: ``device_ids=[local_rank]`` on a CPU model (torch's own message names
"single-device/multiple-device GPU modules or CPU modules" and confuses more than it helps)."""

NOTEBOOK = "03_pytorch_ddp.ipynb"
GRADE_ID = "ex2-solution"
BODY = """
return DDP(model.to(device), device_ids=[local_rank])
"""
FAILS = "ex2-test"
MESSAGE = "call DDP(model) with no device_ids"
WITHIN_S = 30
