"""Gradients all-reduced (SUM) but never divided by the world size: steps p times too large."""

NOTEBOOK = "02_data_parallel_from_scratch.ipynb"
GRADE_ID = "ex1-solution"
BODY = '''
opt.zero_grad()
loss = F.cross_entropy(model(xb), yb)
loss.backward()
for prm in model.parameters():
    dist.all_reduce(prm.grad)
opt.step()
return float(loss)
'''
FAILS = "ex1-test-step"
MESSAGE = "divide each parameter's .grad by world_size"
WITHIN_S = 20
