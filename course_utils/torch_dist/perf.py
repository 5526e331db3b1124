"""Measurements of the performance unit (``07_performance``): scaling, DDP options, and the
learner's ring of ``01_collectives`` on the sweep's axes.

Every ``engine_*`` function runs on the engines (``cluster.run``) and is *collective* unless it
says otherwise. They return plain numbers; the other functions turn them into table rows in the
kernel. Timings on a shared CPU machine are noisy, so every measurement here takes turns with
the others it is compared with (round after round), keeps the medians and reports the noise.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..notebook_cells import find_cell, source_text, without_px

#: The scaling table's configurations, in the order they take turns in each round.
SCALING_KINDS = ("one_rank", "ddp", "ddp_bucket_view", "no_sync")


def _batches(global_batch: int, steps: int, in_features: int, seed: int = 0) -> list[Any]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(global_batch, in_features, generator=gen),
             torch.randint(0, 10, (global_batch,), generator=gen)) for _ in range(steps)]


def engine_scaling(global_batch: int = 128, rounds: int = 15, width: int = 256, depth: int = 4,
                   bucket_cap_mb: float = 25.0, warmup: int = 3) -> dict[str, Any]:
    """*Collective.* The same work (global batches of ``global_batch`` samples) done four ways,
    taking turns in each of ``warmup + rounds`` rounds so that a burst of load on the machine
    hits all four alike:

    * ``one_rank``: rank 0 alone, the whole global batch, no communication (others wait);
    * ``ddp``: every rank ``global_batch / p`` samples, DDP all-reduces the gradients;
    * ``ddp_bucket_view``: the same with ``gradient_as_bucket_view=True``;
    * ``no_sync``: the ``ddp`` model's step inside ``no_sync()``: compute only.

    Returns the seconds of every measured round for each (the slowest rank's, max-reduced),
    and the gradient bytes. :func:`scaling_table` turns them into rows.
    """
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from .record import timeline_mlp

    rank, p = dist.get_rank(), dist.get_world_size()
    data = _batches(global_batch, 4, width)
    per = global_batch // p
    alone = timeline_mlp(width, depth)
    alone_opt = torch.optim.SGD(alone.parameters(), lr=0.01)
    models = {view: DDP(timeline_mlp(width, depth), bucket_cap_mb=bucket_cap_mb,
                        gradient_as_bucket_view=view) for view in (False, True)}
    opts = {view: torch.optim.SGD(m.parameters(), lr=0.01) for view, m in models.items()}

    def one_rank(x: Any, y: Any) -> None:
        if rank == 0:
            alone_opt.zero_grad(set_to_none=True)
            F.cross_entropy(alone(x), y).backward()
            alone_opt.step()

    def ddp_step(view: bool, x: Any, y: Any) -> None:
        opts[view].zero_grad(set_to_none=True)
        sl = slice(rank * per, (rank + 1) * per)
        F.cross_entropy(models[view](x[sl]), y[sl]).backward()
        opts[view].step()

    def no_sync(x: Any, y: Any) -> None:
        with models[False].no_sync():
            ddp_step(False, x, y)

    steps = {"one_rank": one_rank, "ddp": lambda x, y: ddp_step(False, x, y),
             "ddp_bucket_view": lambda x, y: ddp_step(True, x, y), "no_sync": no_sync}
    times: dict[str, list[float]] = {k: [] for k in SCALING_KINDS}
    for i in range(warmup + rounds):
        x, y = data[i % len(data)]
        for kind in SCALING_KINDS:
            dist.barrier()
            t0 = time.perf_counter()
            steps[kind](x, y)
            dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)   # the slowest rank sets the pace
            if i >= warmup:
                times[kind].append(float(dt.item()))
    return {"rank": rank, "world_size": p, "seconds": times, "samples_per_step": global_batch,
            "grad_bytes": sum(q.numel() * 4 for q in models[False].parameters())}


def _quartiles(xs: Sequence[float]) -> tuple[float, float, float]:
    q1, q2, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return q1, q2, q3


def scaling_table(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows of the scaling table from one rank's :func:`engine_scaling` result (kernel side).

    Each row: ``name``, median ``step_ms``, ``samples_s`` (samples per second), ``speedup``
    over one rank (ideal: p), ``noise`` (the interquartile range of the rounds over their
    median: how far one more measurement may land), and for DDP rows ``comm_ms``, the median
    over rounds of ``ddp - no_sync`` (paired within each round): communication backward did
    not hide.
    """
    secs, n, p = result["seconds"], result["samples_per_step"], result["world_size"]
    one = statistics.median(secs["one_rank"])
    names = {"one_rank": "1 rank, whole batch", "ddp": f"{p} ranks, DDP",
             "ddp_bucket_view": f"{p} ranks, DDP + gradient_as_bucket_view",
             "no_sync": f"{p} ranks, no_sync (no communication)"}
    rows = []
    for kind in SCALING_KINDS:
        q1, med, q3 = _quartiles(secs[kind])
        row = {"kind": kind, "name": names[kind], "step_ms": med * 1e3, "samples_s": n / med,
               "speedup": one / med, "noise": (q3 - q1) / med, "comm_ms": None}
        if kind.startswith("ddp"):
            paired = [a - b for a, b in zip(secs[kind], secs["no_sync"], strict=True)]
            row["comm_ms"] = statistics.median(paired) * 1e3
        rows.append(row)
    return rows


def flag_effect(rows: Sequence[dict[str, Any]]) -> str:
    """One sentence on ``gradient_as_bucket_view``: the two DDP rows' difference next to the
    noise of those rows, and whether the measurement can tell them apart."""
    by = {r["kind"]: r for r in rows}
    a, b = by["ddp"], by["ddp_bucket_view"]
    diff = (b["step_ms"] - a["step_ms"]) / a["step_ms"]
    noise = max(a["noise"], b["noise"])
    verdict = ("smaller than the noise: this run cannot tell the two apart"
               if abs(diff) <= noise else
               "larger than the noise" + (": the view helped" if diff < 0 else
                                          ": the view was slower here"))
    return (f"gradient_as_bucket_view changed the step time by {diff:+.0%}; the rounds of "
            f"those rows spread by {noise:.0%} (interquartile range): {verdict}.")


def format_scaling(rows: Sequence[dict[str, Any]]) -> str:
    """The scaling table as text."""
    out = [f"{'':45} {'step (ms)':>9} {'samples/s':>10} {'speed-up':>9} {'noise':>6} "
           f"{'comm (ms)':>10}"]
    for r in rows:
        comm = "" if r["comm_ms"] is None else f"{r['comm_ms']:.2f}"
        out.append(f"{r['name']:45} {r['step_ms']:>9.2f} {r['samples_s']:>10.0f} "
                   f"{r['speedup']:>9.2f} {r['noise']:>6.0%} {comm:>10}")
    return "\n".join(out)


# ---- the learner's ring of unit 1 on the sweep's axes -------------------------------------
RING_NAME = "ring_all_reduce"
RING_CELL = "ex1-solution"


def ring_source(notebook: str | Path = "01_collectives.ipynb", grade_id: str = RING_CELL
                ) -> str:
    """The code of the learner's ring cell from their unit-1 notebook (kernel side; the
    ``%%px`` line removed), read from the saved file next to this one. Raises
    :class:`FileNotFoundError` or :class:`KeyError` saying what is missing."""
    path = Path(notebook)
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: this unit reads your ring from unit 1's "
                                "notebook in the same folder")
    cell = find_cell(json.loads(path.read_text(encoding="utf-8")).get("cells", []), grade_id)
    if cell is None:
        raise KeyError(f"{path} has no cell {grade_id!r} (the ring exercise)")
    return without_px(source_text(cell))


def engine_ring_ok(fn_name: str = RING_NAME, n: int = 1001, seconds: float = 5.0) -> str:
    """*Collective.* Run the ``%%px`` ring ``fn_name`` once under a point-to-point watchdog
    and compare with the true sum: ``"ok"`` or what is wrong (not written, wrong, stuck)."""
    import torch
    import torch.distributed as dist

    import __main__

    from .p2p import p2p_watchdog

    fn = vars(__main__).get(fn_name)
    if fn is None:
        return f"{fn_name} is not defined"
    rank = dist.get_rank()
    x = torch.arange(n, dtype=torch.float32) + rank
    want = torch.zeros(n)
    for r in range(dist.get_world_size()):
        want += torch.arange(n, dtype=torch.float32) + r
    try:
        with p2p_watchdog(seconds=seconds):
            fn(x)
    except NotImplementedError:
        problem = "not written yet (NotImplementedError)"
    except Exception as exc:
        problem = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"
    else:
        problem = "" if torch.allclose(x, want) else "a wrong sum"
    flag = torch.tensor([1.0 if problem else 0.0])
    dist.all_reduce(flag)                                   # ok only if ok on every rank
    return problem or ("ok" if flag.item() == 0 else "wrong on another rank")


def engine_sweep_pair(sizes: Sequence[int], fn_name: str = RING_NAME, iters: int = 7,
                      warmup: int = 1) -> dict[str, Any]:
    """*Collective.* For each size (bytes, float32): the median seconds of ``dist.all_reduce``
    and of the ``%%px`` ring ``fn_name``, measured in turns
    (:func:`course_utils.torch_dist.bandwidth.engine_compare`), the slowest rank's time."""
    import torch
    import torch.distributed as dist

    import __main__

    from .bandwidth import engine_compare

    fn = vars(__main__)[fn_name]
    out: dict[str, list[float]] = {"dist.all_reduce": [], fn_name: []}
    for nbytes in sizes:
        t = torch.full((max(1, int(nbytes) // 4),), 1e-3)
        got = engine_compare({"dist.all_reduce": lambda t=t: dist.all_reduce(t),
                              fn_name: lambda t=t: fn(t)}, iters=iters, warmup=warmup)
        for name, s in got.items():
            out[name].append(s)
    return {"sizes": [max(1, int(s) // 4) * 4 for s in sizes], "seconds": out,
            "world_size": dist.get_world_size()}


def load_ring(cluster: Any = None, notebook: str | Path = "01_collectives.ipynb") -> str:
    """Copy the learner's ``ring_all_reduce`` from their saved unit-1 notebook onto every
    engine and check it once (bounded by a watchdog). Returns ``"ok"`` or what is wrong; the
    performance unit then measures it next to ``dist.all_reduce`` (kernel side)."""
    from ..cluster import current

    cc = cluster or current()
    try:
        src = ring_source(notebook)
        cc.view.execute("import torch\nimport torch.distributed as dist\n" + src,
                        block=False).get(timeout=60)
    except Exception as exc:  # no notebook, no cell, or the learner's cell does not run
        return f"not loaded: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    return str(cc.run(engine_ring_ok, timeout=60)[0])


#: A sweep whose largest message (4 MiB) takes less than this many times its smallest (4 B)
#: was taken while the machine was busy with something else.
SWEEP_MIN_GROWTH = 3.0


def sweep_is_flat(seconds: Sequence[float], growth: float = SWEEP_MIN_GROWTH) -> bool:
    """Whether a sweep's times hardly grow with the message (the last is under ``growth`` times
    the first): a burst of load on the machine, not the network, set them."""
    return len(seconds) < 2 or seconds[-1] < growth * seconds[0]


def sweep(sizes: Sequence[int], with_ring: bool = True, iters: int = 7,
          cluster: Any = None, attempts: int = 3) -> dict[str, Any]:
    """The message-size sweep of ``07_performance`` (kernel side): median seconds per size of
    ``dist.all_reduce`` and, if ``with_ring``, of the learner's ring, taking turns at every
    size. Returns ``{"sizes": [...], "seconds": {name: [...]}, "attempts": n}``.

    Load from other programs only ever adds time, and on a busy machine it can swamp the
    small messages, so that the times no longer grow with the size (:func:`sweep_is_flat`)
    and the cost model cannot be fitted: then the sweep is taken again, up to ``attempts``
    times, keeping the fastest time seen at each size."""
    from ..cluster import current
    from .record import engine_sweep_all_reduce

    cc = cluster or current()
    best: dict[str, list[float]] = {}
    measured_sizes: list[int] = []
    taken = 0
    while taken < max(1, attempts):
        taken += 1
        if with_ring:
            res = cc.run(engine_sweep_pair, list(sizes), RING_NAME, iters, timeout=300)[0]
            secs = {"dist.all_reduce": res["seconds"]["dist.all_reduce"],
                    f"your {RING_NAME} (unit 1)": res["seconds"][RING_NAME]}
            measured_sizes = res["sizes"]
        else:
            res = cc.run(engine_sweep_all_reduce, list(sizes), iters, timeout=300)
            secs = {"dist.all_reduce": [max(r["seconds"][i] for r in res)
                                        for i in range(len(sizes))]}
            measured_sizes = res[0]["sizes"]
        best = {k: [min(a, b) for a, b in zip(best[k], v, strict=True)] if k in best else list(v)
                for k, v in secs.items()}
        if not sweep_is_flat(best["dist.all_reduce"]):
            break
    return {"sizes": measured_sizes, "seconds": best, "attempts": taken}


def format_sweep(measured: dict[str, Any], p: int) -> str:
    """The sweep as a table: per size and implementation, time (us), algbw and busbw (MB/s)."""
    from .bandwidth import algbw, busbw

    names = list(measured["seconds"])
    head = f"{'bytes':>9}"
    for name in names:
        short = name if len(name) <= 24 else name[:23] + "…"
        head += f" | {short:^34}"
    sub = f"{'':>9}" + " | {:>10} {:>11} {:>11}".format("time (us)", "algbw MB/s",
                                                          "busbw MB/s") * len(names)
    rows = [head, sub]
    for i, n in enumerate(measured["sizes"]):
        line = f"{int(n):>9}"
        for name in names:
            t = measured["seconds"][name][i]
            line += f" | {t * 1e6:>10.1f} {algbw(n, t) * 1e3:>11.2f} {busbw(n, t, p) * 1e3:>11.2f}"
        rows.append(line)
    return "\n".join(rows)


def ring_vs_gloo(sizes: Sequence[float], gloo: Sequence[float], ring: Sequence[float],
                 p: int, same_within: float = 0.1) -> str:
    """What this run's sweep says about the learner's ring next to gloo's all_reduce, at the
    smallest and the largest size: the sentence is chosen by the measured ratio (within
    ``same_within`` of 1: no difference this run can show). Kernel side."""
    from .bandwidth import busbw

    def verdict(r: float) -> str:
        if abs(r - 1) <= same_within:
            return "about the same (a difference this small is within the noise)"
        return "yours was faster" if r < 1 else "gloo's was faster"

    small, large = ring[0] / gloo[0], ring[-1] / gloo[-1]
    return (f"At {int(sizes[0])} B (the fixed cost of one call) your ring took {small:.2f}x "
            f"gloo's time: {verdict(small)}. At {human_size(sizes[-1])} (bandwidth) it took "
            f"{large:.2f}x: {verdict(large)}; busbw yours "
            f"{busbw(sizes[-1], ring[-1], p) * 1e3:.0f} MB/s, gloo's "
            f"{busbw(sizes[-1], gloo[-1], p) * 1e3:.0f} MB/s.")


def human_size(n: float) -> str:
    """Bytes as ``4 B``, ``64 KiB``, ``4 MiB``."""
    for unit, size in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{int(n)} B"
