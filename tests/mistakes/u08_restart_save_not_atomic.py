"""Unit 8, exercise 3: rank 0 saves straight onto the checkpoint; a kill in the middle of the
save leaves half a file, and the restarted job cannot resume."""

NOTEBOOK = "08_hangs_and_faults.ipynb"
GRADE_ID = "ex3-save-solution"
BODY = """
if rank == 0:
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "step": step}, path)
"""
FAILS = "ex3-test"
MESSAGE = "save to a temporary file, then os.replace"
WITHIN_S = 30
