"""Unit 10, exercise 1: every parameter kept, the frozen one too; its .grad is None in step()."""

NOTEBOOK = "10_sharding_and_memory.ipynb"
GRADE_ID = "ex1-solution"
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("""\
self.params, seen = [], set()
for prm in params:
    if prm.requires_grad and id(prm) not in seen:
        seen.add(id(prm))
        self.params.append(prm)""",
     """\
self.params = list(params)"""),
]
FAILS = "ex1-test"
MESSAGE = "keep only trainable parameters"
WITHIN_S = 30
