"""Unit 5, exercise 1: the task described with the argument names (``task_type``,
``task_index``) instead of TF_CONFIG's keys ``type`` and ``index``."""

NOTEBOOK = "05_tf2_parameter_server_strategy.ipynb"
GRADE_ID = "ex1-solution"
BODY = """
return {"cluster": spec, "task": {"task_type": task_type, "task_index": task_index}}
"""
FAILS = "ex1-test"
MESSAGE = '"task": {"type": task_type, "index": task_index}'
WITHIN_S = 30
