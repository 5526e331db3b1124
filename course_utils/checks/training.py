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
