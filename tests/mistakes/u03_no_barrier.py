"""Unit 3, exercise 3: no barrier; the other ranks return before rank 0's file exists."""

NOTEBOOK = "03_pytorch_ddp.ipynb"
GRADE_ID = "ex3-solution"
BODY = """
if rank == 0:
    torch.save({"model": ddp_model.module.state_dict(), "optimizer": optimizer.state_dict(),
                "epoch": epoch}, path + ".tmp")
    os.replace(path + ".tmp", path)
"""
FAILS = "ex3-test"
MESSAGE = "end with dist.barrier() on every rank"
WITHIN_S = 30
