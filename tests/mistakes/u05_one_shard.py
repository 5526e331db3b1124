"""Unit 5, exercise 2: a partitioner that never splits (``max_shards=1``)."""

NOTEBOOK = "05_tf2_parameter_server_strategy.ipynb"
GRADE_ID = "ex2-solution"
BODY = """
return tf.distribute.experimental.partitioners.MinSizePartitioner(
    min_shard_bytes=64, max_shards=1)
"""
FAILS = "ex2-test"
MESSAGE = "max_shards=num_ps"
WITHIN_S = 30
