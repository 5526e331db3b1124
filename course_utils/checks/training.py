"""Engine-side probes behind the graded tests of ``03_pytorch_ddp``."""

from __future__ import annotations

from typing import Any


def engine_check_checkpoint(fn_name: str, path: str, model_name: str = "ddp_model",
                            opt_name: str = "optimizer", epoch: int = 7,
                            delay: float = 0.5) -> dict[str, Any]:
    """*Collective.* Run the ``%%px`` function ``fn_name(model, opt, epoch, path)`` while
    ``torch.save`` is spied on, and report what each rank saw. Used by the tests of
    ``03_pytorch_ddp``.

    Rank 0's saves are slowed by ``delay`` seconds, so a rank that returns before rank 0 has
    finished (a missing barrier) finds no file. Returned per rank: the paths ``torch.save``
    was called with, whether ``path`` existed when the function returned, the saved keys, the
    saved epoch, the model keys' prefixes and any leftover temporary files.
    """
    import os
    import time

    import torch
    import torch.distributed as dist

    import __main__

    ns = vars(__main__)
    for name in (fn_name, model_name, opt_name):
        if name not in ns:
            raise NameError(f"{name!r} is not defined on this engine: run the cells above first")
    rank = dist.get_rank()
    if rank == 0 and os.path.exists(path):
        os.remove(path)
    dist.barrier()

    calls: list[str] = []
    real_save = torch.save

    def spy(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(os.fspath(f) if isinstance(f, (str, os.PathLike)) else repr(f))
        if rank == 0:
            time.sleep(delay)
        return real_save(obj, f, *args, **kwargs)

    torch.save = spy
    try:
        ns[fn_name](ns[model_name], ns[opt_name], epoch, path)
    finally:
        torch.save = real_save
    exists = os.path.exists(path)
    state = torch.load(path, map_location="cpu", weights_only=False) if exists else {}
    folder, base = os.path.split(os.path.abspath(path))
    leftovers = sorted(f for f in os.listdir(folder) if f != base and base in f)
    dist.barrier()
    model_state = state.get("model", {}) if isinstance(state, dict) else {}
    return {
        "calls": calls,
        "exists_on_return": exists,
        "keys": sorted(state) if isinstance(state, dict) else [],
        "epoch": state.get("epoch") if isinstance(state, dict) else None,
        "module_prefixed": any(str(k).startswith("module.") for k in model_state),
        "n_model_keys": len(model_state),
        "leftovers": leftovers,
    }



def engine_check_sampler(fn_name: str = "make_sampler", n: int = 101,
                         epochs: tuple[int, ...] = (0, 1)) -> dict[str, Any]:
    """Call the ``%%px`` function ``fn_name(dataset, epoch)`` on a dataset of ``n`` items (odd by
    default, so padding shows) for each epoch; report this rank's order per epoch, the
    sampler's type and its ``drop_last``. Used by exercise 1 of ``03_pytorch_ddp``."""
    import __main__

    fn = vars(__main__).get(fn_name)
    if fn is None:
        raise NameError(f"{fn_name!r} is not defined on this engine: run the %%px cell first")
    dataset = list(range(n))
    samplers = {e: fn(dataset, e) for e in epochs}
    first = samplers[epochs[0]]
    return {
        "n": n,
        "orders": {e: [int(i) for i in s] for e, s in samplers.items()},
        "type": type(first).__name__,
        "drop_last": getattr(first, "drop_last", None),
        "epoch": {e: getattr(s, "epoch", None) for e, s in samplers.items()},
    }



def engine_check_ddp(fn_name: str = "wrap_ddp", x_name: str = "X",
                     y_name: str = "Y") -> dict[str, Any]:
    """*Collective.* Wrap differently initialised models with the ``%%px`` function
    ``fn_name(model)``, run one backward pass on different data per rank, and compare with the
    gradients averaged by hand. Used by exercise 2 of ``03_pytorch_ddp``.

    Returns ``error`` (the first line of what wrapping raised, else ``None``), whether the
    result is a DDP module, the weights' spread across ranks right after wrapping, the
    gradients' spread after backward, and the largest difference from the manual average.
    """
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    import __main__

    from ..torch_dist import train

    ns = vars(__main__)
    for name in (fn_name, x_name, y_name):
        if name not in ns:
            raise NameError(f"{name!r} is not defined on this engine: run the cells above first")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = ns.get("device", torch.device("cpu"))
    X, Y = ns[x_name], ns[y_name]
    error = None
    try:
        ddp = ns[fn_name](train.original_cnn(seed=100 + rank))
    except (ValueError, RuntimeError, AssertionError) as exc:
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
    errors: list[Any] = [None] * world
    dist.all_gather_object(errors, error)
    if any(errors):  # every rank stops here together: no rank waits in a collective alone
        return {"error": error or next(e for e in errors if e), "is_ddp": False,
                "param_spread": None, "grad_spread": None, "vs_manual": None}
    inner = ddp.module if isinstance(ddp, DDP) else ddp
    start_spread = train.replica_spread(inner)
    batch = torch.arange(8 * rank, 8 * rank + 8)
    ddp.zero_grad()
    F.cross_entropy(ddp(X[batch].to(device)), Y[batch].to(device)).backward()
    plain = train.original_cnn(seed=100).to(device)
    F.cross_entropy(plain(X[batch].to(device)), Y[batch].to(device)).backward()
    expected = train.flat_grads(plain)
    dist.all_reduce(expected)
    expected /= world
    return {"error": None, "is_ddp": isinstance(ddp, DDP), "param_spread": start_spread,
            "grad_spread": train.grad_spread(inner),
            "vs_manual": float((train.flat_grads(inner) - expected).abs().max())}
