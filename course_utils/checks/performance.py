"""Engine-side probes behind the graded tests of ``07_performance``."""

from __future__ import annotations

import time
from typing import Any

from .common import learner


def engine_check_overlap_dp(cls_name: str = "OverlapDP", steps: int = 4,
                            bucket_cap_mb: float = 0.25, width: int = 256, depth: int = 4,
                            batch: int = 32, timing_steps: int = 5) -> dict[str, Any]:
    """*Collective.* Train the learner's ``cls_name(model, bucket_cap_mb)`` (``.model``, hooks,
    ``.sync()`` after ``backward()``) next to torch DDP on the same data, with
    ``dist.all_reduce`` spied on, then time it against unit 2's blocking loop and DDP.

    Returned per rank: max |w_learner - w_ddp| after ``steps`` SGD steps, the spied launches
    per step (how many, how many ``async_op=True``), and per step the seconds between the first
    launch and the end of ``backward()`` (positive: communication started before backward
    ended), plus the median step times of the three versions.
    """
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ..torch_dist.record import timeline_mlp
    from ..torch_dist.train import flat_params

    cls = learner(cls_name)
    rank = dist.get_rank()
    gen = torch.Generator().manual_seed(100 + rank)
    data = [(torch.randn(batch, width, generator=gen),
             torch.randint(0, 10, (batch,), generator=gen))
            for _ in range(max(steps, timing_steps + 1))]

    ref = DDP(timeline_mlp(width, depth, seed=0), bucket_cap_mb=bucket_cap_mb)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    for x, y in data[:steps]:
        ref_opt.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        ref_opt.step()

    model = timeline_mlp(width, depth, seed=rank)  # different start: the class must broadcast
    ours = cls(model, bucket_cap_mb=bucket_cap_mb)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    per_step = _spied_steps(ours, opt, data[:steps])
    diff = float((flat_params(model) - flat_params(ref.module)).abs().max())

    def ours_step(x: Any, y: Any) -> None:
        opt.zero_grad()
        F.cross_entropy(ours.model(x), y).backward()
        ours.sync()
        opt.step()

    def ddp_step(x: Any, y: Any) -> None:
        ref_opt.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        ref_opt.step()

    plain = timeline_mlp(width, depth, seed=0)
    plain_opt = torch.optim.SGD(plain.parameters(), lr=0.05)
    timed = data[:timing_steps + 1]
    times = {"overlap_dp": _median_step(ours_step, timed),
             "blocking": _median_step(lambda x, y: _blocking_step(plain, plain_opt, x, y),
                                      timed),
             "ddp": _median_step(ddp_step, timed)}
    return {"rank": rank, "max_weight_diff": diff, "steps": per_step,
            "n_params": len(list(model.parameters())), "step_s": times}


def _spied_steps(ours: Any, opt: Any, data: list[tuple[Any, Any]]) -> list[dict[str, Any]]:
    """SGD steps of the learner's class with ``dist.all_reduce`` spied on: per step, how many
    launches, how many async, and how long before backward's end the first one started."""
    import torch.distributed as dist
    import torch.nn.functional as F

    real = dist.all_reduce
    launches: list[tuple[float, bool]] = []

    def spy(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        is_async = bool(kwargs.get("async_op", args[2] if len(args) > 2 else False))
        launches.append((time.perf_counter(), is_async))
        return real(tensor, *args, **kwargs)

    per_step: list[dict[str, Any]] = []
    dist.all_reduce = spy
    try:
        for x, y in data:
            opt.zero_grad()
            launches.clear()
            loss = F.cross_entropy(ours.model(x), y)
            loss.backward()
            back_end = time.perf_counter()
            ours.sync()
            opt.step()
            per_step.append({"launches": len(launches),
                             "async": sum(a for _, a in launches),
                             "lead_s": (back_end - launches[0][0]) if launches else None})
    finally:
        dist.all_reduce = real
    return per_step


def _blocking_step(m: Any, o: Any, x: Any, y: Any) -> None:
    """Unit 2's ``data_parallel_step``: backward, then one blocking all_reduce per gradient."""
    import torch.distributed as dist
    import torch.nn.functional as F

    o.zero_grad()
    F.cross_entropy(m(x), y).backward()
    p = dist.get_world_size()
    for prm in m.parameters():
        dist.all_reduce(prm.grad)
        prm.grad /= p
    o.step()


def _median_step(step: Any, data: list[tuple[Any, Any]]) -> float:
    """The median seconds of ``step(x, y)`` over ``data``, the first (warm-up) step left out."""
    import statistics

    import torch.distributed as dist

    times = []
    for x, y in data:
        dist.barrier()
        t0 = time.perf_counter()
        step(x, y)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])
