"""A ring whose every rank does a blocking send, then a blocking recv: a send/recv deadlock at
any message size on gloo (one element is enough)."""

NOTEBOOK = "01_collectives.ipynb"
GRADE_ID = "ex1-solution"
BODY = '''
p, r = world_size, rank
flat = t.view(-1)
bounds = chunk_bounds(flat.numel(), p)
right, left = (r + 1) % p, (r - 1) % p
sent = 0
for s in range(p - 1):  # reduce-scatter: send, then receive
    (a, b), (c, d) = bounds[(r - s) % p], bounds[(r - s - 1) % p]
    incoming = torch.empty(d - c, dtype=t.dtype)
    dist.send(flat[a:b], right)
    dist.recv(incoming, left)
    sent += (b - a) * t.element_size()
    flat[c:d] += incoming
for s in range(p - 1):  # all-gather: send, then receive
    (a, b), (c, d) = bounds[(r + 1 - s) % p], bounds[(r - s) % p]
    dist.send(flat[a:b], right)
    dist.recv(flat[c:d], left)
    sent += (b - a) * t.element_size()
return sent
'''
FAILS = "ex1-test-correct"
MESSAGE = "send/recv deadlock"
WITHIN_S = 20
