"""Bandwidth of collectives: algbw/busbw as nccl-tests defines them, a printable table, and
timings on the engines where the slowest rank counts.

Introduced in ``01_collectives`` (the learner's ring against ``dist.all_reduce``) and used by
the performance unit. ``algbw``, ``busbw`` and ``bandwidth_table`` are pure; the ``engine_*``
functions run on the engines and import torch there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..cluster.engines.engine import px_name

#: Bus-bandwidth correction factors, as nccl-tests defines them, for ``p`` ranks.
_BUS_FACTORS: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda p: 2 * (p - 1) / p,
    "all_gather": lambda p: (p - 1) / p,
    "reduce_scatter": lambda p: (p - 1) / p,
    "broadcast": lambda p: 1.0,
    "reduce": lambda p: 1.0,
}


def algbw(nbytes: float, seconds: float) -> float:
    """Algorithm bandwidth in GB/s: buffer size over time (what the caller experiences)."""
    return nbytes / seconds / 1e9


def busbw(nbytes: float, seconds: float, p: int, op: str = "all_reduce") -> float:
    """Bus bandwidth in GB/s: algbw times the op's factor (``2(p-1)/p`` for all_reduce).

    busbw is comparable across world sizes and with the link's peak, because it counts the
    bytes a ring really moves per rank.
    """
    if op not in _BUS_FACTORS:
        raise ValueError(f"unknown op {op!r}; one of {sorted(_BUS_FACTORS)}")
    return algbw(nbytes, seconds) * _BUS_FACTORS[op](p)


def bandwidth_table(rows: dict[str, float], nbytes: int, p: int,
                    op: str = "all_reduce") -> str:
    """A printable table of time, algbw and busbw for named timings (seconds), plus ratios
    against the first row."""
    names = list(rows)
    if not names:
        return "(no timings)"
    base = busbw(nbytes, rows[names[0]], p, op)
    lines = [f"{'implementation':<22}{'time ms':>10}{'algbw GB/s':>12}{'busbw GB/s':>12}"
             f"{'busbw ratio':>14}"]
    for name in names:
        s = rows[name]
        bb = busbw(nbytes, s, p, op)
        lines.append(f"{name:<22}{s * 1e3:>10.1f}{algbw(nbytes, s):>12.3f}{bb:>12.3f}"
                     f"{bb / base:>13.2f}x")
    lines.append(f"buffer {nbytes / 2**20:.0f} MiB, {p} ranks, busbw = algbw * 2(p-1)/p, "
                 f"ratio against {names[0]}")
    return "\n".join(lines)


def engine_time(fn: Callable[[], Any], iters: int = 5, warmup: int = 1) -> float:
    """Median seconds of ``fn()`` over ``iters`` runs, the slowest rank's time for each run.

    Collective: every rank must call it with the same ``iters``/``warmup``. Each run starts
    after a barrier, and each rank's time is max-reduced, because a collective is only done
    when its last rank is.
    """
    import time

    import torch
    import torch.distributed as dist

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        times.append(float(dt.item()))
    times.sort()
    return times[len(times) // 2]


def engine_compare(fns: dict[str, Callable[[], Any]], iters: int = 7, warmup: int = 1
                   ) -> dict[str, float]:
    """*Collective.* Median seconds of each named ``fn()``, the slowest rank's time per run.

    The functions take turns (A, B, A, B, ...) rather than running all of A then all of B, so
    a machine whose load changes during the measurement (a shared CI box) biases neither.
    """
    import time

    import torch
    import torch.distributed as dist

    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(iters):
        for name, fn in fns.items():
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)
            times[name].append(float(dt.item()))
    return {name: sorted(ts)[len(ts) // 2] for name, ts in times.items()}


def engine_bench_all_reduce(fn_name: str, nbytes: int = 64 * 2**20, iters: int = 7
                            ) -> dict[str, float]:
    """*Collective.* Median seconds of the ``%%px`` function ``fn_name(t)`` and of
    ``dist.all_reduce(t)`` on a float32 buffer of ``nbytes``, measured in turns
    (:func:`engine_compare`). Used in ``01_collectives``."""
    import torch
    import torch.distributed as dist

    fn = px_name(fn_name, to_call=True)
    t = torch.full((nbytes // 4,), 1e-3)
    return engine_compare({"dist.all_reduce (gloo)": lambda: dist.all_reduce(t),
                           fn_name: lambda: fn(t)}, iters=iters)
