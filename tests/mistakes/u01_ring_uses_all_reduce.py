"""Not a ring at all: dist.all_reduce with a made-up byte count (caught by the hidden test that
switches the built-in collectives off)."""

NOTEBOOK = "01_collectives.ipynb"
GRADE_ID = "ex1-solution"
BODY = '''
dist.all_reduce(t)
return int(2 * (world_size - 1) * t.numel() * t.element_size() // world_size)
'''
FAILS = "ex1-test-correct"
MESSAGE = "isend/irecv only"
WITHIN_S = 20
