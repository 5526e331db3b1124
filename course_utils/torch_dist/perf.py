"""Measurements of the performance unit (``07_performance``): scaling and DDP options.

Every ``engine_*`` function runs on the engines (``cluster.run``) and is *collective* unless it
says otherwise. They return plain numbers for the notebook's tables.
"""

from __future__ import annotations

import time
from typing import Any


def _batches(global_batch: int, steps: int, in_features: int, seed: int = 0) -> list[Any]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(global_batch, in_features, generator=gen),
             torch.randint(0, 10, (global_batch,), generator=gen)) for _ in range(steps)]


def engine_scaling(global_batch: int = 128, steps: int = 8, width: int = 512, depth: int = 4,
                   bucket_cap_mb: float = 25.0, gradient_as_bucket_view: bool = False,
                   warmup: int = 2) -> dict[str, Any]:
    """*Collective.* The same work (``steps`` global batches of ``global_batch`` samples) done
    three ways, timed on this rank:

    * ``one_rank``: rank 0 alone, whole global batches, no communication (other ranks wait);
    * ``ddp``: every rank, ``global_batch / p`` samples per step, DDP all-reduces gradients;
    * ``ddp_no_sync``: the same steps inside ``no_sync()``: compute only, no communication.

    Returns seconds per step for each (median over steps) and ``comm_s = ddp - ddp_no_sync``,
    the time per step the ranks spend communicating that backward does not hide.
    """
    import statistics

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from .record import timeline_mlp

    rank, p = dist.get_rank(), dist.get_world_size()
    data = _batches(global_batch, steps + warmup, width)
    per = global_batch // p

    def timed(step: Any) -> float:
        times = []
        for i, (x, y) in enumerate(data):
            dist.barrier()
            t0 = time.perf_counter()
            step(x, y)
            if i >= warmup:
                times.append(time.perf_counter() - t0)
        return statistics.median(times)

    one = 0.0
    if rank == 0:
        model = timeline_mlp(width, depth)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        times = []
        for i, (x, y) in enumerate(data):
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()
            if i >= warmup:
                times.append(time.perf_counter() - t0)
        one = statistics.median(times)
    dist.barrier()

    ddp = DDP(timeline_mlp(width, depth), bucket_cap_mb=bucket_cap_mb,
              gradient_as_bucket_view=gradient_as_bucket_view)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)

    def ddp_step(x: Any, y: Any) -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(ddp(x[rank * per:(rank + 1) * per]), y[rank * per:(rank + 1) * per]
                        ).backward()
        opt.step()

    def local_step(x: Any, y: Any) -> None:
        with ddp.no_sync():
            ddp_step(x, y)

    t_ddp = timed(ddp_step)
    t_local = timed(local_step)
    return {"rank": rank, "world_size": p, "one_rank_s": one, "ddp_s": t_ddp,
            "no_sync_s": t_local, "comm_s": max(0.0, t_ddp - t_local),
            "grad_bytes": sum(q.numel() * 4 for q in ddp.parameters()),
            "samples_per_step": global_batch}


def scaling_row(results: list[dict[str, Any]]) -> dict[str, float]:
    """One row of the scaling table from :func:`engine_scaling`'s per-rank results (kernel side):
    samples/s on 1 and on p ranks, their ratio (ideal: p), the communication share."""
    one = results[0]["one_rank_s"]
    ddp = max(r["ddp_s"] for r in results)
    comm = max(r["comm_s"] for r in results)
    n = results[0]["samples_per_step"]
    return {"ranks": results[0]["world_size"], "one_rank_samples_s": n / one,
            "ddp_samples_s": n / ddp, "speedup": one / ddp, "comm_ms": comm * 1e3,
            "comm_share": comm / ddp}
