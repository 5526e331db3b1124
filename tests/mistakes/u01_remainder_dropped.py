"""Chunks of n // p elements each: the remainder is never reduced, and with a tensor shorter
than the number of ranks (n < p) every chunk is empty and nothing is summed at all."""

NOTEBOOK = "01_collectives.ipynb"
GRADE_ID = "ex1-solution"
BODY = '''
p, r = world_size, rank
flat = t.view(-1)
size = flat.numel() // p
bounds = [(i * size, (i + 1) * size) for i in range(p)]   # the last n % p elements: nowhere
right, left = (r + 1) % p, (r - 1) % p
scratch = torch.empty(size, dtype=t.dtype)
sent = 0

def exchange(send_chunk, recv_into):
    reqs = []
    if send_chunk.numel():
        reqs.append(dist.isend(send_chunk, right))
    if recv_into.numel():
        reqs.append(dist.irecv(recv_into, left))
    for q in reqs:
        q.wait()
    return send_chunk.numel() * t.element_size()

for s in range(p - 1):
    (a, b), (c, d) = bounds[(r - s) % p], bounds[(r - s - 1) % p]
    sent += exchange(flat[a:b], scratch[: d - c])
    flat[c:d] += scratch[: d - c]
for s in range(p - 1):
    (a, b), (c, d) = bounds[(r + 1 - s) % p], bounds[(r - s) % p]
    sent += exchange(flat[a:b], flat[c:d])
return sent
'''
FAILS = "ex1-test-correct"
MESSAGE = "some chunks are empty"
WITHIN_S = 20
