"""The original PyTorch program's loop: all_reduce(loss) after step(); no gradient is
exchanged, so each rank steps with its own gradient."""

NOTEBOOK = "02_data_parallel_from_scratch.ipynb"
GRADE_ID = "ex1-solution"
BODY = '''
opt.zero_grad()
loss = F.cross_entropy(model(xb), yb)
loss.backward()
opt.step()
dist.all_reduce(loss)
return float(loss) / world_size
'''
FAILS = "ex1-test-step"
MESSAGE = "all_reduce(loss) after step() exchanges nothing"
WITHIN_S = 20
