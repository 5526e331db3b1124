"""One cluster shared by several notebook kernels (and ``course lab``).

ipyparallel engines run one task at a time: a second kernel's calls queue behind a busy first
one, and an engine that is busy is not dead. This module tells, from the controller's queues
and task records, whose work runs or waits ahead (:func:`behind_others`,
:func:`running_others`, :func:`busy`), and keeps a kernel's ``ipyparallel.Cluster`` in step
with engine sets another kernel started or stopped (:func:`sync_engine_sets`).
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Sequence
from typing import Any

import ipyparallel as ipp

from . import controller
from .cluster_files import recorded_engine_sets


def others_since(client: ipp.Client, msg_ids: Sequence[str]) -> float | None:
    """Seconds since the oldest of ``msg_ids`` that *another* client submitted was
    submitted; None when all of them are this client's."""
    if not msg_ids:
        return None
    records = controller.task_records(client, msg_ids, ["client_uuid", "submitted"])
    mine = client.session.session
    others = [r for r in records if r.get("client_uuid") not in (None, mine)]
    if not others:
        return None
    now = datetime.datetime.now(datetime.UTC)
    times = [r["submitted"] for r in others
             if isinstance(r.get("submitted"), datetime.datetime)]
    return (now - min(times)).total_seconds() if times else 0.0


def behind_others(client: ipp.Client, msg_ids: Sequence[str]) -> float | None:
    """How long another kernel's task ahead of ``msg_ids`` has been queued or running
    (None: what runs ahead of them is this client's own, or the controller did not say)."""
    try:
        status = controller.queue_status(client, timeout=5)
        ahead = []
        for q in status.values():
            queue = list(q.get("queue", [])) if isinstance(q, dict) else []
            for mid in msg_ids:
                if mid in queue:
                    ahead += queue[:queue.index(mid)]
        return others_since(client, ahead)
    except Exception:
        return None


def running_others(client: ipp.Client) -> float | None:
    """How long another kernel's task has been running on an engine of this cluster."""
    try:
        status = controller.queue_status(client, timeout=5)
        registered = set(client.ids)
        heads = [q["queue"][0] for eid, q in status.items()
                 if eid in registered and isinstance(q, dict) and q.get("queue")]
        return others_since(client, heads)
    except Exception:
        return None


def busy(client: ipp.Client, timeout: float = 5.0) -> dict[int, dict[str, Any]]:
    """Engines with tasks queued or running, by engine id: ``{"tasks": n, "since": s}``
    (seconds since the oldest was submitted, when the controller recorded it)."""
    status = controller.queue_status(client, timeout=timeout)
    registered = set(client.ids)  # the controller keeps queues of engines it dropped
    out: dict[int, dict[str, Any]] = {}
    for eid, q in status.items():
        if eid in registered and q.get("queue"):
            out[eid] = {"tasks": len(q["queue"]), "msg_ids": list(q["queue"])}
    if out:
        submitted = controller.submitted_times(
            client, [m for b in out.values() for m in b["msg_ids"]])
        now = datetime.datetime.now(datetime.UTC)
        for b in out.values():
            times = [submitted[m] for m in b["msg_ids"] if submitted.get(m)]
            b["since"] = (now - min(times)).total_seconds() if times else None
    return out


def busy_line(busy: dict[int, dict[str, Any]]) -> str:
    """One line for a kernel joining engines that run another notebook's cell."""
    since = [b["since"] for b in busy.values() if b.get("since") is not None]
    how_long = f"running for {max(since):.0f} s" if since else "busy"
    return (f"cu: connected; engines {sorted(busy)} are {how_long} with another notebook's "
            "cell: cells you run here queue behind it")


def adopt_recorded_engines(cl: ipp.Cluster) -> None:
    """Add to ``cl`` the engine sets its cluster file lists that ``cl`` does not know
    (engines another kernel started: its ``cu.restart()``, or stopping TF servers, which
    replaces the engines)."""
    path = getattr(cl, "cluster_file", None)
    if recorded_engine_sets(cl) is None:
        return
    try:
        # CRITICAL: engines that already exited are expected here, not worth a log line
        recorded = ipp.Cluster.from_file(path, shutdown_atexit=False,
                                         log_level=logging.CRITICAL)
    except Exception:
        return
    for key, es in recorded.engines.items():
        if key not in cl.engines:
            cl.engines[key] = es


def sync_engine_sets(cl: ipp.Cluster) -> None:
    """Make ``cl``'s engine sets those its cluster file lists: adopt the sets another kernel
    started, forget (without signalling) those it stopped, so that a later stop here signals
    the engines that run, never pids that are gone and may be reused."""
    recorded = recorded_engine_sets(cl)
    if recorded is None:
        return
    for key in [k for k in cl.engines if k not in recorded]:
        controller.end_polling(cl.engines.pop(key))
    adopt_recorded_engines(cl)
