"""No timeout: a missing rank would block the others for torch's default 30 minutes."""

NOTEBOOK = "00_cluster_tour.ipynb"
GRADE_ID = "ex1-solution"
BODY = '''
dist.init_process_group(backend="gloo", init_method=f"tcp://{master_addr}:{master_port}",
                        rank=rank, world_size=world_size)
t = torch.ones(1)
dist.all_reduce(t)
return float(t.item())
'''
FAILS = "ex1-test"
MESSAGE = "pass timeout=datetime.timedelta(seconds=timeout_s)"
WITHIN_S = 15
