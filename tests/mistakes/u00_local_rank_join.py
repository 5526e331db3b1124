"""rank=local_rank in init_process_group: on one host (2 engines) local rank equals rank and the
group forms; on two hosts two processes claim rank 0. The test's own 4 ranks on two simulated
hosts show it."""

NOTEBOOK = "00_cluster_tour.ipynb"
GRADE_ID = "ex1-solution"
BODY = '''
dist.init_process_group(backend="gloo", init_method=f"tcp://{master_addr}:{master_port}",
                        rank=local_rank, world_size=world_size,
                        timeout=datetime.timedelta(seconds=timeout_s))
t = torch.ones(1)
dist.all_reduce(t)
return float(t.item())
'''
FAILS = "ex1-test"
MESSAGE = "use rank, not local_rank"
WITHIN_S = 30
