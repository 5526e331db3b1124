"""Whole buffers passed around the ring: the right sum, but every message is the full buffer
instead of one chunk."""

NOTEBOOK = "01_collectives.ipynb"
GRADE_ID = "ex1-solution"
BODY = '''
flat = t.view(-1)
got = torch.empty_like(flat)
sent = 0
acc = flat.clone()
cur = flat.clone()
for _ in range(world_size - 1):  # pass whole buffers around the ring
    reqs = [dist.isend(cur, (rank + 1) % world_size), dist.irecv(got, (rank - 1) % world_size)]
    for q in reqs:
        q.wait()
    sent += cur.numel() * cur.element_size()
    acc += got
    cur = got.clone()
flat.copy_(acc)
return sent
'''
FAILS = "ex1-test-bytes"
MESSAGE = "each step may move one chunk"
WITHIN_S = 20
