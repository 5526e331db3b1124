"""Unit 3, exercise 3: ``ddp_model.state_dict()`` saved; its keys start with ``module.`` and a
plain model refuses them (before: the exercise passed and resuming failed two cells later)."""

NOTEBOOK = "03_pytorch_ddp.ipynb"
GRADE_ID = "ex3-solution"
BODY = """
if rank == 0:
    torch.save({"model": ddp_model.state_dict(), "optimizer": optimizer.state_dict(),
                "epoch": epoch}, path + ".tmp")
    os.replace(path + ".tmp", path)
dist.barrier()
"""
FAILS = "ex3-test"
MESSAGE = "save ddp_model.module.state_dict()"
WITHIN_S = 30
