"""The original PyTorch program's call: rank=0 on every host. Two ranks claim rank 0; one gets
'address already in use' at once, the other waits for its timeout."""

NOTEBOOK = "00_cluster_tour.ipynb"
GRADE_ID = "ex1-solution"
BODY = '''
dist.init_process_group(backend="gloo", init_method=f"tcp://{master_addr}:{master_port}",
                        rank=0, world_size=world_size,
                        timeout=datetime.timedelta(seconds=timeout_s))
t = torch.ones(1)
dist.all_reduce(t)
return float(t.item())
'''
FAILS = "ex1-test"
MESSAGE = "two ranks claimed rank 0"
WITHIN_S = 15
