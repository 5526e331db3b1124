"""Unit 3's DDP training as a script: what ``torchrun`` and a Slurm job run (unit 6).

The same model (:func:`course_utils.torch_dist.train.original_cnn`), the same sampler, optimizer and
metrics as ``03_pytorch_ddp``, on the offline digits at 3x32x32 (:func:`course_utils.data.
sklearn_digits`), so it runs without network on any machine. ``torchrun`` sets ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``GROUP_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``; the script
reads them through ``init_process_group("env://")``. On GPUs the group is
``"cpu:gloo,cuda:nccl"`` and every collective's tensor sits on this rank's GPU. One host, two
processes::

    torchrun --standalone --nproc-per-node=2 -m course_utils.torch_dist.ddp_script --steps 20

Two hosts (run the same line on each; ``hostA`` is where the c10d rendezvous store listens)::

    torchrun --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d \\
        --rdzv-endpoint=hostA:29400 --rdzv-id=job1 -m course_utils.torch_dist.ddp_script

Every rank prints one JSON line last: its rank, host, the final loss and a checksum of its
weights (equal on every rank when DDP kept the replicas in sync). The ranks of a host share one
stdout, so each line goes out in a single ``write`` (:func:`emit`) and never interleaves.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import socket
import sys
import time
from collections.abc import Sequence
from typing import Any

from ..settings import env_threads

#: Environment variables a launcher (torchrun, srun + torchrun) must set.
REQUIRED_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m course_utils.torch_dist.ddp_script",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=10, help="optimizer steps (default 10)")
    p.add_argument("--batch", type=int, default=32, help="per-rank batch size (default 32)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0, help="model init and sampler seed")
    p.add_argument("--backend", default="auto", choices=("auto", "gloo", "nccl"),
                   help="auto: nccl when this rank has its own GPU, else gloo")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds a collective (and the rendezvous) may wait (default 60)")
    p.add_argument("--checkpoint", default="",
                   help="if set, rank 0 saves the final model here (a path every host sees)")
    return p.parse_args(argv)


def missing_env(env: dict[str, str] | None = None) -> list[str]:
    """The launcher variables that are not set (empty when torchrun started us)."""
    env = dict(os.environ) if env is None else env
    return [k for k in REQUIRED_ENV if not env.get(k)]


def weights_checksum(flat: Any) -> str:
    """A short hex digest of a flat float64 weight tensor: equal digests, equal weights."""
    import numpy as np

    arr = np.ascontiguousarray(flat.detach().cpu().numpy() if hasattr(flat, "detach") else flat,
                               dtype=np.float64)
    return hashlib.sha256(arr.tobytes()).hexdigest()[:16]


def gpu_index(local_rank: int, local_world_size: int | None = None) -> int | None:
    """The CUDA device index this process drives, or None (no GPU of its own: use gloo).

    torchrun's ranks on a host see the same GPUs, ``cuda:0 .. cuda:N-1``: local rank ``i``
    drives ``cuda:i`` when there are at least as many GPUs as local ranks. A process pinned to
    one GPU (``CUDA_VISIBLE_DEVICES`` naming one device, as the course's engines are) sees it as
    ``cuda:0`` whatever its local rank, so the index is 0 there.
    """
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0) if local_world_size is None \
        else local_world_size
    if count == 0:
        return None
    if count >= max(ranks_here, local_rank + 1):
        return local_rank
    visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    return 0 if count == 1 and len(visible) == 1 and ranks_here <= 1 else None


def pick_backend(requested: str, local_rank: int) -> str:
    """``auto`` -> nccl when this rank has a GPU of its own (:func:`gpu_index`), gloo otherwise."""
    if requested != "auto":
        return requested
    return "nccl" if gpu_index(local_rank) is not None else "gloo"


def group_backend(backend: str) -> str:
    """The backend string ``init_process_group`` gets: for NCCL the device-mapped
    ``"cpu:gloo,cuda:nccl"`` (as ``cu.start_torch()`` builds it), so a CPU tensor (a metric, a
    flag) has a backend too; an NCCL-only group raises ``No backend type associated with device
    type cpu`` on one."""
    from .process_group import pg_backend

    return pg_backend(backend)


def train_steps(steps: int, batch: int = 32, lr: float = 0.05, seed: int = 0,
                device: Any = None) -> dict[str, Any]:
    """*Collective.* Unit 3's DDP loop for ``steps`` steps in the current process group.

    The model is :func:`course_utils.torch_dist.train.original_cnn` (``seed``) wrapped in DDP, the
    data the offline digits at 3x32x32 sharded by ``DistributedSampler`` (``set_epoch`` every
    epoch), SGD with momentum 0.9. Returns the last reduced metrics, the replica spread and a
    checksum of this rank's weights (equal on every rank when DDP kept the replicas equal).
    Runs in a script under torchrun (:func:`train`) and on the engines (unit 6).
    """
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    from course_utils import data
    from course_utils.torch_dist import train as tr

    device = device or torch.device("cpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    raw = data.sklearn_digits(train=True)
    x = (torch.from_numpy(raw.x) - 0.5) / 0.5
    y = torch.from_numpy(raw.y)
    dataset = TensorDataset(x, y)
    # device_ids: the index this process sees its GPU by (0 when pinned to one), not its rank
    model = DDP(tr.original_cnn(seed=seed).to(device),
                device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True,
                                 seed=seed, drop_last=True)
    loader = DataLoader(dataset, batch_size=batch, sampler=sampler)
    step, epoch, metrics = 0, 0, {"loss": float("nan"), "accuracy": float("nan")}
    t0 = time.perf_counter()
    while step < steps:
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            xb, yb = xb.to(device), yb.to(device)
            opt.zero_grad()
            out = model(xb)
            loss = F.cross_entropy(out, yb)
            loss.backward()  # DDP all-reduces the gradient buckets here
            opt.step()
            metrics = tr.reduce_metrics(loss.item() * len(yb), int((out.argmax(1) == yb).sum()),
                                        len(yb), device=device)
            step += 1
            if step >= steps:
                break
        epoch += 1
    train_s = time.perf_counter() - t0
    return {
        "rank": rank, "world_size": world, "host": socket.gethostname(), "data": raw.name,
        "steps": step, "loss": metrics["loss"], "accuracy": metrics["accuracy"],
        "checksum": weights_checksum(tr.flat_params(model.module)),
        "replica_spread": tr.replica_spread(model.module), "train_s": round(train_s, 3),
        "model": model,
    }


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Join the process group torchrun prepared, train ``args.steps`` steps, return a summary."""
    import torch
    import torch.distributed as dist

    local_rank = int(os.environ["LOCAL_RANK"])
    threads = env_threads()
    if threads:
        torch.set_num_threads(threads)
    backend = pick_backend(args.backend, local_rank)
    device = torch.device("cpu")
    if backend == "nccl":
        index = gpu_index(local_rank)
        if index is None:
            raise SystemExit(f"ddp_script: --backend nccl, but local rank {local_rank} has no GPU "
                             "of its own; use --backend auto or gloo")
        torch.cuda.set_device(index)  # before the group exists: NCCL binds this rank to it
        device = torch.device("cuda", index)
    t0 = time.perf_counter()
    dist.init_process_group(group_backend(backend), init_method="env://",
                            timeout=datetime.timedelta(seconds=args.timeout))
    joined = time.perf_counter() - t0
    try:
        res = train_steps(args.steps, args.batch, args.lr, args.seed, device)
        model = res.pop("model")
        if args.checkpoint and res["rank"] == 0:
            tmp = args.checkpoint + ".tmp"
            torch.save({"model": model.module.state_dict(), "steps": res["steps"]}, tmp)
            os.replace(tmp, args.checkpoint)
        dist.barrier()
        return {
            **res, "local_rank": local_rank,
            "node_rank": int(os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", "0"))),
            "master": f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
            "backend": backend, "join_s": round(joined, 3),
        }
    finally:
        dist.destroy_process_group()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    missing = missing_env()
    if missing:
        print(f"ddp_script: {', '.join(missing)} not set: start this script with torchrun, e.g.\n"
              "  torchrun --standalone --nproc-per-node=2 -m course_utils.torch_dist.ddp_script",
              file=sys.stderr)
        return 2
    emit(train(args))
    return 0


def emit(result: dict[str, Any], fd: int | None = None) -> None:
    """Write ``result`` as one JSON line with a single ``os.write``.

    ``print`` may write the text and its newline separately (always, when Python runs
    unbuffered), so two ranks sharing a pipe can produce ``{...}{...}`` on one line. A single
    write of less than ``PIPE_BUF`` (4096) bytes to a pipe is atomic, and our line is ~300.
    """
    sys.stdout.flush()
    os.write(sys.stdout.fileno() if fd is None else fd, (json.dumps(result) + "\n").encode())


if __name__ == "__main__":
    code = main()
    # Leave without the interpreter's and C++'s exit-time clean-up, as elastic_demo does: with
    # torch 2.14 a rank sometimes aborted there after its work was done (SIGABRT, "terminate
    # called without an active exception"; unit 6's torchrun cell failed 1 run in 5), and
    # torchrun then reported the job failed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
