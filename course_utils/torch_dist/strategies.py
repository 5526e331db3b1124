"""Every strategy of units 3, 10 and 11 on one model, counted (``11_tensor_and_pipeline``).

:func:`engine_strategies` runs on 4 ranks of a world of their own
(:func:`course_utils.checks.spawn`, with the learner's ``TPMLP``, ``one_f_one_b_step`` and
``torch_2d`` cells) one Adam step of the same 4-block model on the same global batch, six ways:
DDP, ZeRO-1 (torch's ``ZeroRedundancyOptimizer`` under DDP), FSDP (``fully_shard``), TP (the
learner's ``TPMLP`` on every block, over 4 ranks), PP (the learner's 1F1B, one block a stage)
and 2-D (the learner's ``torch_2d``, dp=2 × tp=2). Each rank reports what it holds (weights,
gradients, Adam's state) and what it sent, counted by the spies of
:class:`~course_utils.torch_dist.sharding.CollectiveCounter` and
:class:`~course_utils.torch_dist.parallelism.P2PCounter`.

What they cannot see: the all_reduces DTensor runs inside 2-D's tensor-parallel layers go
through torch's functional collectives, not ``torch.distributed``'s functions; those are
counted by ``CommDebugMode`` (calls) and their bytes are :func:`.parallelism.tp_sent_bytes`.
"""

from __future__ import annotations

from typing import Any

from . import parallelism as par
from . import sharding

#: the table's rows, in the order the course met them
ORDER = ("DP (DDP)", "ZeRO-1", "FSDP", "TP", "PP (1F1B)", "2-D (FSDP × TP)")
#: blocks in the model (one pipeline stage each on 4 ranks), rows in the global batch
BLOCKS, ROWS, MICRO = 4, 32, 4


def model(seed: int = 0) -> Any:
    """``BLOCKS`` MLP blocks (:func:`.parallelism.mlp_block`) one after the other."""
    from torch import nn

    return nn.Sequential(*[par.mlp_block(seed=seed + k) for k in range(BLOCKS)])


def batch(seed: int = 5) -> tuple[Any, Any]:
    """The global batch: ``ROWS`` inputs and targets of width ``D_MODEL``."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return (torch.randn(ROWS, par.D_MODEL, generator=g),
            torch.randn(ROWS, par.D_MODEL, generator=g))


def engine_strategies() -> list[dict[str, Any]]:
    """*Collective, on 4 ranks.* One row per strategy of :data:`ORDER` for this rank."""
    import torch.distributed as dist

    rows = []
    for name, run in zip(ORDER, (_ddp, _zero1, _fsdp, _tp, _pp, _two_d), strict=True):
        dist.barrier()
        with sharding.CollectiveCounter() as coll, par.P2PCounter() as p2p:
            got = run()
        m, opt = got["model"], got["opt"]
        rows.append({"strategy": name, "rank": dist.get_rank(),
                     "weights": sharding.tensor_bytes(m.parameters()),
                     "grads": sharding.tensor_bytes(q.grad for q in m.parameters()),
                     "adam": sharding.optimizer_state_bytes(opt),
                     "sent": coll.sent + p2p.sent + got.get("unseen_sent", 0.0),
                     "calls": {**coll.calls, **p2p.calls, **got.get("unseen_calls", {})}})
    return rows


def _adam_step(m: Any, x: Any, y: Any, opt: Any = None) -> dict[str, Any]:
    import torch

    opt = opt or torch.optim.Adam(m.parameters(), lr=1e-3)
    ((m(x) - y) ** 2).mean().backward()
    opt.step()
    return {"model": m, "opt": opt}


def _my_rows(x: Any, parts: int, index: int) -> Any:
    return x.chunk(parts)[index]


def _ddp() -> dict[str, Any]:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    x, y = batch()
    r, p = dist.get_rank(), dist.get_world_size()
    ddp = DDP(model())
    sharding.watch_buckets(ddp)   # DDP's all_reduce through a hook the counter sees
    got = _adam_step(ddp, _my_rows(x, p, r), _my_rows(y, p, r))
    return {**got, "model": ddp.module}


def _zero1() -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    x, y = batch()
    r, p = dist.get_rank(), dist.get_world_size()
    ddp = DDP(model())
    sharding.watch_buckets(ddp)
    opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
    got = _adam_step(ddp, _my_rows(x, p, r), _my_rows(y, p, r), opt)
    return {**got, "model": ddp.module}


def _fsdp() -> dict[str, Any]:
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    x, y = batch()
    r, p = dist.get_rank(), dist.get_world_size()
    m = model()
    for block in m:
        fully_shard(block)
    fully_shard(m)
    return _adam_step(m, _my_rows(x, p, r), _my_rows(y, p, r))


def _tp() -> dict[str, Any]:
    import torch.distributed as dist
    from torch import nn

    from ..cluster.engines.engine import px_name

    x, y = batch()
    cls = px_name("TPMLP")
    m = nn.Sequential(*[cls(b, dist.get_rank(), dist.get_world_size()) for b in model()])
    return _adam_step(m, x, y)


def _pp() -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch import nn

    from ..cluster.engines.engine import px_name
    from .pipeline_stage import TimedStage

    x, y = batch()
    stage = TimedStage(model()[dist.get_rank()])
    px_name("one_f_one_b_step", to_call=True)(stage, list(x.chunk(MICRO)), list(y.chunk(MICRO)),
                                              nn.MSELoss())
    opt = torch.optim.Adam(stage.parameters(), lr=1e-3)
    opt.step()
    return {"model": stage, "opt": opt}


def _two_d() -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.debug import CommDebugMode

    from ..cluster.engines.engine import px_name

    x, y = batch()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    to_2d = px_name("torch_2d", to_call=True)
    m = model()
    for k in range(BLOCKS):
        m[k] = to_2d(m[k], mesh)
    fully_shard(m, mesh=mesh["dp"])
    dp = mesh.get_local_rank("dp")
    with CommDebugMode() as seen:
        got = _adam_step(m, _my_rows(x, 2, dp), _my_rows(y, 2, dp))
    # DTensor's own collectives (functional ones); FSDP's c10d calls are the spies' already
    reduces = sum(n for op, n in seen.get_comm_counts().items()
                  if "functional" in str(op) and str(op).endswith("all_reduce"))
    each = par.tp_sent_bytes(ROWS // 2, par.D_MODEL, 2) / 2   # one all_reduce over tp=2
    return {**got, "unseen_calls": {"all_reduce (DTensor)": reduces} if reduces else {},
            "unseen_sent": reduces * each}


def table(rows: list[dict[str, Any]], n_params: int) -> str:
    """The comparison: per strategy, the most bytes a rank holds (weights + gradients + Adam),
    its share of the 16 B/parameter one process holds, the most bytes a rank sent in the step,
    and the calls rank 0 made."""
    from ..viz.style import human_bytes

    whole = 16 * n_params
    lines = [f"{'strategy':<17}{'held per rank':>15}{'of one process':>16}{'sent per rank':>15}"
             "  calls (rank 0)"]
    for name in ORDER:
        mine = [r for r in rows if r["strategy"] == name]
        held = max(r["weights"] + r["grads"] + r["adam"] for r in mine)
        sent = max(r["sent"] for r in mine)
        calls = next(r["calls"] for r in mine if r["rank"] == 0)
        said = ", ".join(f"{k} ×{v}" for k, v in sorted(calls.items()))
        lines.append(f"{name:<17}{human_bytes(held):>15}{held / whole:>16.0%}"
                     f"{human_bytes(sent):>15}  {said}")
    return "\n".join(lines)
