"""What the engine-side probes of ``checks`` share: find the learner's ``%%px`` object, and
name the learner's own line in an error."""

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


def learner_line(exc: BaseException) -> str:
    """The learner's last line in ``exc``'s traceback (a ``%%px`` cell's frame), or ``""``.

    Library frames (torch, ipyparallel, this package) are skipped, so the line shown is one
    the learner wrote.
    """
    import traceback

    skip = ("site-packages", "dist-packages", "course_utils", "/lib/python", "<frozen")
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not any(s in (f.filename or "") for s in skip)]
    if not frames:
        return ""
    f = frames[-1]
    return f"line {f.lineno} of your cell: {(f.line or '').strip()}"
