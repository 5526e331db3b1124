"""Unit 4, exercise 4: the sum rule written for the default 2 workers (``2 * steps - 2``):
right on 2 workers only."""

NOTEBOOK = "04_tf_classic_ps.ipynb"
GRADE_ID = "ex4-solution"
BODY = """
steps_seen = {r["global_step"] for r in runs}
agree = len(steps_seen) == 1 and min(steps_seen) >= steps
return agree and sum(r["local_steps"] for r in runs) >= 2 * steps - 2
"""
FAILS = "ex4-test"
MESSAGE = "n = len(runs)"
WITHIN_S = 30
