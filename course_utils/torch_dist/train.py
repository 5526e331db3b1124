"""Training helpers for the PyTorch track: models, flat views, replica checks, metrics.

Introduced in ``02_data_parallel_from_scratch`` (digits MLP, batches, the single-process
reference, ``replica_spread``) and ``03_pytorch_ddp`` (``original_cnn``, ``reduce_metrics``).
Everything here runs on the engines (torch is imported lazily, so importing this module in the
notebook kernel stays cheap). Functions marked *collective* must be called by every rank.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..data import digits, shard_indices

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from torch import nn


def digits_mlp(seed: int, hidden: int = 32) -> nn.Module:
    """A 64 -> hidden -> 10 MLP for the 8x8 digits, initialised from ``seed`` only.

    The global RNG is left untouched, so two calls with the same seed give the same weights
    whatever ran before (which is what makes the notebooks re-runnable).
    """
    import torch
    from torch import nn

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(64, hidden), nn.Tanh(), nn.Linear(hidden, 10))


def original_cnn(num_classes: int = 10, seed: int | None = None) -> nn.Module:
    """The original PyTorch program's CNN for 3x32x32 images, with its one bug fixed.

    The original wrote ``nn.Linear(1600, 10)``: 1600 = 64*5*5 is the size for 28x28 inputs. On
    32x32 CIFAR-10 images the feature map is 64x6x6 = 2304, so the original crashes with a
    shape error at its first batch. ``seed`` is the random seed of the initial weights.
    Introduced in ``03_pytorch_ddp``.
    """
    import torch
    from torch import nn

    with torch.random.fork_rng():
        if seed is not None:
            torch.manual_seed(seed)
        return nn.Sequential(
            nn.Conv2d(3, 32, 3, 1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, 1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(64 * 6 * 6, num_classes),
        )



def flat_params(model: nn.Module) -> torch.Tensor:
    """All parameters as one detached 1-D float64 tensor (a copy)."""
    import torch

    return torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])


def flat_grads(model: nn.Module) -> torch.Tensor:
    """All gradients as one detached 1-D float64 tensor (zeros where a grad is None)."""
    import torch

    return torch.cat([
        (p.grad.detach() if p.grad is not None else torch.zeros_like(p)).reshape(-1).double()
        for p in model.parameters()
    ])


def replica_spread(model: nn.Module) -> float:
    """*Collective.* The largest L2 distance between any rank's parameters and rank 0's.

    0.0 means every replica holds exactly the same weights.
    """
    import torch
    import torch.distributed as dist

    mine = flat_params(model)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    return max(float((w - everyone[0]).norm()) for w in everyone)


def grad_spread(model: nn.Module) -> float:
    """*Collective.* Like :func:`replica_spread`, for the gradients: 0.0 when every rank holds
    the same gradients (synchronised), > 0 when each rank still holds its own."""
    import torch
    import torch.distributed as dist

    mine = flat_grads(model)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    return max(float((g - everyone[0]).norm()) for g in everyone)


def step_batches(n: int, rank: int, world_size: int, batch: int, steps: int,
                 seed: int = 0) -> list[np.ndarray]:
    """Indices of the mini-batch rank ``rank`` uses at each of ``steps`` steps.

    The rank's shard (``data.shard_indices`` with ``seed``) is cycled, ``batch`` items a step.
    """
    shard = shard_indices(n, rank, world_size, seed=seed)
    if batch > len(shard):
        raise ValueError(f"batch {batch} is larger than the rank's shard ({len(shard)} items)")
    per_epoch = len(shard) // batch
    return [shard[(t % per_epoch) * batch:(t % per_epoch + 1) * batch] for t in range(steps)]


def full_batches(n: int, world_size: int, batch: int, steps: int,
                 seed: int = 0) -> list[np.ndarray]:
    """The concatenation over ranks of :func:`step_batches`: what one process would see."""
    per_rank = [step_batches(n, r, world_size, batch, steps, seed) for r in range(world_size)]
    return [np.concatenate([per_rank[r][t] for r in range(world_size)]) for t in range(steps)]


def reference_sgd(steps: int, lr: float, batch_per_rank: int, world_size: int,
                  seed: int = 0, init_seed: int = 0) -> np.ndarray:
    """One process, no torch.distributed: train :func:`digits_mlp` (``init_seed``) with plain
    SGD on the concatenated full batch of every step; returns the final flat weights.

    This is the ground truth that correct data parallelism must reproduce (unit 2).
    """
    import torch
    import torch.nn.functional as F

    ds = digits()
    x, y = torch.from_numpy(ds.x), torch.from_numpy(ds.y)
    model = digits_mlp(init_seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for idx in full_batches(len(ds), world_size, batch_per_rank, steps, seed):
        ii = torch.from_numpy(idx)
        opt.zero_grad()
        F.cross_entropy(model(x[ii]), y[ii]).backward()
        opt.step()
    return flat_params(model).numpy()


def collective_device(group: Any = None) -> torch.device:
    """The device for a tensor this rank makes itself and sends to a collective on ``group``
    (default: the default group): its current GPU when the group runs CUDA tensors over NCCL
    (``"nccl"``, or the course's ``"cpu:gloo,cuda:nccl"``), else the CPU.

    An NCCL-only group (the tutorials' ``init_process_group("nccl")``) has no backend for CPU
    tensors: torch raises ``No backend type associated with device type cpu``. A tensor on the
    GPU is accepted by every group that has NCCL, mapped or not. Introduced in
    ``03_pytorch_ddp`` (through :func:`reduce_metrics`).
    """
    import torch
    import torch.distributed as dist

    config = dist.get_backend_config(group)  # e.g. "cpu:gloo,cuda:nccl", "cuda:nccl"
    if "cuda:nccl" in config.replace(" ", "") and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def reduce_metrics(loss_sum: float, correct: int, count: int,
                   device: torch.device | str | None = None) -> dict[str, Any]:
    """*Collective.* Sum (loss, correct, count) over ranks; return the global mean loss and
    accuracy, plus this rank's own figures (for per-rank plots).

    The sums travel as one float64 tensor on ``device`` (default :func:`collective_device`:
    the rank's GPU under NCCL, the CPU under gloo), so the call works on every group.
    """
    import torch
    import torch.distributed as dist

    where = torch.device(device) if device is not None else collective_device()
    t = torch.tensor([loss_sum, float(correct), float(count)], dtype=torch.float64, device=where)
    local = t.tolist()
    dist.all_reduce(t)
    total = t.tolist()
    n = total[2] or float("nan")  # no items anywhere: nan, not an error
    return {
        "loss": total[0] / n,
        "accuracy": total[1] / n,
        "count": int(total[2]),
        "local_loss": local[0] / max(local[2], 1),
        "local_accuracy": local[1] / max(local[2], 1),
    }


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 256
             ) -> dict[str, Any]:
    """*Collective.* Loss and accuracy of ``model`` on this rank's strided shard of (x, y),
    reduced over ranks so every rank gets the accuracy on the whole set."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    idx = torch.arange(dist.get_rank(), len(y), dist.get_world_size())
    was_training = model.training
    model.eval()
    loss_sum, correct = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(idx), batch):
            ii = idx[i:i + batch]
            out = model(x[ii])
            loss_sum += float(F.cross_entropy(out, y[ii], reduction="sum"))
            correct += int((out.argmax(1) == y[ii]).sum())
    model.train(was_training)
    return reduce_metrics(loss_sum, correct, len(idx))


