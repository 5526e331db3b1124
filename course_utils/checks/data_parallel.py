"""Engine-side probe behind the graded tests of ``02_data_parallel_from_scratch``: the
learner's data-parallel step against one process on the full batch, with the typical mistakes
told apart (:func:`engine_check_dp_step`, read by :func:`dp_step_problem`)."""

from __future__ import annotations

from typing import Any

from ..cluster.engines.engine import px_name

#: The models :func:`engine_check_dp_step` can try the learner's step on.
MODELS = ("mlp", "frozen_tied")


def frozen_tied_mlp(seed: int) -> Any:
    """A digits MLP with a frozen first layer (``requires_grad=False``: its ``.grad`` stays
    ``None``) and two layers sharing one weight tensor (tied: ``model.parameters()`` lists it
    once, as torch's DDP does). Used by the graded test of ``02_data_parallel_from_scratch``."""
    import torch
    from torch import nn

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        first, mid, again = nn.Linear(64, 16), nn.Linear(16, 16), nn.Linear(16, 16)
        last = nn.Linear(16, 10)
    again.weight = mid.weight
    first.requires_grad_(False)
    return nn.Sequential(first, nn.Tanh(), mid, nn.Tanh(), again, nn.Tanh(), last)


def _build(model: str, seed: int) -> Any:
    from ..torch_dist.train import digits_mlp

    if model not in MODELS:
        raise ValueError(f"model={model!r}: one of {MODELS}")
    return digits_mlp(seed) if model == "mlp" else frozen_tied_mlp(seed)


def engine_check_dp_step(fn_name: str = "data_parallel_step", lr: float = 0.5,
                         batch: int = 32, data_seed: int = 0, model: str = "mlp"
                         ) -> dict[str, Any]:
    """*Collective.* Two calls of the learner's ``fn_name(model, opt, xb, yb)`` from identical
    weights on this rank's batches, compared with what one process would do on the
    concatenation of every rank's batches (computed here, without any collective). Used by
    the tests of ``02_data_parallel_from_scratch``; read the result with :func:`dp_step_problem`.

    Besides "right", the first update is compared with the updates typical mistakes give:
    ``p`` times too large (summed, not averaged), this rank's own gradient (no all_reduce of
    the gradients before ``step()``), divided by 2 instead of ``world_size`` (seen on 3 or more
    ranks) and no change at all; the second update with the one a missing ``opt.zero_grad()``
    gives (the previous gradient added again). ``model`` is ``"mlp"`` or ``"frozen_tied"``
    (:func:`frozen_tied_mlp`: a frozen layer and a tied weight).
    """
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from ..data import digits
    from ..torch_dist.train import flat_params, full_batches, step_batches

    fn = px_name(fn_name, to_call=True)
    rank, p = dist.get_rank(), dist.get_world_size()
    ds = digits()
    x, y = torch.from_numpy(ds.x), torch.from_numpy(ds.y)
    mine = [torch.from_numpy(i) for i in step_batches(len(ds), rank, p, batch, 2, data_seed)]
    full = [torch.from_numpy(i) for i in full_batches(len(ds), p, batch, 2, data_seed)]

    def grad_at(w: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, float]:
        m = _build(model, 0)
        torch.nn.utils.vector_to_parameters(w.float(), m.parameters())
        loss = F.cross_entropy(m(x[idx]), y[idx])
        loss.backward()
        return torch.cat([(torch.zeros_like(q) if q.grad is None else q.grad).reshape(-1).double()
                          for q in m.parameters()]), float(loss)

    net = _build(model, 0)
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    w0 = flat_params(net)
    losses, weights, error = [], [], None
    try:
        for idx in mine:
            losses.append(fn(net, opt, x[idx], y[idx]))
            weights.append(flat_params(net))
    except Exception as exc:
        from .common import learner_line

        said = " ".join(str(exc).split())[:300]   # torch's message may wrap onto more lines
        error = f"{type(exc).__name__}: {said} ({learner_line(exc)})"
    g1, loss1 = grad_at(w0, full[0])
    g1_local, _ = grad_at(w0, mine[0])
    w1_ref = w0 - lr * g1
    g2, loss2 = grad_at(w1_ref, full[1])

    def close(a: torch.Tensor, b: torch.Tensor) -> bool:
        return float((a - b).abs().max()) <= 1e-5 * max(1.0, float(b.abs().max()))

    step1 = step2 = "not run"
    if len(weights) >= 1:
        u = weights[0] - w0
        candidates = {"right": -lr * g1, "summed": -lr * p * g1, "local": -lr * g1_local,
                      "unchanged": torch.zeros_like(g1)}
        if p != 2:
            candidates["halved"] = -lr * (p / 2) * g1
        step1 = next((k for k, v in candidates.items() if close(u, v)), "other")
    if len(weights) >= 2 and step1 == "right":
        u2 = weights[1] - weights[0]
        step2 = ("right" if close(u2, -lr * g2) else
                 "accumulated" if close(u2, -lr * (g2 + g1)) else "other")
    return {"rank": rank, "world_size": p, "model": model, "error": error, "step1": step1,
            "step2": step2,
            "losses": losses, "reference_losses": [loss1, loss2],
            "loss_types": [type(v).__name__ for v in losses]}


def dp_step_problem(results: list[dict[str, Any]], fn_name: str = "data_parallel_step"
                    ) -> str | None:
    """The first problem in :func:`engine_check_dp_step`'s per-rank results, as a
    checked/expected/found/try message; ``None`` when both steps and the losses are right."""
    from .feedback_format import feedback

    p = len(results)
    frozen = results[0].get("model") == "frozen_tied" if results else False
    on = (" of a model with a frozen layer (requires_grad=False) and a tied weight"
          if frozen else "")
    checked = (f"two calls of {fn_name}{on} on {p} ranks from the same weights, against ONE "
               "process taking the same steps on all ranks' batches together")
    for r in results:
        if r["error"]:
            fix = "read the error and the line above, fix, re-run the %%px cell."
            if frozen and "NoneType" in r["error"]:
                fix = ("skip a parameter whose .grad is None (a frozen one gets no gradient; "
                       "torch's DDP leaves it out too): `if prm.grad is None: continue` before "
                       "its all_reduce.")
            return feedback(checked, "no error", f"rank {r['rank']} raised {r['error']}", fix)
    r = next((r for r in results if r["step1"] != "right"), None)
    if r is not None:
        found, fix = {
            "summed": (f"the first update is {p} (world size) times too large",
                       "all_reduce SUMS the gradients: divide each parameter's .grad by "
                       "world_size afterwards, before opt.step()."),
            "local": ("each rank stepped with its own gradient only (the original program's "
                      "mistake: all_reduce(loss) after step() exchanges nothing)",
                      "after loss.backward() and before opt.step(), all_reduce every "
                      "parameter's .grad, then divide it by world_size."),
            "halved": (f"the first update is {p}/2 times the right one: the gradients were "
                       "divided by 2, not by the world size",
                       f"divide by world_size (the engine's variable: {p} here), never by a "
                       "number you typed."),
            "unchanged": ("the weights did not change", "call opt.step() after averaging."),
            "other": ("an update that matches neither one process nor a known mistake",
                      "forward, loss.backward(), all_reduce each p.grad (SUM), divide by "
                      "world_size, opt.step(); in that order."),
            "not run": ("the function did not finish a step", "see the rank's output."),
        }[r["step1"]]
        return feedback(checked, "the first update equals the single process's update",
                        f"rank {r['rank']}: {found}", fix)
    r = next((r for r in results if r["step2"] != "right"), None)
    if r is not None:
        if r["step2"] == "accumulated":
            found = ("the second update also contains the first step's gradient: "
                     "gradients pile up")
            fix = ("call opt.zero_grad() at the start of every step (backward() ADDS into "
                   ".grad).")
        else:
            found, fix = ("the second update differs from the single process's",
                          "start every step with opt.zero_grad(); average before opt.step().")
        return feedback(checked, "the second update equals the single process's update",
                        f"rank {r['rank']}: {found}", fix)
    for r in results:
        if r["loss_types"] != ["float", "float"]:
            return feedback(checked, "a Python float loss from each call",
                            f"rank {r['rank']} returned {r['loss_types']}",
                            "return float(...) of the averaged loss, not a tensor.")
        ref = r["reference_losses"]
        got = r["losses"]
        if any(abs(a - b) > 1e-5 * max(1.0, abs(b)) for a, b in zip(got, ref, strict=True)):
            times = got[0] / ref[0] if ref[0] else float("nan")
            hint = (" (it is world_size times too large: divide the sum by world_size)"
                    if abs(times - p) < 1e-3 else "")
            return feedback(checked, f"the loss averaged over all ranks: {ref}",
                            f"rank {r['rank']} returned {got}{hint}",
                            "all_reduce a detached copy of the loss after backward(), then "
                            "divide by world_size and return float(...).")
    return None
