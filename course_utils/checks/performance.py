"""Engine-side probes behind the graded tests of ``07_performance``, and the run of Exercise 2's
check on more ranks than the notebook's cluster has (:func:`overlap_dp_at`)."""

from __future__ import annotations

import time
from typing import Any

from ..cluster.engines.engine import px_name

# Backward reaches the default model's gradients with 10, 2560, 256, 65536, 256, 65536 and 256
# values; a cap of exactly 256 + 65536 float32s is met with equality by the second bucket, so a
# hook that launches only above the cap (> instead of >=) makes other buckets and is caught.
CHECK_CAP_MB = (256 + 65536) * 4 / 2**20


def frozen_tied_mlp(width: int = 256, depth: int = 4, seed: int = 0) -> Any:
    """The model of Exercise 2's check: :func:`course_utils.torch_dist.record.timeline_mlp`
    with two frozen parameters (``requires_grad=False``, as in fine-tuning: the first layer's
    weight and the third's bias) and the last hidden layer's weight tied to the second's (one
    tensor used twice, as tied embeddings are). Backward's last gradient is then the first
    layer's small bias, so the last bucket is always partial: ``sync()`` must launch it.
    Introduced in ``07_performance``."""
    from torch import nn

    from ..torch_dist.record import timeline_mlp

    model = timeline_mlp(width, depth, seed=seed)
    lin = [m for m in model if isinstance(m, nn.Linear)]
    lin[0].weight.requires_grad_(False)
    lin[2].bias.requires_grad_(False)
    lin[-2].weight = lin[1].weight
    return model


class _SpiedWork:
    """A real work handle, passed through, that notes when ``wait()`` was first called."""

    def __init__(self, work: Any, log: dict[str, Any]) -> None:
        self._work, self._log = work, log

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        if self._log["waited"] is None:
            self._log["waited"] = time.perf_counter()
        return self._work.wait(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name in ("get_future", "is_completed") and self._log["asked"] is None:
            self._log["asked"] = time.perf_counter()   # waiting another way counts too
        return getattr(self._work, name)


def engine_check_overlap_dp(cls_name: str = "OverlapDP", steps: int = 4,
                            bucket_cap_mb: float = CHECK_CAP_MB, width: int = 256, depth: int = 4,
                            batch: int = 32, timing_steps: int = 5) -> dict[str, Any]:
    """*Collective.* Train the learner's ``cls_name(model, bucket_cap_mb)`` (``.model``, hooks,
    ``.sync()`` after ``backward()``) on :func:`frozen_tied_mlp` next to torch DDP on the same
    data, with ``dist.all_reduce`` spied on; then (``timing_steps`` > 0) time it against unit
    2's blocking loop and DDP, each in turn on the same process group.

    Returned per rank: max |w_learner - w_ddp| after ``steps`` SGD steps, the first step's
    gradient ratio (learner's over DDP's: 1 when right, ``p`` when the sum was not divided),
    the gradient values per step that training needs reduced, and per step what the spy saw
    (:func:`_spied_steps`), plus the median step times and the last step's timeline
    (:func:`course_utils.viz.overlap_dp_timeline` draws it).
    """
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ..torch_dist.train import flat_params

    cls = px_name(cls_name)
    rank = dist.get_rank()
    gen = torch.Generator().manual_seed(100 + rank)
    data = [(torch.randn(batch, width, generator=gen),
             torch.randint(0, 10, (batch,), generator=gen))
            for _ in range(max(steps, timing_steps + 1))]

    ref_model = frozen_tied_mlp(width, depth, seed=0)
    ref = DDP(ref_model, bucket_cap_mb=bucket_cap_mb)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    trainable = [q for q in ref_model.parameters() if q.requires_grad]
    ref_grads = []
    for x, y in data[:steps]:
        ref_opt.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        ref_grads.append([q.grad.clone() for q in trainable])
        ref_opt.step()

    model = frozen_tied_mlp(width, depth, seed=rank)  # different start: the class must broadcast
    try:
        ours = cls(model, bucket_cap_mb=bucket_cap_mb)
    except NotImplementedError:
        raise
    except RuntimeError as exc:
        raise RuntimeError(
            f"{cls_name}(model) failed on a model with a frozen parameter (requires_grad=False) "
            f"and a tied weight: register hooks only on parameters that require grad, and "
            f"broadcast every parameter. ({str(exc).splitlines()[0][:160]})") from None
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    frozen_equal = _frozen_equal(model)
    per_step, first_grads, timeline = _spied_steps(ours, opt, data[:steps])
    mine = [q for q in model.parameters() if q.requires_grad]
    num = sum(float((g * r).sum()) for g, r in zip(first_grads, ref_grads[0], strict=True))
    den = sum(float((r * r).sum()) for r in ref_grads[0])
    diff = float((flat_params(model) - flat_params(ref.module)).abs().max())
    out = {"rank": rank, "world_size": dist.get_world_size(), "max_weight_diff": diff,
           "grad_ratio": num / den if den else float("nan"), "steps": per_step,
           "frozen_equal": frozen_equal, "n_params": len(mine),
           "grad_values": sum(q.numel() for q in mine), "timeline": timeline, "step_s": {}}
    if timing_steps > 0:
        out["step_s"] = _timings(ours, opt, ref, ref_opt, data[:timing_steps + 1], width, depth)
    return out


def _frozen_equal(model: Any) -> bool:
    """Whether every frozen parameter equals rank 0's after the learner's ``__init__``."""
    import torch
    import torch.distributed as dist

    ok = torch.ones(1)
    for q in model.parameters():
        if not q.requires_grad:
            theirs = q.detach().clone()
            dist.broadcast(theirs, src=0)
            ok *= float(torch.equal(theirs, q.detach()))
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    return bool(ok.item() == 1)


def _timings(ours: Any, opt: Any, ref: Any, ref_opt: Any, data: list[Any], width: int,
             depth: int) -> dict[str, float]:
    import torch
    import torch.nn.functional as F

    from ..torch_dist.record import timeline_mlp

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
    return {"overlap_dp": _median_step(ours_step, data),
            "blocking": _median_step(lambda x, y: _blocking_step(plain, plain_opt, x, y), data),
            "ddp": _median_step(ddp_step, data)}


def _spied_steps(ours: Any, opt: Any, data: list[tuple[Any, Any]]
                 ) -> tuple[list[dict[str, Any]], list[Any], dict[str, Any]]:
    """SGD steps of the learner's class with ``dist.all_reduce`` spied on. Per step: launches,
    how many async, gradient values launched, how long before backward's end the first launch
    came, ``wait()`` calls made during backward, launches never waited for by the end of
    ``sync()``, and work still in ``.pending`` after it. Also the first step's gradients after
    ``sync()`` and the last step's timeline (hook and launch/finish times, in seconds from the
    start of backward)."""
    import torch.distributed as dist
    import torch.nn.functional as F

    real = dist.all_reduce
    launches: list[dict[str, Any]] = []
    hooks: list[tuple[float, int, int]] = []
    params = [q for q in ours.model.parameters() if q.requires_grad]
    index = {id(q): i for i, q in enumerate(params)}
    handles = [q.register_post_accumulate_grad_hook(
        lambda q: hooks.append((time.perf_counter(), index[id(q)], q.numel()))) for q in params]

    def spy(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        log = {"t": time.perf_counter(), "numel": tensor.numel(), "waited": None, "asked": None,
               "done": None,
               "async": bool(kwargs.get("async_op", args[2] if len(args) > 2 else False))}
        launches.append(log)
        work = real(tensor, *args, **kwargs)
        if work is None:
            return None
        try:
            work.get_future().add_done_callback(
                lambda _f: log.__setitem__("done", time.perf_counter()))
        except Exception:  # no future on this backend: the figure uses the wait instead
            pass
        return _SpiedWork(work, log)

    per_step: list[dict[str, Any]] = []
    first: list[Any] = []
    timeline: dict[str, Any] = {}
    dist.all_reduce = spy
    try:
        for x, y in data:
            opt.zero_grad()
            launches.clear()
            hooks.clear()
            loss = F.cross_entropy(ours.model(x), y)
            back_start = time.perf_counter()
            loss.backward()
            back_end = time.perf_counter()
            buckets = _bucket_of(ours)
            ours.sync()
            sync_end = time.perf_counter()
            if not first:
                first = [q.grad.clone() for q in params]
            opt.step()
            per_step.append({
                "launches": len(launches), "async": sum(d["async"] for d in launches),
                "values": sum(d["numel"] for d in launches),
                "lead_s": (back_end - launches[0]["t"]) if launches else None,
                "waited_in_backward": sum(d["waited"] is not None and d["waited"] < back_end
                                          for d in launches),
                "never_waited": sum(d["waited"] is None and d["asked"] is None and d["async"]
                                    for d in launches),
                "pending_after": len(getattr(ours, "pending", []) or []),
                "sizes": [d["numel"] for d in launches],
                "want_sizes": buckets_by_rule([n for _, _, n in hooks], getattr(ours, "cap", 0),
                                               first[0].element_size() if first else 4)})
            timeline = {"backward": [0.0, back_end - back_start],
                        "sync_end": sync_end - back_start, "bucket_of": buckets,
                        "hooks": [(t - back_start, i, n) for t, i, n in hooks],
                        "launches": [{"t": d["t"] - back_start, "numel": d["numel"],
                                      "done": None if d["done"] is None else
                                      d["done"] - back_start} for d in launches]}
    finally:
        dist.all_reduce = real
        for h in handles:
            h.remove()
    return per_step, first, timeline


def buckets_by_rule(numels: list[int], cap: int, item_bytes: int) -> list[int]:
    """The buckets (values in each, in launch order) that the exercise's rule makes from
    gradients arriving with ``numels`` values each: a bucket is launched as soon as it holds at
    least ``cap`` bytes, and ``sync()`` launches the last, partial one."""
    out, held = [], 0
    for n in numels:
        held += n
        if held * item_bytes >= cap:
            out.append(held)
            held = 0
    return out + ([held] if held else [])


def _bucket_of(ours: Any) -> dict[int, int]:
    """Which bucket (launch order) each parameter went to, read from the skeleton's
    ``.pending`` and the open ``.bucket`` after backward (empty if the class has neither)."""
    order = [list(item[2]) for item in getattr(ours, "pending", []) or []
             if isinstance(item, tuple) and len(item) == 3]
    order.append(list(getattr(ours, "bucket", []) or []))
    params = [q for q in ours.model.parameters() if q.requires_grad]
    index = {id(q): i for i, q in enumerate(params)}
    return {index[id(q)]: b for b, qs in enumerate(order) for q in qs if id(q) in index}


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


# ---- the same check on p ranks of its own ---------------------------------------------------
def own_world_overlap_dp(name: str = "OverlapDP", steps: int = 2) -> dict[str, Any]:
    """*On a rank of* :func:`overlap_dp_at` *'s world.* :func:`engine_check_overlap_dp` without
    timings or the timeline (what the graded test asserts on more ranks)."""
    res = engine_check_overlap_dp(name, steps=steps, timing_steps=0)
    res.pop("timeline", None)
    return res


def overlap_dp_at(ranks: int = 3, source: str | None = None, cluster: Any = None,
                  name: str = "OverlapDP", steps: int = 2, timeout: float = 180.0
                  ) -> list[dict[str, Any]]:
    """Exercise 2's check (:func:`engine_check_overlap_dp`, timings left out) on ``ranks``
    processes of its own (:func:`.spawn.spawn`: a plain gloo group, debug off), each running
    the learner's cell (``source``; default: copied from the cluster's rank 0) with ``rank``
    and ``world_size`` set as the engines have them. Kernel side; every process is stopped
    before it returns. Introduced in ``07_performance`` (the answer depends on the number of
    ranks, so it is graded at more than two)."""
    from .spawn import spawn

    return spawn(f"{__name__}:own_world_overlap_dp", ranks, cells=[name], cluster=cluster,
                 sources=None if source is None else [source], timeout=timeout,
                 extra_env={"TORCH_DISTRIBUTED_DEBUG": "OFF"}, name=name, steps=steps)


# ---- kernel side: what the graded tests assert ----------------------------------------------
def overlap_dp_problem(r: dict[str, Any]) -> str:
    """The first thing wrong in one rank's :func:`engine_check_overlap_dp` result, or ``""``.
    The checks go from the most telling to the least, so that a learner meets the message that
    names their fix: waiting inside the hook, blocking launches, launching only in ``sync()``,
    one bucket, a bucket never launched, a tied weight reduced twice, work never waited for,
    work left pending, a frozen parameter not broadcast, a sum not divided by ``world_size``,
    and then any other difference from torch DDP's weights."""
    p, want = r["world_size"], r["grad_values"]
    on = f"rank {r['rank']} of {p}: "
    for s in r["steps"]:
        if s["waited_in_backward"]:
            return (on + "work.wait() ran during backward (inside the hook), so each bucket held "
                    "backward until it was reduced and nothing overlapped: keep the handle in "
                    "self.pending (the given _launch does) and wait only in sync()")
        if s["async"] != s["launches"]:
            return on + "launch every all_reduce with async_op=True"
        if s["lead_s"] is None or s["lead_s"] <= 0:
            return (on + "expected the first all_reduce to start before backward ended: "
                    "launch full buckets from the hook, not in sync()")
        if s["launches"] < 2:
            return (on + f"expected several buckets per step, found {s['launches']}: in the "
                    "hook, launch each time the bucket holds at least self.cap bytes")
        if s["values"] < want:
            return (on + f"{want - s['values']} of the {want} gradient values were never "
                    "all-reduced: in sync(), launch the last, partial bucket first")
        if s["values"] > want:
            return (on + f"{s['values']} gradient values were all-reduced per step, but the "
                    f"parameters that require grad hold {want}: register one hook per "
                    "parameter (model.parameters() lists a tied weight once)")
        if s["sizes"] != s["want_sizes"]:
            return (on + f"expected buckets of {s['want_sizes']} gradient values (in launch "
                    f"order), found {s['sizes']}: launch from the hook as soon as the bucket "
                    "holds at least self.cap bytes (>=), counting numel() * element_size()")
        if s["never_waited"]:
            return (on + f"{s['never_waited']} all_reduce(s) were never waited for: in sync(), "
                    "call work.wait() on every pending bucket before copying it back (the "
                    "optimizer step would read half-reduced gradients)")
        if s["pending_after"]:
            return on + "leave no pending work behind: empty self.pending at the end of sync()"
    if not r["frozen_equal"]:
        return (on + "a frozen parameter differs from rank 0's: broadcast every parameter, "
                "frozen ones too (DDP does); register hooks only where requires_grad is True")
    if abs(r["grad_ratio"] - 1) > 1e-3:
        return (on + f"your gradients are {r['grad_ratio']:.3g}x torch DDP's: divide the "
                f"summed gradients by world_size ({p} here), once")
    if r["max_weight_diff"] >= 1e-5:
        return (on + f"expected the weights of torch DDP, found a max difference of "
                f"{r['max_weight_diff']:.3g}: copy every slice of flat back into its "
                "parameter's .grad")
    return ""


def alpha_beta_problem(fit: Any, predict: Any, ranks: tuple[int, ...] = (2, 3, 4)) -> str:
    """Exercise 1 of ``07_performance`` on exact data (kernel side): for each number of ranks,
    times made from a known ``alpha`` and ``beta`` with the ring's formula; ``fit(sizes,
    seconds, p)`` must give them back and ``predict(alpha, beta, n, p)`` the formula's time.
    Returns the first problem, naming the fix, or ``""``."""
    import numpy as np

    alpha, beta = 50e-6, 1e-9
    sizes = np.array([4.0 * 4**k for k in range(12)])
    for p in ranks:
        seconds = 2 * (p - 1) * alpha + 2 * (p - 1) / p * sizes * beta
        got_a, got_b = (float(v) for v in fit(sizes, seconds, p))
        # atol=0: numpy's default (1e-8) would accept any beta near 1e-9 s/B
        if not np.isclose(got_a, alpha, rtol=1e-3, atol=0) or not np.isclose(
                got_b, beta, rtol=1e-3, atol=0):
            hint = ("np.polyfit(n, t, 1) returns (slope, intercept), in that order"
                    if np.isclose(got_a, beta / p, rtol=1e-2, atol=0) else
                    "alpha = a / (2(p-1)) and beta = b·p / (2(p-1)), with the p passed in")
            return (f"with p={p} ranks and times made from alpha={alpha:g} s, beta={beta:g} s/B,"
                    f" my_alpha_beta returned ({got_a:.3g}, {got_b:.3g}): {hint}")
        n = 3 * 2**18
        want = 2 * (p - 1) * alpha + 2 * (p - 1) / p * n * beta
        got = float(predict(alpha, beta, n, p))
        if not np.isclose(got, want, rtol=1e-6, atol=0):
            return (f"predict_seconds(alpha, beta, {n}, {p}) returned {got:.4g} s, the ring "
                    f"takes {want:.4g} s: 2(p-1)·alpha + 2(p-1)/p·nbytes·beta")
    return ""
