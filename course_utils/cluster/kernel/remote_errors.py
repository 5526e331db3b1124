"""What failed on the engines, as one learner-facing error, and how IPython shows it.

:func:`engine_error` turns ipyparallel's ``CompositeError``/``RemoteError`` into a
:class:`~course_utils.errors.CourseError` (ranks grouped, the learner's lines, known torch
messages explained: see :mod:`.failures`); :func:`show_engine_errors_plainly` makes a failing
``%%px`` cell print that summary instead of every engine's traceback.
"""

from __future__ import annotations

import re
from typing import Any

import ipyparallel as ipp

from ...errors import CourseError, EngineError, ProcessGroupGone
from ..ranks import RankMap
from . import failures, pxwait, registry

_DIED = re.compile(r"Engine (\d+) died")


def engine_error(exc: Exception, rank_map: RankMap | None) -> CourseError:
    """One learner-facing error for what failed on the engines (``rank_map`` names ranks)."""
    errors = exc.elist if isinstance(exc, ipp.error.CompositeError) else [
        (exc.ename, exc.evalue, exc.traceback, exc.engine_info)
    ]
    found, died = [], []
    for ename, evalue, tb, info in errors:
        eid = (info or {}).get("engine_id")
        lost = _DIED.match(str(evalue)) if ename == "EngineError" else None
        if eid is None and lost:  # the controller lost its heartbeat: process or host gone
            eid = int(lost.group(1))
        rank = host = None
        if eid is not None and rank_map is not None and rank_map.has_engine(eid):
            rank = rank_map.by_engine(eid).rank
            host = rank_map[rank].host if len(rank_map.hosts) > 1 else None  # named if several
        text = "\n".join(tb) if isinstance(tb, list) else str(tb or "")
        found.append(failures.Failure(rank, eid, str(ename), str(evalue), text, host))
        if lost:
            died.append(found[-1].where)
    if not died:
        return failures.describe(found)
    lines = []  # one line per rank, with its host: which ranks are gone and what the rest saw
    for f in found:
        lost = f.ename == "EngineError" and _DIED.match(f.evalue)
        evalue = ("died or lost contact with the controller (its process or its host is gone)"
                  if lost else f.evalue.splitlines()[0][:300] if f.evalue else "")
        lines.append(f"[{f.where}] {f.ename}: {evalue}")
    return EngineError(
        "code failed on the engines:\n  " + "\n  ".join(lines),
        f"{', '.join(died)} is gone: check that host (network, `course doctor --hosts`), "
        "then run cu.restart() to replace the engines and rebuild the process group")


def ipython() -> Any:
    """The running IPython shell, or None (a plain script, or no IPython installed)."""
    try:
        from IPython import get_ipython

        return get_ipython()
    except ImportError:
        return None


def show_engine_errors_plainly(ip: Any) -> None:
    """``%%px`` cells (and raw ipyparallel calls) that fail show the course's summary: ranks
    grouped, the learner's lines, known torch messages explained, the fix. The error's name
    and value stay ipyparallel's (``CompositeError``), which graders and nbval read."""
    if getattr(ip, "_course_px_errors", False):
        return

    def handler(shell: Any, etype: Any, value: Any, tb: Any, tb_offset: Any = None) -> list[str]:
        cc = registry.current_or_none()
        if cc is None:
            stb = shell.InteractiveTB.structured_traceback(etype, value, tb, tb_offset=tb_offset)
        else:
            err = pxwait.course_error_of(value) or engine_error(
                getattr(value, "original_error", value), cc.rank_map)
            if isinstance(err, ProcessGroupGone):
                cc.flags["pg_broken"] = True
            stb = [f"\x1b[31m{type(err).__name__}\x1b[0m: {err.cause}", f"Fix: {err.fix}"]
        shell._showtraceback(etype, value, stb)  # IPython leaves the display to the handler
        return stb

    ip.set_custom_exc((ipp.error.CompositeError, ipp.error.RemoteError), handler)
    ip._course_px_errors = True
