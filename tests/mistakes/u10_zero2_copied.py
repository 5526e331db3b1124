"""Unit 10, exercise 1b: the reduced piece copied into self.grad instead of added: with two
backward passes before a step (gradient accumulation) only the second one counts."""

NOTEBOOK = "10_sharding_and_memory.ipynb"
GRADE_ID = "ex1b-solution"
REGION = 1  # reduce_gradient()
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("self.grad[offset:offset + c] += out", "self.grad[offset:offset + c] = out"),
]
FAILS = "ex1b-test"
MESSAGE = "add it into its piece of self.grad"
WITHIN_S = 30
