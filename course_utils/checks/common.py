"""What every engine-side probe of ``checks`` starts with: find the learner's ``%%px`` object.

Shared by the probes of units 7-9 (``performance``, ``faults``, ``capstone``).
"""

from __future__ import annotations

from typing import Any


def learner(name: str) -> Any:
    """The object the learner defined as ``name`` in this engine's ``%%px`` namespace.

    Raises :class:`NameError` saying which cell to run when it is not there."""
    import __main__

    ns = vars(__main__)
    if name not in ns:
        raise NameError(f"{name!r} is not defined on this engine: run the cells above first")
    return ns[name]
