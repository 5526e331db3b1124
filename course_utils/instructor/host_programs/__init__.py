"""Programs ``course doctor --hosts`` runs on each host, sent as ``ssh HOST PYTHON -`` on stdin.

Each is a standalone script (the standard library, and torch for ``all_reduce``): a host is
checked before the course is known to be importable there, so they must not import
``course_utils``. They are real modules so that linters read them;
:func:`source` gives the text that is sent.
"""

from __future__ import annotations

from pathlib import Path

NAMES = ("probe", "listen", "all_reduce")


def source(name: str) -> str:
    """The text of host program ``name`` (one of :data:`NAMES`), as sent on ssh's stdin."""
    if name not in NAMES:
        raise ValueError(f"no host program {name!r}; choose one of {', '.join(NAMES)}")
    return (Path(__file__).resolve().parent / f"{name}.py").read_text()
