"""Unit 10, exercise 1b: the gathered vector read as if each parameter's pieces lay together
(as ZeRO-1's flat layout has them), not one piece per rank in column block [offset, offset + c)."""

NOTEBOOK = "10_sharding_and_memory.ipynb"
GRADE_ID = "ex1b-solution"
REGION = 2  # step()
REPLACE = [  # (in the solution, becomes): the mistake as a change of working code
    ("prm.copy_(blocks[:, offset:offset + c].reshape(-1)[:prm.numel()].view_as(prm))",
     "prm.copy_(full[offset * self.world_size:offset * self.world_size + prm.numel()]"
     ".view_as(prm))"),
]
FAILS = "ex1b-test"
MESSAGE = "column block [offset, offset + c)"
WITHIN_S = 30
