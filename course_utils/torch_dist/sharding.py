"""Where a rank's training memory goes, and sharding it (unit ``10_sharding_and_memory``).

Bytes are counted from the real tensors a rank holds (a DTensor counts its local shard), so the
numbers are what this rank keeps, not what the model has. The ``engine_*`` functions run on every
rank (``cluster.run``) and import torch there; the formulas are plain arithmetic for the kernel.
"""

from __future__ import annotations

import contextlib
import gc
import math
import time
import weakref
from collections.abc import Iterable
from typing import Any

from .spies import replaced

#: bytes per parameter, fp32: the weight, its gradient, Adam's two moments (exp_avg, exp_avg_sq)
PARAM_B, GRAD_B, ADAM_B = 4, 4, 8
#: DDP's gradient buckets: with ``gradient_as_bucket_view=False`` (DDP's default) the reducer
#: keeps one flat buffer per bucket, every gradient copied in before its all_reduce and back
#: after: a second copy of the gradients (torch's ``DistributedDataParallel`` docs of the flag,
#: and ``Reducer::Bucket::gradients`` in ``torch/csrc/distributed/c10d/reducer.hpp``)
BUCKET_B = 4


def padded_chunk(numel: int, world_size: int) -> int:
    """Elements per rank when ``numel`` is cut into ``world_size`` equal, padded pieces."""
    return math.ceil(numel / world_size)


def formula_bytes(n_params: int, p: int) -> dict[str, dict[str, float]]:
    """Bytes per rank (fp32 weights, Adam) for each strategy: params, grads, DDP's gradient
    buckets, optimizer state.

    DDP keeps everything on every rank, and by default its buckets are a second copy of the
    gradients (20 B per parameter; 16 with ``gradient_as_bucket_view=True``, where the gradients
    are views of the buckets); ZeRO-1 shards the optimizer state (the learner's reduce-scatters
    the gradients itself, no DDP and so no buckets; torch's ``ZeroRedundancyOptimizer`` runs
    under DDP, buckets included); ZeRO-2 also shards the gradients; FSDP (ZeRO-3) shards
    parameters, gradients and state and has no buckets (plus, while a layer runs, that one
    layer's full weights: not counted).
    """
    n = n_params
    ddp = {"params": PARAM_B * n, "grads": GRAD_B * n, "buckets": BUCKET_B * n}
    return {"DDP": {**ddp, "optimizer": ADAM_B * n},
            "DDP, bucket views": {**ddp, "buckets": 0, "optimizer": ADAM_B * n},
            "ZeRO-1": {**ddp, "buckets": 0, "optimizer": ADAM_B * n / p},
            "ZeRO-1 under DDP": {**ddp, "optimizer": ADAM_B * n / p},
            "ZeRO-2": {**ddp, "grads": GRAD_B * n / p, "buckets": 0,
                       "optimizer": ADAM_B * n / p},
            "FSDP": {"params": PARAM_B * n / p, "grads": GRAD_B * n / p, "buckets": 0,
                     "optimizer": ADAM_B * n / p}}


def fsdp_sent_bytes(shapes: Iterable[Iterable[int]], p: int, gather_bytes: int = 4,
                    reduce_bytes: int | None = None) -> float:
    """Bytes one rank sends per FSDP step over a ring, each parameter (of these shapes) cut
    along dim 0 and padded to ``ceil(rows/p)·p`` rows: an all_gather in forward and one in
    backward (``gather_bytes`` an element), and a reduce_scatter of its gradient
    (``reduce_bytes``, default ``gather_bytes``), each ``(p-1)/p`` of the padded tensor."""
    total = 0.0
    for shape in shapes:
        rows, *rest = list(shape)
        padded = padded_chunk(rows, p) * p * math.prod(rest)
        total += (p - 1) / p * padded * (2 * gather_bytes + (reduce_bytes or gather_bytes))
    return total


def ddp_sent_bytes(n_params: int, p: int, elem_bytes: int = 4) -> float:
    """Bytes one rank sends per DDP step over a ring all-reduce: ``2(p-1)/p`` of the gradients."""
    return 2 * (p - 1) / p * n_params * elem_bytes


def local(t: Any) -> Any:
    """The part of ``t`` this rank stores: a DTensor's local shard, else ``t`` itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def tensor_bytes(tensors: Iterable[Any]) -> int:
    """Bytes this rank stores for ``tensors`` (None skipped): tensors that are views of one
    storage count each distinct piece once, and never more than the storage holds (DDP's
    gradients with ``gradient_as_bucket_view=True`` are views of one bucket)."""
    pieces: dict[int, set[tuple[int, int]]] = {}
    sizes: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        t = local(t)
        storage = t.untyped_storage()
        key = storage.data_ptr() or id(t)
        pieces.setdefault(key, set()).add((t.storage_offset(), t.numel() * t.element_size()))
        sizes[key] = storage.nbytes()
    return sum(min(sum(n for _, n in got), sizes[key]) for key, got in pieces.items())


def optimizer_state_bytes(opt: Any) -> int:
    """Bytes of every tensor in a torch optimizer's state (Adam: exp_avg, exp_avg_sq, step).
    ``ZeroRedundancyOptimizer`` keeps its state in ``opt.optim``, the optimizer of its shard."""
    inner = getattr(opt, "optim", opt)
    return tensor_bytes(v for s in inner.state.values() for v in s.values()
                        if hasattr(v, "numel"))


def memory_of(model: Any, opt_bytes: int, buckets: Iterable[Any] = ()) -> dict[str, int]:
    """This rank's bytes of parameters and gradients of ``model``, of DDP's gradient
    ``buckets`` that are not the gradients themselves, and ``opt_bytes``."""
    params = list(model.parameters())
    grads = {local(p.grad).untyped_storage().data_ptr() for p in params if p.grad is not None}
    return {"params": tensor_bytes(params), "grads": tensor_bytes(p.grad for p in params),
            "buckets": tensor_bytes(b for b in buckets
                                    if b.untyped_storage().data_ptr() not in grads),
            "optimizer": opt_bytes}


def watch_buckets(ddp: Any, bf16: bool = False) -> dict[int, Any]:
    """The flat gradient buffers of ``ddp``'s buckets, filled in as its next backward reduces
    them: a communication hook that notes each bucket's buffer, then all-reduces it as DDP
    would (``default_hooks.allreduce_hook``; ``bf16``: ``bf16_compress_hook``, the bucket sent
    as bf16)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    seen: dict[int, Any] = {}
    reduce = default_hooks.bf16_compress_hook if bf16 else default_hooks.allreduce_hook

    def note(state, bucket):  # no annotations: DDP checks them, and these are strings here
        seen[bucket.index()] = bucket.buffer()
        return reduce(None, bucket)

    ddp.register_comm_hook(None, note)
    return seen


def mlp(width: int = 64, depth: int = 4, seed: int = 0, n_in: int = 16, n_out: int = 4) -> Any:
    """A small ``nn.Sequential`` of Linear + Tanh layers (the unit's model), seeded."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    dims = [n_in] + [width] * (depth - 1) + [n_out]
    layers: list[Any] = []
    for a, b in zip(dims[:-1], dims[1:], strict=True):
        layers += [nn.Linear(a, b), nn.Tanh()]
    return nn.Sequential(*layers[:-1])


def batches(steps: int, batch: int = 16, n_in: int = 16, n_out: int = 4,
            seed: int = 0) -> list[tuple[Any, Any]]:
    """``steps`` (x, y) regression batches for this rank (``seed`` plus the rank: its own data)."""
    import torch
    import torch.distributed as dist

    gen = torch.Generator().manual_seed(seed * 1000 + dist.get_rank())
    return [(torch.randn(batch, n_in, generator=gen), torch.randn(batch, n_out, generator=gen))
            for _ in range(steps)]


def engine_memory(strategy: str, width: int = 64, depth: int = 4, steps: int = 2,
                  lr: float = 1e-2, cls_name: str | None = None) -> dict[str, Any]:
    """*Collective.* Train ``steps`` Adam steps with ``strategy`` and count this rank's bytes.

    ``"ddp"``; ``"ddp_view"`` (DDP with ``gradient_as_bucket_view=True``); ``"zero1"`` (the
    learner's class ``cls_name``, default ``ShardedOptimizer``, wrapping Adam, no DDP);
    ``"zero2"`` (the same with ``ZeRO2Optimizer``, its gradient shard ``grad`` counted as
    gradients);
    ``"zero_torch"`` (``ZeroRedundancyOptimizer`` under DDP); ``"fsdp_hand"`` (the learner's
    ``cls_name``, default ``HandFSDP``); ``"fsdp2"`` (``fully_shard`` per Linear and the root);
    ``"ddp_bf16"``, ``"fsdp_hand_bf16"``, ``"fsdp2_bf16"`` (their bf16 variants, :data:`BF16`);
    ``"zero1_bf16"``, ``"zero2_bf16"`` (the learner's classes unchanged, the forward under
    ``torch.autocast`` in bf16: what autocast alone does to ZeRO's bytes).
    Under DDP the bucket buffers are noted by a communication hook (:func:`watch_buckets`) and
    counted where they are not the gradients themselves. ``"sent"``: the ring bytes this rank
    sends in one more, untimed, step (:class:`CollectiveCounter`; the hook's all_reduce of each
    bucket is a Python call it sees). With a GPU (NCCL) the model lives there and
    ``torch.cuda.max_memory_allocated`` is returned.
    """
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    dev = torch.device("cuda", torch.cuda.current_device()) if (
        dist.get_backend() == "nccl") else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    model, opt, step_model = build(strategy, mlp(width, depth).to(dev), lr, cls_name)
    buckets = watch_buckets(step_model, strategy.endswith(BF16)) if hasattr(
        step_model, "reducer") else {}
    n_params = sum(p.numel() for p in mlp(width, depth).parameters())
    times = []

    autocast = strategy in ("zero1" + BF16, "zero2" + BF16)

    def step(x: Any, y: Any) -> None:
        opt.zero_grad()
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast):
            loss = F.mse_loss(step_model(x.to(dev)), y.to(dev))
        loss.backward()
        opt.step()

    *timed, last = batches(steps + 2)
    for x, y in timed:
        t0 = time.perf_counter()
        step(x, y)
        times.append(time.perf_counter() - t0)
    with CollectiveCounter() as spy:  # one more step, counted; untimed (the counter's gc costs)
        step(*last)
    held = memory_of(model, opt_state(opt, model), buckets.values())
    if strategy.removesuffix(BF16) == "zero2":  # its gradient shard (``self.grad``): gradients
        moved = tensor_bytes([opt.grad])
        held["grads"] += moved
        held["optimizer"] -= moved
    out: dict[str, Any] = {"rank": dist.get_rank(), "strategy": strategy, "n_params": n_params,
                           **held, "sent": spy.sent,
                           "step_s": sorted(times[1:])[len(times[1:]) // 2]}
    if dev.type == "cuda":
        out["cuda_max_allocated"] = int(torch.cuda.max_memory_allocated(dev))
    return out


def opt_state(opt: Any, model: Any | None = None) -> int:
    """Optimizer-state bytes: a torch optimizer's state, or, for a learner's object, every tensor
    it holds (:func:`held_bytes`) apart from the model's own parameters and gradients."""
    if hasattr(opt, "optim") or hasattr(opt, "param_groups"):
        return optimizer_state_bytes(opt)
    return held_bytes(opt, model)


def held_bytes(obj: Any, model: Any | None = None, depth: int = 4) -> int:
    """Bytes of every tensor reachable from ``obj``'s attributes (lists, dicts, torch optimizers'
    state and parameters, objects defined in a notebook), each storage once, leaving out the
    storages of ``model``'s parameters and gradients (those are counted apart)."""
    skip: set[int] = set()
    if model is not None:
        for p in model.parameters():
            skip.add(local(p).untyped_storage().data_ptr())
            if p.grad is not None:
                skip.add(local(p.grad).untyped_storage().data_ptr())
    found: dict[int, int] = {}
    _walk(obj, depth, found, skip, set())
    return sum(found.values())


def _walk(obj: Any, depth: int, found: dict[int, int], skip: set[int], seen: set[int]) -> None:
    if depth < 0 or id(obj) in seen:
        return
    seen.add(id(obj))
    if hasattr(obj, "untyped_storage") and hasattr(obj, "numel"):
        t = local(obj)
        key = t.untyped_storage().data_ptr()
        if key not in skip and t.numel():
            found[key] = max(found.get(key, 0), t.untyped_storage().nbytes())
        if getattr(obj, "grad", None) is not None:
            _walk(obj.grad, depth - 1, found, skip, seen)
        return
    if hasattr(obj, "param_groups") and hasattr(obj, "state"):   # a torch optimizer
        _walk(list(obj.state.values()), depth, found, skip, seen)
        _walk([g["params"] for g in obj.param_groups], depth, found, skip, seen)
        return
    if isinstance(obj, dict):
        items: Iterable[Any] = obj.values()
    elif isinstance(obj, list | tuple | set):
        items = obj
    elif getattr(type(obj), "__module__", "") == "__main__" or hasattr(obj, "_parameters"):
        items = vars(obj).values()
    else:
        return
    for v in items:
        _walk(v, depth - 1, found, skip, seen)


#: a strategy's name with this suffix: its bf16 variant (DDP: ``bf16_compress_hook``; FSDP,
#: yours and FSDP2: bf16 compute and gathers, fp32 reductions; your ZeRO classes: bf16 autocast)
BF16 = "_bf16"


def build(strategy: str, model: Any, lr: float, cls_name: str | None) -> tuple[Any, Any, Any]:
    """(model whose tensors are counted, optimizer, module to call) for ``strategy``."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    import __main__

    half = strategy.endswith(BF16)
    strategy = strategy.removesuffix(BF16)
    if strategy in ("ddp", "ddp_view"):
        ddp = DDP(model, gradient_as_bucket_view=strategy == "ddp_view")
        return model, torch.optim.Adam(model.parameters(), lr=lr), ddp
    if strategy in ("zero1", "zero2"):
        default = "ShardedOptimizer" if strategy == "zero1" else "ZeRO2Optimizer"
        cls = vars(__main__)[cls_name or default]
        return model, cls(model.parameters(), torch.optim.Adam, lr=lr), model
    if strategy == "zero_torch":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        ddp = DDP(model)
        zero = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                       lr=lr)
        return model, zero, ddp
    if strategy == "fsdp_hand":
        cls = vars(__main__)[cls_name or "HandFSDP"]
        sharded = cls(model, **({"compute_dtype": torch.bfloat16,
                                 "reduce_dtype": torch.float32} if half else {}))
        return sharded, torch.optim.Adam(sharded.parameters(), lr=lr), sharded
    if strategy == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        kw = {"mp_policy": MixedPrecisionPolicy(torch.bfloat16, torch.float32)} if half else {}
        for layer in model:
            if any(True for _ in layer.parameters()):
                fully_shard(layer, **kw)
        fully_shard(model, **kw)
        return model, torch.optim.Adam(model.parameters(), lr=lr), model
    raise ValueError(f"unknown strategy {strategy!r}: use ddp, ddp_view, zero1, zero2, "
                     "zero_torch, fsdp_hand, fsdp2")


def memory_table(rows: list[dict[str, Any]], p: int) -> str:
    """A text table of measured bytes per rank (rank 0's row per strategy) beside the formula."""
    names = {"ddp": "DDP", "ddp_view": "DDP, bucket views", "zero1": "ZeRO-1", "zero2": "ZeRO-2",
             "zero_torch": "ZeRO-1 under DDP", "fsdp_hand": "FSDP", "fsdp2": "FSDP"}
    parts = ("params", "grads", "buckets", "optimizer")
    lines = [f"{'strategy':<34}{'params':>9}{'grads':>9}{'buckets':>9}{'optimizer':>11}"
             f"{'total':>9}  B/param{'sent/step':>11}   formula (params/grads/buckets/optimizer)"]
    for r in rows:
        f = formula_bytes(r["n_params"], p)[names[r["strategy"].removesuffix(BF16)]]
        got = [r.get(k, 0) for k in parts]
        sent = f"{r['sent']:>11,.0f}" if "sent" in r else f"{'':>11}"
        lines.append(f"{LABELS.get(r['strategy'], r['strategy']):<34}{got[0]:>9,}{got[1]:>9,}"
                     f"{got[2]:>9,}{got[3]:>11,}{sum(got):>9,}{sum(got) / r['n_params']:>9.1f}"
                     f"{sent}   " + "/".join(f"{f[k]:,.0f}" for k in parts))
    return "\n".join(lines)


def step_time_line(rows: dict[str, list[dict[str, Any]]]) -> str:
    """The learner's ZeRO-1 and FSDP step times beside torch's (the slowest rank's median of
    :func:`engine_memory`'s steps), ``rows`` keyed by strategy as unit 10 collects them."""
    ms = {name: 1e3 * max(r["step_s"] for r in rs) for name, rs in rows.items()}
    return (f"step time (slowest rank's median): yours {ms['zero1']:.1f} ms vs "
            f"ZeroRedundancyOptimizer {ms['zero_torch']:.1f} ms "
            f"({ms['zero1'] / ms['zero_torch']:.2f}x); HandFSDP {ms['fsdp_hand']:.1f} ms vs "
            f"fully_shard {ms['fsdp2']:.1f} ms ({ms['fsdp_hand'] / ms['fsdp2']:.2f}x)")


#: the collectives a probe counts: name -> bytes one rank sends over a ring, from the call
RING_SENT = {
    "all_gather_into_tensor": lambda out, inp, p: (p - 1) / p * _nbytes(out),
    "reduce_scatter_tensor": lambda out, inp, p: (p - 1) / p * _nbytes(inp),
    "all_reduce": lambda t, *_a: 2 * (_a[-1] - 1) / _a[-1] * _nbytes(t),
    "all_gather": lambda outs, inp, p: (p - 1) * _nbytes(inp),
    "reduce_scatter": lambda out, inps, p: (p - 1) * _nbytes(out),
    "broadcast": lambda t, *_a: _nbytes(t),
    # torch 2.13's names for the first two (those are now deprecated aliases of these)
    "all_gather_single": lambda out, inp, p: (p - 1) / p * _nbytes(out),
    "reduce_scatter_single": lambda out, inp, p: (p - 1) / p * _nbytes(inp),
}


#: torch 2.13's names of the collectives it renamed: a call by either name counts under the new
CANONICAL = {"all_gather_into_tensor": "all_gather_single",
             "reduce_scatter_tensor": "reduce_scatter_single"}

#: the keyword names of the tensors of those collectives, output before input (torch's FSDP2
#: passes ``output=``/``input=`` to ``reduce_scatter_single``)
TENSOR_ARGS = ("tensor", "output", "output_tensor", "output_tensor_list", "tensor_list", "input",
               "input_tensor", "input_list", "input_tensor_list")


def _nbytes(t: Any) -> int:
    return t.numel() * t.element_size()


def _group_size(group: Any) -> int:
    """Ranks in ``group`` (a 2-D mesh's dimension is a group smaller than the world)."""
    import torch.distributed as dist

    return dist.get_world_size(group)


class CollectiveCounter:
    """Counts calls (by :data:`CANONICAL` name) and ring bytes of the collectives in
    :data:`RING_SENT` while active, and tracks how many bytes of all_gather outputs are alive
    at once (a weakref finalizer per output: it runs when the tensor, its views and autograd's
    saved copies are all gone). At :meth:`reset`, and before a gather that would raise the
    peak, the cycle collector runs while some output is counted alive, so that an output only
    garbage in a reference cycle still holds is not counted alive: without it the peak depended
    on when Python's collector happened to run (three layers could count alive instead of
    two). Only then: one collection costs ~80 ms on a rank with torch loaded, which is why no
    timed step runs under it."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.sent = 0.0
        self.live = 0
        self.peak_live = 0
        self._spies = contextlib.ExitStack()

    def __enter__(self) -> CollectiveCounter:
        import torch.distributed as dist

        p = dist.get_world_size()
        self._spies.enter_context(replaced(
            lambda name, real: self._wrap(name, real, RING_SENT[name], p), RING_SENT))
        return self

    def __exit__(self, *exc: Any) -> None:
        self._spies.close()

    def _wrap(self, name: str, real: Any, cost: Any, p: int) -> Any:
        key = CANONICAL.get(name, name)

        def spy(*args: Any, **kwargs: Any) -> Any:
            vals = list(args) + [kwargs[k] for k in TENSOR_ARGS if k in kwargs]
            self.calls[key] = self.calls.get(key, 0) + 1
            size = p if kwargs.get("group") is None else _group_size(kwargs["group"])
            self.sent += cost(vals[0], vals[1] if len(vals) > 1 else None, size)
            if key == "all_gather_single":
                n = _nbytes(vals[0])
                if self.live and self.live + n > self.peak_live:
                    gc.collect()  # what only garbage holds is freed before it counts
                self.live += n
                self.peak_live = max(self.peak_live, self.live)
                weakref.finalize(vals[0], self._freed, n)
            return real(*args, **kwargs)
        return spy

    def _freed(self, n: int) -> None:
        self.live -= n

    def reset(self) -> None:
        if self.live:  # nothing counted alive: nothing for the collector to free
            gc.collect()
        self.calls, self.sent, self.peak_live = {}, 0.0, self.live


#: How the tables and figures name each strategy.
LABELS = {"ddp": "DDP + Adam", "ddp_view": "DDP, gradient_as_bucket_view",
          "zero1": "ZeRO-1 (your ShardedOptimizer)", "zero2": "ZeRO-2 (your ZeRO2Optimizer)",
          "zero_torch": "ZeroRedundancyOptimizer + DDP", "fsdp_hand": "FSDP (your HandFSDP)",
          "fsdp2": "FSDP2 fully_shard", "ddp_bf16": "DDP, bf16_compress_hook",
          "fsdp_hand_bf16": "your HandFSDP, bf16/fp32", "fsdp2_bf16": "FSDP2, bf16/fp32 policy",
          "zero1_bf16": "ZeRO-1 (yours), bf16 autocast",
          "zero2_bf16": "ZeRO-2 (yours), bf16 autocast"}


def fsdp2_model(width: int = 64, depth: int = 4, seed: int = 0,
                reshard_after_forward: bool = True, mixed: bool = False) -> Any:
    """:func:`mlp` with FSDP2's ``fully_shard`` on every Linear, then on the root (torch's docs
    of ``fully_shard``: call it bottom-up; one all_gather per call's group of parameters).
    ``mixed``: ``MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)``."""
    import torch
    from torch import nn
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kw: dict[str, Any] = {"reshard_after_forward": reshard_after_forward}
    if mixed:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                               reduce_dtype=torch.float32)
    model = mlp(width, depth, seed)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, **kw)
    fully_shard(model, **kw)
    return model


def engine_fsdp2_traffic(reshard_after_forward: bool = True, steps: int = 2,
                         mixed: bool = False, micro: int = 1) -> dict[str, Any]:
    """*Collective.* FSDP2 steps with the collectives counted (:class:`CollectiveCounter`):
    all_gathers and reduce_scatters of the last step and the ring bytes sent, for one setting
    of ``reshard_after_forward`` and ``mixed`` (:func:`fsdp2_model`). ``micro`` > 1: each step
    accumulates that many micro-batches' gradients, the gradient sync off
    (``model.set_requires_gradient_sync(False)``) for all but the last."""
    import torch
    import torch.nn.functional as F

    model = fsdp2_model(reshard_after_forward=reshard_after_forward, mixed=mixed)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    with CollectiveCounter() as spy:
        for x, y in batches(steps, batch=16 * micro):
            spy.reset()
            opt.zero_grad()
            for i, (xm, ym) in enumerate(zip(x.chunk(micro), y.chunk(micro), strict=True)):
                model.set_requires_gradient_sync(i == micro - 1)
                F.mse_loss(model(xm), ym).backward()
            opt.step()
    return {"reshard_after_forward": reshard_after_forward, "mixed": mixed, "micro": micro,
            "calls": dict(spy.calls), "sent": spy.sent}
