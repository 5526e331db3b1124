"""Engine-side probes behind the graded tests of ``01_collectives``.

They run the learner's ``%%px``-defined ring on every rank while spying on what it sends (and,
for the hidden tests, with every built-in collective switched off), then report plain data the
test cells assert on. Teaching helpers live in :mod:`course_utils.torch_dist.collectives`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def engine_check_all_reduce(fn_name: str, n: int, seed: int = 0,
                            dtype: str = "float32") -> dict[str, Any]:
    """Compare the ``%%px``-defined function ``fn_name(t)`` with ``dist.all_reduce`` (SUM).

    Every rank draws its own random tensor of ``n`` items (seeded by ``seed`` and its rank),
    runs the learner's function on one copy and ``dist.all_reduce`` on another, recording the
    size of every message sent with ``dist.send``/``dist.isend`` meanwhile. Returns the max abs
    difference, the bytes the learner's function reported sending, the bytes of each message
    really sent, and a checksum of the result (equal on every rank when it is replicated).
    Used by the exercise tests in ``01_collectives``.
    """
    import torch
    import torch.distributed as dist

    import __main__

    fn = vars(__main__).get(fn_name)
    if fn is None:
        raise NameError(f"{fn_name!r} is not defined on this engine: run the %%px cell first")
    rank = dist.get_rank()
    gen = torch.Generator().manual_seed(1000 * seed + rank)
    x = torch.randn(n, generator=gen, dtype=torch.float64).to(getattr(torch, dtype))
    mine, ref = x.clone(), x.clone()
    messages: list[int] = []
    saved = {name: getattr(dist, name) for name in ("send", "isend")}

    def spying(name: str) -> Callable[..., Any]:
        def spy(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            messages.append(int(tensor.numel() * tensor.element_size()))
            return saved[name](tensor, *args, **kwargs)
        return spy

    for name in saved:
        setattr(dist, name, spying(name))
    try:
        sent = fn(mine)
    finally:
        for name, f in saved.items():
            setattr(dist, name, f)
    dist.all_reduce(ref)
    tol = 1e-5 * max(1.0, float(ref.abs().max())) if n else 0.0
    return {
        "max_abs_diff": float((mine - ref).abs().max()) if n else 0.0,
        "tol": tol,
        "bytes_sent": sent,
        "messages": messages,
        "checksum": float(mine.double().sum()) if n else 0.0,
        "itemsize": x.element_size(),
    }



_FORBIDDEN = ("all_reduce", "reduce_scatter", "reduce_scatter_tensor", "all_gather",
              "all_gather_into_tensor", "broadcast", "reduce", "all_to_all")



def engine_check_point_to_point_only(fn_name: str, n: int, seed: int = 0) -> dict[str, Any]:
    """Like :func:`engine_check_all_reduce`, but while the learner's function runs every
    built-in collective of ``torch.distributed`` raises, so only send/recv (blocking or
    not) can do the work. Used by the hidden tests of ``01_collectives``."""
    import torch.distributed as dist

    import __main__

    fn = vars(__main__).get(fn_name)
    if fn is None:
        raise NameError(f"{fn_name!r} is not defined on this engine: run the %%px cell first")

    saved = {name: getattr(dist, name) for name in _FORBIDDEN}

    def forbidden(*_a: Any, **_k: Any) -> None:
        raise RuntimeError("this exercise builds all-reduce from isend/irecv only")

    def guarded(t: Any) -> Any:
        for name in _FORBIDDEN:
            setattr(dist, name, forbidden)
        try:
            return fn(t)
        finally:
            for name, f in saved.items():
                setattr(dist, name, f)

    __main__.__dict__["_course_guarded"] = guarded
    try:
        return engine_check_all_reduce("_course_guarded", n, seed)
    finally:
        __main__.__dict__.pop("_course_guarded", None)
