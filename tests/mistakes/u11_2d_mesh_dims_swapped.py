"""Unit 11, exercise 3: tensor parallelism over the mesh's dp dimension and FSDP over tp: the
ranks of a tensor-parallel group hold different batches."""

NOTEBOOK = "11_tensor_and_pipeline.ipynb"
GRADE_ID = "ex3-solution"
REPLACE = [('parallelize_module(block, mesh["tp"]', 'parallelize_module(block, mesh["dp"]'),
           ('fully_shard(block, mesh=mesh["dp"])', 'fully_shard(block, mesh=mesh["tp"])')]
FAILS = "ex3-test"
MESSAGE = 'on mesh["tp"]'
WITHIN_S = 30
