"""Unit 5, prediction: W2 (1,280 B) read as "at least min_shard_bytes per shard", so 1 shard."""

NOTEBOOK = "05_tf2_parameter_server_strategy.ipynb"
GRADE_ID = "predict-solution"
BODY = """
PREDICTED_W2_SHARDS = 1
"""
FAILS = "predict-test"
MESSAGE = "one shard per min_shard_bytes started"
WITHIN_S = 30
