"""This kernel's current cluster: the one ``cu.current()`` returns and ``%%px`` runs on.

Kept apart from the lifecycle so that modules the lifecycle itself uses (the ``%%px`` output
labels in :mod:`.pxoutput`, the error display in :mod:`.remote_errors`) can ask for it
without importing the lifecycle back. A kernel has at most one current cluster; clusters made
with :func:`course_utils.cluster.kernel.lifecycle.launch` are never current.
"""

from __future__ import annotations

from typing import Any

# A CourseCluster (not typed here: the class sits above this module).
_current: Any = None


def current_or_none() -> Any:
    """The current :class:`~course_utils.cluster.kernel.course_cluster.CourseCluster`, or None."""
    return _current


def make_current(cc: Any) -> None:
    """Make ``cc`` this kernel's current cluster (None: no cluster is current)."""
    global _current
    _current = cc


def forget(cc: Any = None) -> None:
    """No cluster is current any more (with ``cc``: only if ``cc`` is the current one).

    Nothing is stopped or disconnected: a later ``cu.start()`` connects as a fresh kernel does.
    """
    global _current
    if cc is None or _current is cc:
        _current = None
