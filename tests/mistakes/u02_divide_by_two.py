"""The gradients divided by a typed 2 instead of ``world_size``: right on 2 ranks only, so the
test's 3-rank run (a short-lived side cluster when the notebook has 2 ranks) catches it."""

NOTEBOOK = "02_data_parallel_from_scratch.ipynb"
GRADE_ID = "ex1-solution"
BODY = '''
opt.zero_grad()
loss = F.cross_entropy(model(xb), yb)
loss.backward()
for prm in model.parameters():
    if prm.grad is None:
        continue
    dist.all_reduce(prm.grad, op=dist.ReduceOp.SUM)
    prm.grad /= 2
opt.step()
logged = loss.detach().clone()
dist.all_reduce(logged)
return float(logged) / world_size
'''
FAILS = "ex1-test-step"
MESSAGE = "never by a number you typed"
WITHIN_S = 30
