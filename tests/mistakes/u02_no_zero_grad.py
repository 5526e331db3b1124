"""No opt.zero_grad(): backward() adds into .grad, so the previous step's gradient piles up."""

NOTEBOOK = "02_data_parallel_from_scratch.ipynb"
GRADE_ID = "ex1-solution"
BODY = '''
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
MESSAGE = "call opt.zero_grad() at the start of every step"
WITHIN_S = 20
