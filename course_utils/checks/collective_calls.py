"""Which collectives a learner's ``%%px`` function really calls (unit 0's first collective):
the function runs with ``torch.distributed``'s collectives counted, so an answer computed in
plain Python, or with ``reduce`` where ``all_reduce`` belongs, is told apart from the real one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .common import learner

COUNTED = ("all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor",
           "gather", "scatter", "reduce_scatter", "reduce_scatter_tensor", "send", "recv",
           "isend", "irecv")


def engine_check_collectives(fn_name: str, *args: Any) -> dict[str, Any]:
    """*Collective* (as collective as the learner's function). Call ``fn_name(*args)`` with
    every collective of :data:`COUNTED` counted; the originals are back afterwards.

    Returns ``{"result": ..., "calls": {"all_reduce": 1, ...}}`` (only names called)."""
    import torch.distributed as dist

    fn = learner(fn_name)
    calls: dict[str, int] = {}
    saved = {name: getattr(dist, name) for name in COUNTED if hasattr(dist, name)}

    def counting(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*a: Any, **k: Any) -> Any:
            calls[name] = calls.get(name, 0) + 1
            return real(*a, **k)
        return counted

    for name, real in saved.items():
        setattr(dist, name, counting(name, real))
    try:
        result = fn(*args)
    finally:
        for name, real in saved.items():
            setattr(dist, name, real)
    return {"result": result, "calls": calls}
