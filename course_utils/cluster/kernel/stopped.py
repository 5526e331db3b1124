"""What a cell meets after ``cu.stop()``: the course's error, not a closed client's.

After ``cu.stop()`` the notebook's ``cluster`` object and the ``%%px`` magic still point at
the stopped cluster's ipyparallel client, whose sockets are closed; ipyparallel then answers
``RuntimeError: Client cannot be used after its sockets have been closed`` from deep inside
its client. A learner who re-runs a lesson cell after the summary's ``cu.stop()`` (or a
grader's test after a learner's) gets instead one line naming the cause and the fix.
Introduced in ``00_cluster_tour.ipynb`` (its last cell stops the cluster).
"""

from __future__ import annotations

import time
from typing import Any

from ...errors import ClusterNotRunning


def stopped_error(cluster_id: str, stopped_it: bool, since: float) -> ClusterNotRunning:
    """The error for a call on a cluster this kernel stopped (``stopped_it``) or disconnected
    from at ``since`` (``time.time()``)."""
    ago = f"{time.time() - since:.0f} s ago"
    what = (f"cluster {cluster_id!r} was stopped by cu.stop() {ago}: its engines are gone"
            if stopped_it else f"this kernel disconnected from cluster {cluster_id!r} (cu.stop()) "
                          f"{ago}")
    return ClusterNotRunning(
        f"{what}, so this call (or %%px cell) has nothing to run on",
        "run cu.start() (this unit's set-up cell) to get a cluster, then re-run this cell")


def guard_px(ip: Any, cluster_id: str, stopped_it: bool, since: float) -> None:
    """Make ``%px`` / ``%%px`` raise :func:`stopped_error` (its age counted when the cell
    runs) until a new cluster activates its own magics (``cu.start()`` registers
    ipyparallel's again, replacing these)."""

    def px(line: str, cell: str | None = None) -> None:
        raise stopped_error(cluster_id, stopped_it, since)

    px.__doc__ = "No cluster is running (cu.stop() ran): run cu.start() first."
    ip.register_magic_function(px, magic_kind="line_cell", magic_name="px")
