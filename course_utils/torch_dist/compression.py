"""Less traffic per step (``10_sharding_and_memory``): DDP with bf16 autocast and with torch's
communication hooks (``fp16_compress_hook``, PowerSGD), each trained on the same task, with the
bytes its all_reduces send counted (:class:`.sharding.CollectiveCounter`), its step time and its
held-out accuracy.

Without a hook DDP's reducer all-reduces in C++, where the counter cannot see it; its bytes are
the formula ``2(p-1)/p`` of the fp32 gradients (:func:`.sharding.ddp_sent_bytes`). The hooks
call ``dist.all_reduce`` from Python (torch's ``default_hooks.py`` and ``powerSGD_hook.py``), so
theirs are counted.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from . import sharding

VARIANTS = ("fp32, no hook", "bf16 autocast", "fp16_compress_hook", "PowerSGD rank 1")


def teacher_task(n: int, n_in: int = 16, classes: int = 4, seed: int = 0) -> tuple[Any, Any]:
    """``n`` inputs and the labels a fixed random network gives them (a task a small MLP can
    learn; the same on every rank for ``seed``)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, n_in, generator=gen)
    w1 = torch.randn(n_in, 32, generator=gen)
    w2 = torch.randn(32, classes, generator=gen)
    return x, (torch.tanh(x @ w1) @ w2).argmax(1)


def engine_traffic(variant: str, steps: int = 40, batch: int = 32, lr: float = 3e-3,
                   width: int = 64, depth: int = 4) -> dict[str, Any]:
    """*Collective.* Train DDP + Adam ``steps`` steps in one of :data:`VARIANTS` on this rank's
    part of the teacher task; return bytes sent per step (counted, or the formula without a
    hook), the median step time, and the held-out accuracy and loss."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}: use one of {VARIANTS}")
    rank, p = dist.get_rank(), dist.get_world_size()
    x, y = teacher_task(steps * batch * p + 512)
    test_x, test_y = x[-512:], y[-512:]
    ddp = DDP(sharding.mlp(width, depth, n_out=4))
    if variant == "fp16_compress_hook":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif variant.startswith("PowerSGD"):
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                            start_powerSGD_iter=2)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    opt = torch.optim.Adam(ddp.parameters(), lr=lr)
    times, sent = [], []
    with sharding.CollectiveCounter() as spy:
        for s in range(steps):
            lo = (s * p + rank) * batch
            spy.reset()
            dist.barrier()
            t0 = time.perf_counter()
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=variant == "bf16 autocast"):
                loss = F.cross_entropy(ddp(x[lo:lo + batch]), y[lo:lo + batch])
            loss.backward()
            opt.step()
            times.append(time.perf_counter() - t0)
            sent.append(spy.sent)
    n_params = sum(q.numel() for q in ddp.parameters())
    counted = variant in ("fp16_compress_hook",) or variant.startswith("PowerSGD")
    with torch.no_grad():
        logits = ddp.module(test_x)
    return {"variant": variant, "rank": rank,
            "sent_per_step": statistics.median(sent[2:]) if counted else
            sharding.ddp_sent_bytes(n_params, p),
            "counted": counted, "step_s": statistics.median(times[2:]),
            "accuracy": float((logits.argmax(1) == test_y).float().mean()),
            "test_loss": float(F.cross_entropy(logits, test_y))}


def traffic_table(rows: list[dict[str, Any]]) -> str:
    """Rank 0's row per variant: bytes per step (and vs fp32), step time, accuracy, loss."""
    base = next(r for r in rows if r["variant"] == VARIANTS[0])
    lines = [f"{'variant':<22}{'B sent/step':>12}{'vs fp32':>9}{'step ms':>9}{'accuracy':>10}"
             f"{'loss':>9}"]
    for r in rows:
        how = "" if r["counted"] else " (formula)"
        lines.append(f"{r['variant']:<22}{r['sent_per_step']:>12,.0f}"
                     f"{r['sent_per_step'] / base['sent_per_step']:>8.2f}x"
                     f"{r['step_s'] * 1e3:>9.1f}{r['accuracy']:>10.3f}{r['test_loss']:>9.4f}{how}")
    return "\n".join(lines)
