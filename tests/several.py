"""Several probes in one world of their own gloo processes (``checks.spawn``): each world costs
a process start and torch's import, so a test module that checks several probes on the same
number of ranks runs them one after the other in one world."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from course_utils.checks import spawn

#: the cell each rank runs: ``several(calls)`` calls each ``(probe, kwargs)`` in turn; a probe
#: is a name in ``course_utils.checks`` or ``"module:function"``
SEVERAL = """
def several(calls):
    import importlib
    out = []
    for where, kwargs in calls:
        module, _, name = where.rpartition(":")
        probe = getattr(importlib.import_module(module or "course_utils.checks"), name)
        out.append(probe(**kwargs))
    return out
"""


def spawn_several(nprocs: int, calls: Sequence[tuple[str, dict[str, Any]]],
                  sources: Sequence[str] = (), **kwargs: Any) -> list[list[Any]]:
    """Each call's results in rank order, in the order of ``calls``."""
    res = spawn("__main__:several", nprocs, sources=[*sources, SEVERAL], calls=list(calls),
                **kwargs)
    return [list(per_call) for per_call in zip(*res, strict=True)]
