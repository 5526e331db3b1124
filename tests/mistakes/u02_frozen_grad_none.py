"""All-reduce every parameter's .grad, frozen ones too: a frozen parameter (requires_grad=False)
has no gradient, so ``dist.all_reduce(None)`` raises (torch's DDP skips such parameters)."""

NOTEBOOK = "02_data_parallel_from_scratch.ipynb"
GRADE_ID = "ex1-solution"
BODY = '''
opt.zero_grad()
loss = F.cross_entropy(model(xb), yb)
loss.backward()
for prm in model.parameters():
    dist.all_reduce(prm.grad, op=dist.ReduceOp.SUM)
    prm.grad /= world_size
opt.step()
logged = loss.detach().clone()
dist.all_reduce(logged)
return float(logged) / world_size
'''
FAILS = "ex1-test-step"
MESSAGE = "skip a parameter whose .grad is None"
WITHIN_S = 20
