"""Recorders for the PyTorch track's figures: they run on the engines and return plain data.

Record on the engines, pull lists and dicts, plot with :mod:`course_utils.viz` (which never
talks to a cluster). Every ``engine_*`` function runs on the engines (``cluster.run``) and is
*collective* unless it says otherwise: every rank must call it. Used by:

* ``01_collectives``: :func:`engine_record_collectives` (the cheat sheet),
  :func:`engine_record_ring_frames` and :func:`record_ring_replay` (the ring replay on 4 ranks);
* ``03_pytorch_ddp`` and the performance unit: :func:`engine_profile_ddp` and
  :func:`profile_ddp` (the DDP timeline), :func:`engine_sweep_all_reduce` (the cost model).

The live training view records with :mod:`course_utils.torch_dist.live_log`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from ..cluster import CourseCluster, current
from ..cluster.engines.engine import px_name

#: The seven collectives of the cheat sheet, in the order they are taught.
COLLECTIVES = ("broadcast", "scatter", "gather", "reduce", "all_reduce", "all_gather",
               "reduce_scatter")


# ---- cost model ----------------------------------------------------------------------------
def default_sizes(smallest: int = 4, largest: int = 4 * 2**20, factor: int = 4) -> list[int]:
    """Message sizes in bytes for a sweep: ``smallest``, ``smallest*factor``, ... ``largest``."""
    sizes, s = [], int(smallest)
    while s <= largest:
        sizes.append(s)
        s *= factor
    return sizes


def engine_sweep_all_reduce(sizes: Sequence[int] | None = None, iters: int = 15,
                            warmup: int = 1) -> dict[str, Any]:
    """*Collective.* Median seconds of ``dist.all_reduce`` on a float32 buffer of each size in
    ``sizes`` (bytes; default 4 B to 4 MiB), the slowest rank's time for each run."""
    import torch
    import torch.distributed as dist

    from .bandwidth import engine_time

    sizes = list(default_sizes() if sizes is None else sizes)
    seconds = []
    for nbytes in sizes:
        t = torch.ones(max(1, int(nbytes) // 4))
        seconds.append(engine_time(lambda t=t: dist.all_reduce(t), iters=iters, warmup=warmup))
    return {"sizes": [max(1, int(s) // 4) * 4 for s in sizes], "seconds": seconds,
            "world_size": dist.get_world_size(), "backend": str(dist.get_backend())}


# ---- DDP timeline --------------------------------------------------------------------------
def timeline_mlp(width: int = 512, depth: int = 6, classes: int = 10, seed: int = 0) -> Any:
    """An MLP of ``depth`` ``width x width`` layers: large enough gradients (4·width²·depth
    bytes) for DDP's buckets to show, small enough compute for a CPU."""
    import torch
    from torch import nn

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        layers: list[nn.Module] = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.ReLU()]
        return nn.Sequential(*layers, nn.Linear(width, classes))


def _kind(name: str) -> str | None:
    if name == "gloo:all_reduce" or name.startswith("nccl:all_reduce"):
        return "all_reduce"
    if name == "DistributedDataParallel.forward":
        return "forward"
    if name.startswith("autograd::engine::evaluate_function:"):
        return "backward"
    if name.startswith("Optimizer.step"):
        return "optimizer"
    return None


def engine_profile_ddp(steps: int = 3, bucket_cap_mb: float = 25.0, width: int = 512,
                       depth: int = 6, batch: int = 64, warmup: int = 2,
                       model_fn: Callable[[], Any] | None = None) -> dict[str, Any]:
    """*Collective.* Train a DDP model for ``steps`` steps under ``torch.profiler`` and return
    this rank's timeline: forward, backward and optimizer spans (the compute thread) and every
    ``all_reduce`` of a gradient bucket (gloo's own threads; ``launch``: when DDP launched it
    on the compute thread), in seconds from the first step's start, which a barrier aligns
    across ranks.

    ``bucket_cap_mb`` is DDP's bucket size; ``bucket_bytes`` lists the buckets DDP built, in the
    order it reduces them. ``model_fn`` (default :func:`timeline_mlp`) builds the model.
    """
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.profiler import ProfilerActivity, profile, record_function

    rank = dist.get_rank()
    model = (model_fn or (lambda: timeline_mlp(width, depth)))()
    ddp = DDP(model, bucket_cap_mb=bucket_cap_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(rank)
    in_features = next(m for m in model.modules() if isinstance(m, torch.nn.Linear)).in_features
    x = torch.randn(batch, in_features, generator=gen)
    y = torch.randint(0, 10, (batch,), generator=gen)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(ddp(x), y).backward()
        opt.step()

    for _ in range(warmup):  # DDP rebuilds its buckets after the first iteration
        step()
    spans: list[tuple[int, float]] = []
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for s in range(steps):
            dist.barrier()
            with record_function(f"course:step{s}"):
                step()
    events = list(prof.events())
    marks = sorted((e.time_range.start, e.time_range.end, e.name) for e in events
                   if e.name.startswith("course:step"))
    t0 = marks[0][0] if marks else 0.0
    spans = [((a - t0) / 1e6, (b - t0) / 1e6) for a, b, _ in marks]

    def step_of(t: float) -> int:
        for i, (_a, b) in enumerate(spans):
            if t <= b:
                return i
        return len(spans) - 1

    out: list[dict[str, Any]] = []
    main_threads = {e.thread for e in events if e.name.startswith("course:step")}
    for e in events:
        kind = _kind(e.name)
        if kind is None:
            continue
        if kind != "all_reduce" and e.thread not in main_threads:
            continue
        start, end = (e.time_range.start - t0) / 1e6, (e.time_range.end - t0) / 1e6
        if end < 0:
            continue
        out.append({"kind": kind, "start": start, "end": end, "step": step_of(start)})
    out = _merge_backward(sorted(out, key=lambda d: d["start"]))
    _attach_launches(out, events, t0, main_threads, step_of, len(spans))
    info = ddp._get_ddp_logging_data()
    sizes = str(info.get("rebuilt_bucket_sizes") or info.get("bucket_sizes") or "")
    bucket_bytes = [int(v) for v in sizes.replace(" ", "").split(",") if v]
    return {"rank": rank, "events": out, "steps": spans, "bucket_cap_mb": float(bucket_cap_mb),
            "bucket_bytes": bucket_bytes, "backend": str(dist.get_backend()),
            "grad_bytes": sum(p.numel() * p.element_size() for p in model.parameters())}


def _attach_launches(out: list[dict[str, Any]], events: list[Any], t0: float,
                     main_threads: set[int], step_of: Callable[[float], int], steps: int
                     ) -> None:
    """Number each step's all_reduces (``bucket``) and add when DDP launched each one
    (``launch``: the ``c10d::allreduce_`` op on the compute thread; gloo's own span starts only
    when one of its worker threads picks the bucket up, in launch order) and whether backward
    still had autograd nodes to run after the launch returned (``launched_early``)."""
    launched = sorted(((e.time_range.start - t0) / 1e6, (e.time_range.end - t0) / 1e6)
                      for e in events
                      if e.name == "c10d::allreduce_" and e.thread in main_threads)
    nodes = [(e.time_range.start - t0) / 1e6 for e in events if e.thread in main_threads
             and e.name.startswith("autograd::engine::evaluate_function:")]
    for s in range(steps):
        reds = [d for d in out if d["kind"] == "all_reduce" and d["step"] == s]
        mine = [t for t in launched if step_of(t[0]) == s]
        last_node = max((t for t in nodes if step_of(t) == s), default=0.0)
        for i, d in enumerate(reds):
            d["bucket"] = i
            if len(mine) == len(reds):
                d["launch"] = mine[i][0]
                d["launched_early"] = mine[i][1] <= last_node


def profile_ddp(caps: Sequence[float] = (25.0, 1.0), steps: int = 3,
                cluster: CourseCluster | None = None, timeout: float = 180.0,
                **kwargs: Any) -> dict[str, list[dict[str, Any]]]:
    """Run :func:`engine_profile_ddp` on every rank once per bucket size in ``caps`` (MiB) and
    return ``{"bucket_cap_mb=25": records, ...}`` for :func:`course_utils.viz.ddp_timeline`.
    ``kwargs`` go to :func:`engine_profile_ddp` (``width``, ``depth``, ``batch``, ...).
    Introduced in ``03_pytorch_ddp``."""
    cc = cluster or current()
    return {f"bucket_cap_mb={cap:g}": cc.run(engine_profile_ddp, steps, float(cap),
                                             timeout=timeout, **kwargs) for cap in caps}


def _merge_backward(events: list[dict[str, Any]], gap: float = 2e-4) -> list[dict[str, Any]]:
    """Join backward pieces (one per autograd node) that follow each other within ``gap`` s."""
    out: list[dict[str, Any]] = []
    last: dict[str, Any] | None = None
    for e in events:
        if e["kind"] != "backward":
            out.append(e)
            continue
        if last is not None and last["step"] == e["step"] and e["start"] - last["end"] <= gap:
            last["end"] = max(last["end"], e["end"])
            continue
        last = dict(e)
        out.append(last)
    return out


# ---- collectives cheat sheet ---------------------------------------------------------------
def engine_record_collectives(width: int = 2) -> dict[str, Any]:
    """*Collective.* Run the seven collectives once each on small readable tensors and return
    what this rank held before and after every one (``None`` where a rank holds nothing).

    Rank ``r``'s input is ``10*(r+1) + [0, 1, ...]`` (``width`` < 10 values; ``scatter``'s root
    and ``reduce_scatter`` hold ``p`` chunks, chunk ``i`` being ``100*i + 10*(r+1) + [0, ...]``),
    roots are rank 0, ops sum. Every sum over all ranks is larger than every input, so a figure
    can tell a rank's own value from a sum.
    """
    import torch
    import torch.distributed as dist

    r, p = dist.get_rank(), dist.get_world_size()
    if not 1 <= width < 10:
        raise ValueError(f"width must be 1..9, got {width}")

    def mine() -> Any:
        return torch.arange(width, dtype=torch.float32) + 10.0 * (r + 1)

    def chunked() -> list[Any]:
        return [torch.arange(width, dtype=torch.float32) + 100.0 * i + 10.0 * (r + 1)
                for i in range(p)]

    def flat(t: Any) -> list[float] | None:
        return None if t is None else [float(v) for v in t.reshape(-1)]

    out: dict[str, tuple[Any, Any]] = {}
    x = mine()
    before = flat(x)
    dist.broadcast(x, src=0)
    out["broadcast"] = (before, flat(x))

    chunks = chunked() if r == 0 else None
    got = torch.zeros(width)
    dist.scatter(got, scatter_list=chunks, src=0)
    out["scatter"] = (flat(torch.cat(chunks)) if chunks else None, flat(got))

    x = mine()
    bucket = [torch.empty(width) for _ in range(p)] if r == 0 else None
    dist.gather(x, gather_list=bucket, dst=0)
    out["gather"] = (flat(x), flat(torch.cat(bucket)) if bucket else None)

    x = mine()
    before = flat(x)
    dist.reduce(x, dst=0)
    out["reduce"] = (before, flat(x) if r == 0 else None)  # undefined off the root

    x = mine()
    before = flat(x)
    dist.all_reduce(x)
    out["all_reduce"] = (before, flat(x))

    x = mine()
    everyone = [torch.empty(width) for _ in range(p)]
    dist.all_gather(everyone, x)
    out["all_gather"] = (flat(x), flat(torch.cat(everyone)))

    chunks = chunked()
    got = torch.empty(width)
    dist.reduce_scatter(got, chunks)
    out["reduce_scatter"] = (flat(torch.cat(chunks)), flat(got))
    return {"rank": r, "world_size": p, "width": width, "trace": out}


# ---- ring replay ---------------------------------------------------------------------------
def engine_record_ring_frames(fn_name: str = "ring_all_reduce", n: int | None = None,
                              watchdog: float | None = 10.0) -> dict[str, Any]:
    """*Collective.* Run the ``%%px`` function ``fn_name(t)`` (the learner's ring all-reduce) on
    a tensor that records whose contributions each element holds, and snapshot this rank's
    whole buffer each time it sends.

    Rank ``r`` starts with ``t[i] = 2**r * (i + 1)``: any sum of contributions from a set ``S``
    of ranks is ``(i + 1) * sum(2**s for s in S)``, so every later value names its set ``S``
    exactly (float32 is exact here for up to 16 ranks and small ``n``). Returns ``frames`` (the
    buffer before each send, then after the call), ``sends`` (destination, first element and
    size of each message) and ``n``; :func:`course_utils.viz.ring.replay_frames` decodes them.
    Under :func:`~course_utils.torch_dist.p2p.p2p_watchdog` (``watchdog`` seconds; None:
    without), so a ring that deadlocks says so instead of hanging the process group.
    """

    import torch
    import torch.distributed as dist

    from .p2p import p2p_watchdog, record_sends

    fn = px_name(fn_name, to_call=True)
    r, p = dist.get_rank(), dist.get_world_size()
    if p > 16:
        raise ValueError("the ring replay encodes ranks in float32 bits: at most 16 ranks")
    n = int(n or 2 * p)
    t = (torch.arange(n, dtype=torch.float32) + 1.0) * float(2 ** r)
    guard = p2p_watchdog(watchdog) if watchdog else contextlib.nullcontext()
    with guard:
        sent = record_sends(fn, t)
    return {"rank": r, "world_size": p, "n": n, "frames": [m["buffer"] for m in sent] + [
        t.tolist()], "sends": [{"dst": m["dst"], "start": m["start"], "size": len(m["values"])}
                               for m in sent]}


def record_ring_replay(fn_name: str = "ring_all_reduce", ranks: int = 4, n: int | None = None,
                       source: str | None = None, cluster: CourseCluster | None = None,
                       timeout: float = 120.0) -> list[dict[str, Any]]:
    """Run the learner's ring all-reduce on ``ranks`` ranks and record it for the ring replay.

    If the cluster (default: the current one) has ``ranks`` engines, it records there.
    Otherwise the ``%%px`` cell that defines ``fn_name`` (or ``source``, a cell's code, when
    there is no cluster to copy from) runs on ``ranks`` processes of their own
    (:func:`course_utils.checks.spawn.spawn`, what the graded tests use; seconds), which
    record and exit. The notebook's own cluster and process group are left as they were.
    Returns one record per rank for :func:`course_utils.viz.ring.replay_frames`.
    """
    from ..checks.spawn import RankFailed, spawn

    try:
        cc = cluster or current()
    except Exception:
        cc = None
    if cc is not None and cc.world_size == ranks and source is None:
        return cc.run(engine_record_ring_frames, fn_name, n, timeout=timeout)
    if source is None:
        if cc is None:
            raise ValueError("no cluster to copy the ring from: pass source= (the cell's code)")
        # A quick run on the notebook's own ranks first (under the watchdog): an unwritten or
        # stuck ring says so in a second, before other ranks are started for it.
        cc.run(engine_record_ring_frames, fn_name, n, timeout=60)
    try:
        return spawn(f"{__name__}:engine_record_ring_frames", ranks, cells=[fn_name],
                     cluster=cc, sources=None if source is None else [source],
                     timeout=timeout, fn_name=fn_name, n=n)
    except RankFailed as exc:
        raise RuntimeError(f"{fn_name} on {ranks} ranks of their own: rank {exc.rank}: "
                           f"{exc.said}. Run the tests of Exercise 1: they say what to "
                           "fix.") from None
