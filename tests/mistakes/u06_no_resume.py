"""Unit 6, exercise 3: the checkpoint is saved but never loaded: run again, the job starts over
at step 0."""

NOTEBOOK = "06_two_hosts.ipynb"
GRADE_ID = "ex3-solution"
BODY = """
def device_for(env, cuda_available):
    if cuda_available:
        return torch.device("cuda", int(env["LOCAL_RANK"]))  # GPUs are numbered per host
    return torch.device("cpu")


def reduce_metrics(loss_sum, correct, count, device):
    totals = torch.tensor([loss_sum, correct, count], dtype=torch.float64, device=device)
    dist.all_reduce(totals)  # SUM over every rank, on the training device
    loss_sum, correct, count = totals.tolist()
    return {"loss": loss_sum / count, "accuracy": correct / count}


def main(argv=None):
    args = parse_args(argv)
    device = device_for(os.environ, torch.cuda.is_available())
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method="env://",
                            timeout=datetime.timedelta(seconds=args.timeout))
    rank = dist.get_rank()
    model = make_model().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    start = 0
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    report(event="start", step=start, local_rank=int(os.environ["LOCAL_RANK"]),
           world_size=dist.get_world_size(), device=str(device))
    metrics = {}
    for step in range(start, args.steps):
        x, y = (t.to(device) for t in batch_of(step, rank))
        opt.zero_grad()
        out = ddp(x)
        loss = F.cross_entropy(out, y)
        loss.backward()
        opt.step()
        metrics = reduce_metrics(loss.item() * len(y), (out.argmax(1) == y).sum().item(),
                                 len(y), device)
    if rank == 0:  # every rank holds the same weights: one writer
        save_checkpoint(args.checkpoint, model, opt, args.steps)
    dist.barrier()  # nobody leaves before the checkpoint exists
    report(event="done", step=args.steps, **metrics)
    dist.destroy_process_group()
"""
FAILS = "ex3-test"
MESSAGE = "call load_checkpoint(args.checkpoint, model, opt) before training"
WITHIN_S = 30
