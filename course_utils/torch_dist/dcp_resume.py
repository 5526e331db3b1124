"""A distributed checkpoint of the model **and** its optimizer, saved by one world and resumed by
another of a different size (unit ``10_sharding_and_memory``, its DCP section).

Every rank trains on its contiguous slice of the same global batches, so a step's averaged
gradient is the global batch's whatever the number of ranks: 2 ranks that stop, save and are
resumed by 4 reach the weights 2 ranks reach without stopping (to float rounding). The
``engine_*`` functions run on every rank of a world (``cluster.run`` or ``checks.spawn``).
"""

from __future__ import annotations

from typing import Any

from .sharding import fsdp2_model, local

#: the global batch: rows per step, split evenly over 1, 2 or 4 ranks
GLOBAL_BATCH = 32


def global_batches(start: int, count: int, seed: int = 7) -> list[tuple[Any, Any]]:
    """Global batches ``start .. start + count - 1`` of a regression task, the same on every
    rank (batch ``i`` is drawn from its own seed, so any range can be made alone)."""
    import torch

    out = []
    for i in range(start, start + count):
        gen = torch.Generator().manual_seed(seed * 10_000 + i)
        out.append((torch.randn(GLOBAL_BATCH, 16, generator=gen),
                    torch.randn(GLOBAL_BATCH, 4, generator=gen)))
    return out


def train(model: Any, opt: Any, batches: list[tuple[Any, Any]]) -> None:
    """Adam steps of ``model`` (FSDP2) on this rank's slice of each global batch."""
    import torch.distributed as dist
    import torch.nn.functional as F

    p, rank = dist.get_world_size(), dist.get_rank()
    for x, y in batches:
        opt.zero_grad()
        F.mse_loss(model(x.chunk(p)[rank]), y.chunk(p)[rank]).backward()
        opt.step()


def full_weights(model: Any) -> list[float]:
    """Every parameter's full value (a DTensor's ``full_tensor()``), flattened, as floats."""
    import torch

    full = [q.full_tensor() if hasattr(q, "full_tensor") else q for q in model.parameters()]
    return torch.cat([t.detach().reshape(-1) for t in full]).tolist()


def fresh(seed: int) -> tuple[Any, Any]:
    """An FSDP2 model (initial weights from ``seed``) and its Adam."""
    import torch

    model = fsdp2_model(seed=seed)
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def engine_dcp_save(path: str, steps: int = 3, then: int = 3) -> dict[str, Any]:
    """*Collective.* Train ``steps`` steps, save model and optimizer with
    ``torch.distributed.checkpoint.save`` (every rank writes its own shards to ``path``; the
    state from ``get_state_dict(model, opt)``), then train ``then`` steps more without
    stopping. Returns the full weights when saved and after the last step."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model, opt = fresh(seed=0)
    train(model, opt, global_batches(0, steps))
    model_state, optim_state = get_state_dict(model, opt)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=path)
    saved = full_weights(model)
    train(model, opt, global_batches(steps, then))
    return {"weights_saved": saved, "weights_after": full_weights(model)}


def engine_dcp_resume(path: str, steps: int = 3, then: int = 3) -> dict[str, Any]:
    """*Collective.* A fresh model and Adam on this world (other initial weights), loaded from
    the checkpoint at ``path`` (``dcp.load`` into this world's shards, then ``set_state_dict``)
    and trained the ``then`` steps the saving world trained after its save. Beside it, the
    same with the model's state only and a fresh Adam: what a checkpoint without the
    optimizer gives. Returns the full weights of both, and the first weight's shapes."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_state_dict,
        set_model_state_dict,
        set_state_dict,
    )

    model, opt = fresh(seed=123)
    model_state, optim_state = get_state_dict(model, opt)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, opt, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    loaded = full_weights(model)
    train(model, opt, global_batches(steps, then))

    bare, bare_opt = fresh(seed=123)
    only_model = {"model": get_model_state_dict(bare)}
    dcp.load(only_model, checkpoint_id=path)
    set_model_state_dict(bare, only_model["model"])
    train(bare, bare_opt, global_batches(steps, then))
    first = next(iter(model.parameters()))
    return {"rank": dist.get_rank(), "world_size": dist.get_world_size(),
            "local_shape": list(local(first).shape), "full_shape": list(first.shape),
            "weights_loaded": loaded, "weights_after": full_weights(model),
            "weights_after_fresh_adam": full_weights(bare)}
