"""``%%px`` cells fail fast: a rank that raised is reported in seconds, not after the others'
own timeouts. Introduced in ``00_cluster_tour`` (the learner's first mistake on one rank).

ipyparallel's ``%%px`` magic (``ParallelMagics.parallel_execute``) sends the cell and then
waits in ``AsyncResult.get()`` until *every* engine has answered. When a learner's mistake
raises on one rank before a collective (a typo under ``if rank == 1:``), the other ranks wait
in that collective for the process group's timeout (60 s in this course), and only then does
the cell show both errors, the learner's line buried under gloo's ``Timed out waiting``.

:func:`install` wraps ``AsyncResult.get`` for the magic's results only (``_fname == "%px"``,
no timeout, a current course cluster): it waits with ipyparallel's own
``wait(return_when=FIRST_EXCEPTION)`` (:func:`.stuck_calls.first_failures`), and when a rank
raised while others still run :data:`~.stuck_calls.FAIL_FAST_S` s later it raises the
magic's usual ``CompositeError`` with the failed ranks only, carrying the course's summary
(the learner's line, which ranks still wait and where). Those ranks are recorded, so the next
``%%px`` cell or ``cu`` call says at once that they are still busy (instead of queueing behind
them) and names ``cu.restart()``. Without output streaming (a plain kernel) the magic then
shows what the ranks printed so far, instead of waiting for them to show it. Every other
``get`` and display is ipyparallel's, unchanged.
"""

from __future__ import annotations

import sys
from typing import Any

from . import registry
from .stuck_calls import first_failures

_PATCHED_ATTR = "_course_pxwait"
#: What the course's summary calls a ``%%px`` cell.
WHAT = "the %%px cell"


def px_get(cc: Any, ar: Any) -> None:
    """Wait for the ``%%px`` result ``ar`` of cluster ``cc``; raise at once if ranks are still
    busy with an earlier cell that failed elsewhere, and a ``CompositeError`` carrying the
    course's error (``course_error``) when some ranks raised while others kept running."""
    import ipyparallel as ipp

    cc.check_stuck()
    failed = first_failures(ar, None)
    if not failed:
        return
    err = cc.failed_while_others_run(ar, failed, WHAT)
    composite = ipp.error.CompositeError(
        "one or more exceptions raised in: %px",
        [(e.ename, e.evalue, e.traceback, e.engine_info) for e in failed])
    composite.course_error = err  # type: ignore[attr-defined]
    raise composite


def install() -> bool:
    """Wrap ``AsyncResult.get`` in this process (idempotent); False when ipyparallel lacks it."""
    try:
        from ipyparallel.client import asyncresult as ar
    except ImportError:
        return False
    if getattr(ar, _PATCHED_ATTR, False):
        return True
    original = getattr(ar.AsyncResult, "get", None)
    if not callable(original):
        return False

    def get(self: Any, timeout: float | None = None, *args: Any, **kwargs: Any) -> Any:
        cc = registry.current_or_none()
        whole_cell = timeout is None or timeout < 0
        if (getattr(self, "_fname", None) == "%px" and whole_cell and not args and not kwargs
                and cc is not None and cc.rank_map is not None):
            px_get(cc, self)
        return original(self, timeout, *args, **kwargs)

    display_outputs = getattr(ar.AsyncResult, "display_outputs", None)

    def display_partial(self: Any, *args: Any, **kwargs: Any) -> Any:
        # Without streaming, the magic shows the outputs after get(): ipyparallel waits for
        # every engine there. Of a cell that failed fast, show what the ranks printed so far.
        if getattr(self, "_fname", None) != "%px" or self.done():
            return display_outputs(self, *args, **kwargs)
        for md in self.metadata:
            eid = md.get("engine_id")
            if eid is not None:
                self._display_stream(md.get("stdout") or "", f"[stdout:{eid}] ")
                self._display_stream(md.get("stderr") or "", f"[stderr:{eid}] ",
                                     file=sys.stderr)
        return None

    ar.AsyncResult.get = get
    if callable(display_outputs):
        ar.AsyncResult.display_outputs = display_partial
    setattr(ar, _PATCHED_ATTR, True)
    return True


def course_error_of(value: Any) -> Any:
    """The course's error a failed ``%%px`` cell carries (through ipyparallel's
    ``AlreadyDisplayedError`` wrapper too), or None."""
    value = getattr(value, "original_error", value)
    return getattr(value, "course_error", None)
