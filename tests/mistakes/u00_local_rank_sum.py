"""(local_rank + 1)**2 where rank belongs: right on one host, 1 + 4 + 1 + 4 = 10 instead of 30 on
two hosts of two ranks each."""

NOTEBOOK = "00_cluster_tour.ipynb"
GRADE_ID = "ex2-solution"
BODY = '''
t = torch.tensor([float(local_rank + 1) ** 2])
dist.all_reduce(t, op=dist.ReduceOp.SUM)
return float(t.item())
'''
FAILS = "ex2-test"
MESSAGE = "use rank, not local_rank"
WITHIN_S = 30
