"""Unit 10, exercise 1b: each gradient reduce-scattered in its hook but the full one kept: the
weights are right, and every full gradient is alive at the end of backward, as under ZeRO-1."""

NOTEBOOK = "10_sharding_and_memory.ipynb"
GRADE_ID = "ex1b-solution"
REGION = 1  # reduce_gradient()
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("self.grad[offset:offset + c] += out\nprm.grad = None", "self.grad[offset:offset + c] += out"),
]
FAILS = "ex1b-test"
MESSAGE = "then set prm.grad = None"
WITHIN_S = 30
