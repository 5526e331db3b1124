"""Engine-side probes behind the graded tests of ``10_sharding_and_memory``: the learner's
ZeRO-1 and ZeRO-2 optimizers (``ShardedOptimizer``, ``ZeRO2Optimizer``) against DDP and torch's
optimizers, and hand-made FSDP (``HandFSDP``) against one process on the whole batch, with the
collectives spied on (calls, bytes, how long gathered weights live).

The same probes run on a world of its own gloo processes
(:func:`~course_utils.checks.spawn.spawn`, e.g. 4 ranks while the notebook's cluster has 2),
which first run the learner's cells, read back on rank 0's engine.
"""

from __future__ import annotations

import math
import time
from typing import Any

from ..cluster.engines.engine import px_name
from ..torch_dist import sharding
from .common import learner_line

#: what a learner's error usually means here, by exception type
HINTS = {"AttributeError": "a parameter with requires_grad=False has no .grad (None): keep only "
                           "trainable parameters",
         "TypeError": "pass the optimizer's arguments on as you were given them: "
                      "optimizer_cls([your shard], **kwargs)",
         "ValueError": "check the sizes: every rank's piece must have the same number of "
                       "elements (pad the flat vector to chunk * world_size and each shard "
                       "to chunk)"}


def hint_for(e: BaseException, hints: dict[str, str] = HINTS) -> str:
    """What ``e`` usually means in an exercise (``hints``, default :data:`HINTS`); a size
    mismatch (gloo's "Check failed: ... Shape", a RuntimeError) as a size error, a dtype
    mismatch between a collective's tensors as such."""
    name = type(e).__name__
    if name == "RuntimeError" and ("Shape" in str(e) or "size" in str(e).lower()):
        name = "ValueError"
    elif name == "RuntimeError" and "dtype" in str(e):
        return "give each collective's output the dtype of its input"
    return hints.get(name, "read the line named")


#: exercise 2's: the sizes are a unit's rows
FSDP_HINTS = {**HINTS, "ValueError": "check the sizes: cut each gathered parameter to its rows "
                                     "(self.shapes[i]); pad each gradient to chunk·p rows"}


def zero1_model(seed: int = 0) -> Any:
    """The probe's model: 1,797 trainable parameters (odd: uneven shards on 2 and 4 ranks), a
    frozen bias and a weight tied between two layers."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(17, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(),
                      nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 5))
    m[4].weight = m[2].weight
    m[0].bias.requires_grad_(False)
    return m


#: the optimizers the ZeRO-1 probe wraps, with arguments that are not their defaults (a sharded
#: optimizer must pass them on): AdamW with weight decay, SGD with momentum
ZERO1_CASES = (("AdamW", {"lr": 1e-2, "betas": (0.8, 0.95), "eps": 1e-3, "weight_decay": 0.1}),
               ("SGD", {"lr": 5e-2, "momentum": 0.9, "weight_decay": 1e-2}))


def engine_check_zero1(cls_name: str = "ShardedOptimizer", steps: int = 4) -> dict[str, Any]:
    """*Collective.* The learner's ``cls_name(params, optimizer_cls, **kwargs)`` (ZeRO-1's
    ``ShardedOptimizer`` or ZeRO-2's ``ZeRO2Optimizer``) on a plain model (no DDP: it does all
    the communication) against DDP + ``optimizer_cls`` on the same data (the last step
    accumulates two micro-batches' gradients), for each of :data:`ZERO1_CASES`: max
    |w - w_ref|, the frozen bias untouched, the tied weight still one tensor, the bytes the
    optimizer holds, the most bytes of full gradients alive during backward, the collectives
    and ring bytes of the first step
    (:class:`~course_utils.torch_dist.sharding.CollectiveCounter`), and step times beside
    ``ZeroRedundancyOptimizer`` (AdamW).

    ``params`` is passed as the parameters of each layer in turn, so the tied weight appears
    twice (as when two modules' ``parameters()`` are concatenated)."""
    import torch
    import torch.distributed as dist

    cls = px_name(cls_name)
    out: dict[str, Any] = {"rank": dist.get_rank(), "p": dist.get_world_size(), "cases": {}}
    data = sharding.batches(steps + 3, n_in=17, n_out=5, seed=1)
    for name, kw in ZERO1_CASES:
        try:
            case = _zero1_case(cls, getattr(torch.optim, name), kw, data, steps)
        except Exception as e:  # reported in the test's message, with the learner's line
            return {**out, "error": f"{type(e).__name__}: {e} (with torch.optim.{name})",
                    "line": learner_line(e), "hint": hint_for(e)}
        out["cases"][name] = case
    return out


def _zero1_case(cls: Any, opt_cls: Any, kw: dict[str, Any], data: list[tuple[Any, Any]],
                steps: int) -> dict[str, Any]:
    """One optimizer's run of :func:`engine_check_zero1`."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    ref = zero1_model()
    ref_ddp, ref_opt = DDP(ref), opt_cls(ref.parameters(), **kw)
    model = zero1_model()
    frozen = model[0].bias.detach().clone()
    opt = cls([q for layer in model for q in layer.parameters()], opt_cls, **kw)
    peak = _watch_grad_peak(model)  # after the learner's own hooks, so it runs after them
    first: dict[str, Any] = {}
    with sharding.CollectiveCounter() as spy:
        for i, (x, y) in enumerate(data[:steps]):
            # the last step accumulates two micro-batches' gradients (as .grad does)
            micro = list(zip(x.chunk(2), y.chunk(2), strict=True)) if i == steps - 1 else [
                (x, y)]
            ref_opt.zero_grad()
            for xm, ym in micro:
                F.mse_loss(ref_ddp(xm), ym).backward()
            ref_opt.step()
            spy.reset()
            opt.zero_grad()
            for xm, ym in micro:
                F.mse_loss(model(xm), ym).backward()
            opt.step()
            first = first or {"calls": dict(spy.calls), "sent": spy.sent}
    n = sum(q.numel() for q in ref.parameters() if q.requires_grad)
    diff = max(float((a - b).abs().max()) for a, b in zip(model.parameters(),
                                                           ref.parameters(), strict=True))
    case = {"max_weight_diff": diff, "n_params": n, **first,
            "ddp_sent": sharding.ddp_sent_bytes(n, dist.get_world_size()),
            "ref_state_bytes": sharding.optimizer_state_bytes(ref_opt),
            "held_bytes": sharding.held_bytes(opt, model), "peak_grad_bytes": peak["bytes"],
            "largest_grad_bytes": 4 * max(q.numel() for q in model.parameters()),
            "n_tensors": sum(1 for q in model.parameters() if q.requires_grad),
            "frozen_changed": float((model[0].bias - frozen).abs().max()),
            "tied": model[4].weight is model[2].weight}
    if opt_cls is torch.optim.AdamW:
        zero = ZeroRedundancyOptimizer(ref.parameters(), optimizer_class=opt_cls, **kw)
        case["step_s"] = {"yours": _median_step(model, opt, data[steps:]),
                          "ZeroRedundancyOptimizer": _median_step(ref_ddp, zero, data[steps:])}
    return case


def _watch_grad_peak(model: Any) -> dict[str, int]:
    """The most bytes of ``model``'s full ``.grad`` tensors alive at once during backward, as
    seen after each parameter's gradient is accumulated (a hook registered after any of the
    learner's, so it sees what those left): the whole model's under ZeRO-1 (every gradient
    waits for step), at most one parameter's under ZeRO-2 (each freed once reduced)."""
    params = list({id(q): q for q in model.parameters() if q.requires_grad}.values())
    peak = {"bytes": 0}

    def note(_param: Any) -> None:
        alive = sharding.tensor_bytes(q.grad for q in params)
        peak["bytes"] = max(peak["bytes"], alive)

    for q in params:
        q.register_post_accumulate_grad_hook(note)
    return peak


def _median_step(module: Any, opt: Any, data: list[tuple[Any, Any]]) -> float:
    """The median seconds of a training step (barrier first) over ``data``."""
    import statistics

    import torch.distributed as dist
    import torch.nn.functional as F

    times = []
    for x, y in data:
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        F.mse_loss(module(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def block_model(seed: int = 0) -> Any:
    """The FSDP probe's model, a transformer block's kinds of layer in a row: an Embedding of 40
    tokens, LayerNorm, Linear 16->48, GELU, Linear 48->16, LayerNorm, Linear 16->5 (its weight's
    5 rows: uneven shards on 2 and 4 ranks)."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    return nn.Sequential(nn.Embedding(40, 16), nn.LayerNorm(16), nn.Linear(16, 48), nn.GELU(),
                         nn.Linear(48, 16), nn.LayerNorm(16), nn.Linear(16, 5))


def token_batches(steps: int, batch: int = 16, seq: int = 6, seed: int = 2) -> list[Any]:
    """``steps`` global batches (tokens, targets), the same on every rank."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, 40, (batch, seq), generator=gen),
             torch.randn(batch, seq, 5, generator=gen)) for _ in range(steps)]


def engine_check_fsdp(cls_name: str = "HandFSDP", steps: int = 3, lr: float = 1e-2,
                      compute_dtype: str | None = None,
                      reduce_dtype: str | None = None) -> dict[str, Any]:
    """*Collective.* The learner's ``cls_name(module, compute_dtype=..., reduce_dtype=...)``
    (dtypes by name) on :func:`block_model`, trained with Adam over its ``parameters()`` on
    this rank's rows of each global batch (``finish_gradient_sync()`` after backward), next to
    the same model trained by one process on the whole batch (here, on every rank): the largest
    difference of ``gather_full_params()`` from that model's parameters (by name), of the
    outputs, the collectives and ring bytes of each step, and the peak bytes of gathered
    weights alive at once."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    cls = px_name(cls_name)
    p, rank = dist.get_world_size(), dist.get_rank()
    data = token_batches(steps + 1)
    ref = block_model()
    ref_opt = torch.optim.Adam(ref.parameters(), lr=lr)
    units = [list(m.parameters(recurse=False)) for m in ref.modules()]
    unit_bytes = sorted(4 * sum(q.numel() for q in u) for u in units if u)
    out: dict[str, Any] = {"rank": rank, "p": p,
                           "param_shapes": [list(q.shape) for q in ref.parameters()],
                           "model_bytes": sum(unit_bytes), "two_units_bytes": sum(unit_bytes[-2:])}
    kw = {k: getattr(torch, v) for k, v in (("compute_dtype", compute_dtype),
                                            ("reduce_dtype", reduce_dtype)) if v}
    try:
        ours = cls(block_model(), **kw)
        opt = torch.optim.Adam(ours.parameters(), lr=lr)
        per_step = []
        with sharding.CollectiveCounter() as spy:
            for x, y in data[:steps]:
                ref_opt.zero_grad()
                F.mse_loss(ref(x), y).backward()
                ref_opt.step()
                spy.reset()
                opt.zero_grad()
                F.mse_loss(ours(x.chunk(p)[rank]), y.chunk(p)[rank]).backward()
                ours.finish_gradient_sync()
                opt.step()
                per_step.append({"calls": dict(spy.calls), "sent": spy.sent,
                                 "peak_live": spy.peak_live})
        with torch.no_grad():
            out_diff = float((ours(data[-1][0]).float() - ref(data[-1][0])).abs().max())
        full = ours.gather_full_params()
    except Exception as e:
        return {**out, "error": f"{type(e).__name__}: {e}", "line": learner_line(e),
                "hint": hint_for(e, FSDP_HINTS)}
    want = dict(ref.named_parameters())
    out.update(steps=per_step, output_diff=out_diff, names_ok=set(full) == set(want),
               weight_diff=max((float((full[k].float() - want[k]).abs().max())
                                if k in full and full[k].shape == want[k].shape else math.inf)
                               for k in want),
               params_bytes=sharding.tensor_bytes(ours.parameters()))
    return out


def engine_check_bounds(fn_name: str = "shard_bounds") -> dict[str, Any]:
    """The learner's ``fn_name(numel, rank, world_size)`` on sizes that do and do not divide:
    contiguous, in rank order, covering ``[0, numel)`` exactly, at most ``ceil(numel/p)`` each."""
    fn = px_name(fn_name)
    bad = []
    for numel, p in ((10, 4), (8, 4), (2, 4), (1797, 2), (0, 3), (7, 1)):
        got = [tuple(fn(numel, r, p)) for r in range(p)]
        ends = [0] + [b for _, b in got]
        ok = all(a == ends[i] for i, (a, _) in enumerate(got)) and ends[-1] == numel and all(
            0 <= b - a <= math.ceil(numel / p) for a, b in got)
        if not ok:
            bad.append(f"numel={numel}, p={p}: {got}")
    return {"ok": not bad, "bad": bad, "example": [tuple(fn(10, r, 4)) for r in range(4)]}
