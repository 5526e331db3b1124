"""Unit 10, exercise 2: the gradients reduce-scattered in their own (compute) dtype, whatever
reduce_dtype says: with bf16 compute and reduce_dtype=torch.float32 the sums are bf16's."""

NOTEBOOK = "10_sharding_and_memory.ipynb"
GRADE_ID = "ex2-solution"
REGION = 3  # reduce()
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("dtype=self.reduce_dtype or grad.dtype)", "dtype=grad.dtype)"),
]
FAILS = "ex2-test"
MESSAGE = "each gradient to self.reduce_dtype"
WITHIN_S = 30
