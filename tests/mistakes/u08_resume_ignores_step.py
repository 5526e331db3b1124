"""Unit 8, exercise 3: the resume loads the weights but returns 0, so after torchrun's restart
the job trains every step again from the start."""

NOTEBOOK = "08_hangs_and_faults.ipynb"
GRADE_ID = "ex3-resume-solution"
BODY = """
if os.path.exists(path):
    state = torch.load(path, weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
return 0
"""
FAILS = "ex3-test"
MESSAGE = "return the checkpoint's 'step'"
WITHIN_S = 30
