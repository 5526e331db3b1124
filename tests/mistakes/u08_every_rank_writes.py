"""Unit 8, exercise 3: every rank writes the checkpoint (several writers of one file race)."""

NOTEBOOK = "08_hangs_and_faults.ipynb"
GRADE_ID = "ex3-save-solution"
BODY = """
torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
           path + ".tmp")
os.replace(path + ".tmp", path)
"""
FAILS = "ex3-test"
MESSAGE = "write only when rank == 0"
WITHIN_S = 30
