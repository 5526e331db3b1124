"""Unit 10, exercise 1: shard_bounds with a floor division; the last elements belong to no rank."""

NOTEBOOK = "10_sharding_and_memory.ipynb"
GRADE_ID = "ex1a-solution"
BODY = """
chunk = numel // world_size
return rank * chunk, (rank + 1) * chunk
"""
FAILS = "ex1a-test"
MESSAGE = "chunk = math.ceil(numel / world_size)"
WITHIN_S = 10
