"""Sending to the left neighbour and receiving from the right, with the chunk schedule of a
rightward ring. With 2 ranks left and right are the same rank, so it passes there."""

NOTEBOOK = "01_collectives.ipynb"
GRADE_ID = "ex1-solution"
BODY = '''
p, r = world_size, rank
flat = t.view(-1)
if p == 1 or flat.numel() == 0:
    return 0
bounds = chunk_bounds(flat.numel(), p)
right, left = (r - 1) % p, (r + 1) % p
need = bounds[0][1] - bounds[0][0]          # the largest chunk
scratch = _scratch.get(t.dtype)
if scratch is None or scratch.numel() < need:
    # A fresh 32 MiB buffer per call costs page faults on first touch (~10-20 ms here);
    # like the libraries, allocate once and reuse.
    scratch = _scratch[t.dtype] = torch.empty(need, dtype=t.dtype)
sent = 0

def exchange(send_chunk, recv_into):
    # One ring step: post both sides, then wait, so no rank blocks its neighbour.
    reqs = []
    if send_chunk.numel():
        reqs.append(dist.isend(send_chunk, right))
    if recv_into.numel():
        reqs.append(dist.irecv(recv_into, left))
    for q in reqs:
        q.wait()
    return send_chunk.numel() * t.element_size()

for s in range(p - 1):  # reduce-scatter: add the left neighbour's partial sums
    (a, b), (c, d) = bounds[(r - s) % p], bounds[(r - s - 1) % p]
    incoming = scratch[: d - c]
    sent += exchange(flat[a:b], incoming)
    flat[c:d] += incoming
for s in range(p - 1):  # all-gather: pass the finished chunks around
    (a, b), (c, d) = bounds[(r + 1 - s) % p], bounds[(r - s) % p]
    sent += exchange(flat[a:b], flat[c:d])
return sent
'''
FAILS = "ex1-test-correct"
MESSAGE = "Send to the right"
WITHIN_S = 30
