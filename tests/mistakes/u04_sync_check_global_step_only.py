"""Unit 4, exercise 4: a "synchronous?" check that only compares the workers' global steps
(asynchronous runs agree on them too)."""

NOTEBOOK = "04_tf_classic_ps.ipynb"
GRADE_ID = "ex4-solution"
BODY = """
return len({r["global_step"] for r in runs}) == 1
"""
FAILS = "ex4-test"
MESSAGE = "also check the sum of the local steps"
WITHIN_S = 30
