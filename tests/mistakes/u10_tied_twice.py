"""Unit 10, exercise 1: a tied weight named twice is kept twice; the optimizer holds its state
twice (the weights still match, since both copies get the same update)."""

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
self.params = [prm for prm in params if prm.requires_grad]"""),
]
FAILS = "ex1-test"
MESSAGE = "count a tied weight once"
WITHIN_S = 30
