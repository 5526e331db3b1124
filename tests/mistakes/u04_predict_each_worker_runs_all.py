"""Unit 4, asynchronous prediction: each worker assumed to run all 200 steps (400 together),
as if each had its own step counter."""

NOTEBOOK = "04_tf_classic_ps.ipynb"
GRADE_ID = "predict-solution"
BODY = """
PREDICTED_TOTAL_STEPS = 400
"""
FAILS = "predict-test"
MESSAGE = "StopAtStepHook reads global_step"
WITHIN_S = 30
