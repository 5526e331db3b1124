"""Engine-side probes behind the graded tests of ``11_tensor_and_pipeline``: the learner's
conjugate autograd functions (``CopyToTP``, ``ReduceFromTP``), Megatron MLP block (``TPMLP``),
pipeline schedules (``gpipe_step``, ``one_f_one_b_step``) and 2-D set-up with torch's own
(``torch_2d``), each against one process on the whole batch, with the collectives and the
point-to-point bytes counted.

They run on worlds of their own (:func:`~course_utils.checks.spawn.spawn`: 3 or 4 ranks while
the notebook's cluster has 2), so that a rank that fails before a collective cannot leave the
notebook's group waiting in it.
"""

from __future__ import annotations

import copy
from typing import Any

from ..cluster.engines.engine import px_name
from ..torch_dist import parallelism as par
from ..torch_dist.pipeline_stage import TimedStage
from ..torch_dist.sharding import CollectiveCounter, ddp_sent_bytes
from .common import learner_line

#: what a learner's error usually means in this unit, by exception type or message
HINTS = {"AttributeError": "name the layers self.fc1 (column-parallel) and self.fc2 "
                          "(row-parallel), and keep their parameters as .weight and .bias",
         "RuntimeError": "check the shapes: the column layer keeps rows of the weight "
                         "(dim 0), the row layer keeps columns (dim 1)",
         "Timed out": "a send on gloo waits until its neighbour posts the matching recv: when "
                      "two neighbours both send first (rank r its activation, rank r+1 its "
                      "gradient) both wait for ever. Send with dist.isend and wait for the "
                      "requests at the end of the step; receive with dist.recv",
         "TypeError": "keep the signature you were given"}


def hint_for(e: BaseException) -> str:
    """What ``e`` usually means in this unit (:data:`HINTS`)."""
    if "Timed out" in str(e) or "timed out" in str(e):
        return HINTS["Timed out"]
    if "does not require grad" in str(e):
        return ("return what forward computed from its input (F.linear(...), the Function's "
                "output), so that autograd keeps the graph back to the weights")
    return HINTS.get(type(e).__name__, "read the line named")


def _failed(out: dict[str, Any], e: BaseException) -> dict[str, Any]:
    return {**out, "error": f"{type(e).__name__}: {str(e)[:300]}", "line": learner_line(e),
            "hint": hint_for(e)}


def engine_check_conjugates(copy_name: str = "CopyToTP", reduce_name: str = "ReduceFromTP",
                            dtypes: tuple[str, ...] = ("float32", "float64")) -> dict[str, Any]:
    """*Collective.* Each conjugate on a rank-dependent input of each of ``dtypes``: its
    forward's output, its input's gradient for a rank-dependent output gradient, the
    collectives each pass called, whether the input was changed in place, and the dtypes of
    output and gradient; ``cases[dtype][name]``."""
    import torch
    import torch.distributed as dist

    rank, p = dist.get_rank(), dist.get_world_size()
    out: dict[str, Any] = {"rank": rank, "p": p, "cases": {}}
    try:
        for dtype in dtypes:
            base = torch.arange(6.0, dtype=getattr(torch, dtype)).reshape(2, 3)
            case = out["cases"][dtype] = {}
            for name, summed_forward in ((copy_name, False), (reduce_name, True)):
                x = (base + rank).requires_grad_()
                with CollectiveCounter() as c:
                    y = px_name(name).apply(x)
                    fwd = dict(c.calls)
                    c.reset()
                    y.backward(torch.full_like(y, float(rank + 1)))
                    bwd = dict(c.calls)
                want_y = p * base + p * (p - 1) / 2 if summed_forward else base + rank
                want_g = float(rank + 1) if summed_forward else p * (p + 1) / 2
                case[name] = {"forward_calls": fwd, "backward_calls": bwd,
                              "y_diff": float((y.detach() - want_y).abs().max()),
                              "grad_diff": float((x.grad - want_g).abs().max()),
                              "input_changed": float((x.detach() - base - rank).abs().max()),
                              "dtypes": [str(y.dtype), str(x.grad.dtype)]}
    except Exception as e:
        return _failed(out, e)
    return out


def engine_check_tp(cls_name: str = "TPMLP", rows: int = 8, more_rows: tuple[int, ...] = (3,)
                    ) -> dict[str, Any]:
    """*Collective.* The learner's ``cls_name(block, rank, world_size)`` against the whole
    block in one process, on the same batch on every rank: the output, the input's gradient,
    each shard's gradient against its slice of the full one, the collectives of forward and of
    backward with their ring bytes, and the bytes of parameters this rank holds; then the
    output and input gradient on batches of each of ``more_rows`` rows (``more``)."""
    import torch
    import torch.distributed as dist

    rank, p = dist.get_rank(), dist.get_world_size()
    block = par.mlp_block()
    g = torch.Generator().manual_seed(2)
    x = torch.randn(rows, par.D_MODEL, generator=g)
    target = torch.randn(rows, par.D_MODEL, generator=g)
    xr = x.clone().requires_grad_()
    ref = block(xr)
    ((ref - target) ** 2).mean().backward()
    n_params = sum(q.numel() for q in block.parameters())
    out: dict[str, Any] = {"rank": rank, "p": p, "rows": rows, "n_params": n_params,
                           "full_bytes": 4 * n_params, "ddp_sent": ddp_sent_bytes(n_params, p)}
    try:
        tp = px_name(cls_name)(copy.deepcopy(par.mlp_block()), rank, p)
        xt = x.clone().requires_grad_()
        with CollectiveCounter() as c:
            y = tp(xt)
            out["forward_calls"], fwd_sent = dict(c.calls), c.sent
            c.reset()
            ((y - target) ** 2).mean().backward()
            out["backward_calls"], out["sent"] = dict(c.calls), fwd_sent + c.sent
        h = par.HIDDEN // p
        want = {"fc1.weight": block[0].weight.grad[rank * h:(rank + 1) * h],
                "fc1.bias": block[0].bias.grad[rank * h:(rank + 1) * h],
                "fc2.weight": block[2].weight.grad[:, rank * h:(rank + 1) * h],
                "fc2.bias": block[2].bias.grad}
        mine = dict(tp.named_parameters())
        out["shapes"] = {k: list(v.shape) for k, v in mine.items()}
        out["want_shapes"] = {k: list(v.shape) for k, v in want.items()}
        out["grad_diff"] = {k: float((mine[k].grad - v).abs().max())
                            if k in mine and mine[k].grad is not None
                            and mine[k].shape == v.shape else float("inf")
                            for k, v in want.items()}
        out["out_diff"] = float((y.detach() - ref.detach()).abs().max())
        out["x_grad_diff"] = float((xt.grad - xr.grad).abs().max())
        out["held_bytes"] = sum(q.nbytes for q in tp.parameters())
        out["more"] = {n: _tp_diffs(tp, block, n) for n in more_rows}
    except Exception as e:
        return _failed(out, e)
    return out


def _tp_diffs(tp: Any, block: Any, rows: int) -> dict[str, float]:
    """The largest differences of ``tp``'s output and input gradient from ``block``'s on a
    batch of ``rows`` rows."""
    import torch

    x = torch.randn(rows, par.D_MODEL, generator=torch.Generator().manual_seed(rows))
    xr, xt = x.clone().requires_grad_(), x.clone().requires_grad_()
    ref, y = block(xr), tp(xt)
    ref.square().sum().backward()
    y.square().sum().backward()
    return {"out_diff": float((y.detach() - ref.detach()).abs().max()),
            "x_grad_diff": float((xt.grad - xr.grad).abs().max())}


def engine_check_pipeline(fn_name: str, m: int = 8, rows: int = 8, width: int = 64,
                          warmup: int = 1) -> dict[str, Any]:
    """*Collective.* The learner's schedule ``fn_name(stage, inputs, targets, loss_fn)`` on a
    pipeline of one stage per rank (a :class:`~course_utils.torch_dist.pipeline_stage.TimedStage`
    over ``m`` microbatches) against the whole model in one process on every microbatch (the
    mean of their losses), after ``warmup`` untimed steps (their gradients zeroed): this
    stage's gradients, the loss returned, the timeline, the most
    microbatches in flight, the bytes of activations kept at most, and the sends (all, and
    ``tensor_sends``: those of one activation's size; torch's schedule also sends a few
    bytes of its own)."""
    import torch.distributed as dist
    from torch import nn

    rank, p = dist.get_rank(), dist.get_world_size()
    xs, ts = par.microbatches(m, rows, width)
    full = par.pipeline_model(p, width)
    loss = sum(nn.functional.mse_loss(full(x), t) for x, t in zip(xs, ts, strict=True)) / m
    loss.backward()
    stage = TimedStage(par.pipeline_model(p, width)[rank])
    out: dict[str, Any] = {"rank": rank, "p": p, "m": m, "rows": rows, "width": width}
    try:
        fn = px_name(fn_name, to_call=True)
        for _ in range(warmup):  # a first step pays one-time costs the timeline should not show
            fn(stage, xs, ts, nn.MSELoss())
            stage.module.zero_grad(set_to_none=True)
            stage.reset()
        dist.barrier()
        with par.P2PCounter() as c:
            got = fn(stage, xs, ts, nn.MSELoss())
        dist.barrier()
    except Exception as e:
        return _failed(out, e)
    pairs = list(zip(stage.module.parameters(), full[rank].parameters(), strict=True))
    out.update(
        grad_diff=max(float((a.grad - b.grad).abs().max()) if a.grad is not None
                      else float("inf") for a, b in pairs),
        loss=None if got is None else float(got), ref_loss=float(loss),
        events=stage.events, in_flight=stage.most_in_flight(), peak_saved=stage.peak_live,
        saved_per_micro=max(stage.saved_per_micro, default=0), calls=c.calls, sent=c.sent,
        tensor_sends=c.sizes.get(rows * width * 4, 0))
    return out


def engine_check_torch_2d(fn_name: str = "torch_2d", rows: int = 8) -> dict[str, Any]:
    """*Collective, on 4 ranks.* The learner's ``fn_name(block, mesh)`` on a (dp=2, tp=2)
    mesh: one SGD step, each dp group on its own batch, against one process on both batches
    (the mean loss): the output, the weights after the step (``full_tensor()``), and which
    parameters are DTensors on which mesh dimensions."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp = mesh.get_local_rank("dp")
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(rows, par.D_MODEL, generator=g) for _ in range(2)]
    ts = [torch.randn(rows, par.D_MODEL, generator=g) for _ in range(2)]
    ref = par.mlp_block()
    ref_out = ref(xs[dp]).detach()
    sum(((ref(x) - t) ** 2).mean() for x, t in zip(xs, ts, strict=True)).div(2).backward()
    with torch.no_grad():
        for q in ref.parameters():
            q -= 0.1 * q.grad
    out: dict[str, Any] = {"rank": rank}
    try:
        model = px_name(fn_name, to_call=True)(par.mlp_block(), mesh)
        y = model(xs[dp])
        out["out_diff"] = float((_full(y).detach() - ref_out).abs().max())
        ((_full(y) - ts[dp]) ** 2).mean().backward()
        torch.optim.SGD(model.parameters(), lr=0.1).step()
        full = {k: _full(v).detach() for k, v in model.named_parameters()}
    except Exception as e:
        return _failed(out, e)
    out["weight_diff"] = max(float((full[k] - v).abs().max())
                             for k, v in ref.named_parameters() if k in full)
    out["missing"] = sorted(set(dict(ref.named_parameters())) - set(full))
    out["placements"] = {k: str(getattr(v, "placements", "plain tensor"))
                         for k, v in model.named_parameters()}
    out["mesh_dims"] = {k: list(getattr(getattr(v, "device_mesh", None), "mesh_dim_names",
                                        None) or []) for k, v in model.named_parameters()}
    return out


def _full(t: Any) -> Any:
    """A DTensor's whole value (a plain tensor as it is)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t
