"""The training script of ``08_hangs_and_faults``'s elastic drill, run by ``torchrun``.

Every start it resumes from ``<ckpt-dir>/elastic.pt`` if present; rank 1 crashes once at
``--crash-at`` (a marker file remembers that it did); rank 0 saves atomically after every step.
With ``--learner JOB`` (a cloudpickle of the learner's ``(save, resume)`` functions, exercise 3)
the resume and the save are the learner's: ``resume(model, optimizer, path) -> step`` on every
start, ``save(model, optimizer, step, path, rank)`` on every rank after every step.
Prints ``[elastic] ...`` lines that :func:`course_utils.torch_dist.faults.join_elastic` collects.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt-dir", required=True)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--crash-at", type=int, default=6)
    ap.add_argument("--learner", default="")
    args = ap.parse_args()

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    t_start = time.time()
    import datetime

    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # A key prefix per attempt: the store outlives a restart, and gloo must not find the
    # addresses the crashed attempt's workers published there.
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=not agent_store and rank == 0,
                          timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt{restart}", store),
                            rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    path = os.path.join(args.ckpt_dir, "elastic.pt")
    marker = os.path.join(args.ckpt_dir, "crashed-once")
    start = 0
    save = resume = None
    if args.learner:
        import cloudpickle

        with open(args.learner, "rb") as fh:
            save, resume = cloudpickle.load(fh)
        start = int(resume(model, opt, path))
    elif os.path.exists(path):
        state = torch.load(path, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = state["step"]
    ddp = DDP(model)
    if rank == 0:
        print(f"[elastic] attempt {restart}: resumed at step {start} (time {time.time():.2f}; "
              f"{time.time() - t_start:.1f} s after this process started)", flush=True)
    for step in range(start, args.steps):
        if rank == 1 and step == args.crash_at and not os.path.exists(marker):
            open(marker, "w").close()
            print(f"[elastic] rank 1 crashes at step {step} (time {time.time():.2f})", flush=True)
            os._exit(1)
        gen = torch.Generator().manual_seed(1000 * step + rank)   # the data of (step, rank)
        x, y = torch.randn(8, 16, generator=gen), torch.randint(0, 4, (8,), generator=gen)
        opt.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
        opt.step()
        if save is not None:
            save(model, opt, step + 1, path, rank)
        elif rank == 0:
            tmp = path + ".tmp"
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                        "step": step + 1}, tmp)
            os.replace(tmp, path)
        dist.barrier()
    weights = torch.cat([q.detach().reshape(-1) for q in model.parameters()])
    if rank == 0:
        print(f"[elastic] attempt {restart}: finished {args.steps} steps (time {time.time():.2f}); "
              f"weight checksum {float(weights.sum()):.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Leave without the interpreter's and C++'s exit-time clean-up: with torch 2.14 a worker
    # here sometimes aborted there, after its work was done ("terminate called without an
    # active exception", SIGABRT, in 2 of 84 runs of the drill), and torchrun then reported the
    # job failed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
