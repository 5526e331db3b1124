"""Unit 5, exercise 2: ``max_shards=2`` typed for this cluster's 2 ps tasks instead of
``num_ps``."""

NOTEBOOK = "05_tf2_parameter_server_strategy.ipynb"
GRADE_ID = "ex2-solution"
BODY = """
return tf.distribute.experimental.partitioners.MinSizePartitioner(
    min_shard_bytes=1024, max_shards=2)
"""
FAILS = "ex2-test"
MESSAGE = "not a fixed 2"
WITHIN_S = 30
