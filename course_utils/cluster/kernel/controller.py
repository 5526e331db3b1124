"""The ipyparallel internals the kernel's calls rely on.

Why they are needed: ipyparallel's public ``queue_status``/``db_query`` wait forever for a
controller that does not answer, so a kernel joining a hung cluster would hang too; the
requests here send the same messages with a time limit (``Client._send`` on
``Client._query_stream``). An ``AsyncResult`` does not say publicly which of its engines are
done (``_children``, ``_targets``). An engine-set launcher's polling thread ends only through
its ``_stop_waiting`` event. ``tests/test_cluster.py`` exercises every function here against
real engines.

Two other modules go beyond ipyparallel's documented API, each for its own reason and said
there: :mod:`.pxoutput` (how a ``%%px`` cell's output is labelled) and
:mod:`..engines.forked_engine_app` (overrides ``IPEngine.start_nanny``, a public method, so the
nanny is forked too). :mod:`..launchers.fork_client` uses only the launcher's public surface.
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Sequence
from typing import Any

import ipyparallel as ipp


def hub_request(client: ipp.Client, msg_type: str, content: dict[str, Any],
                timeout: float) -> dict[str, Any]:
    """A request to the controller that gives up after ``timeout`` s."""
    future = client._send(client._query_stream, msg_type, content=content)
    reply = future.result(timeout=timeout)
    body = dict(reply["content"])
    if body.pop("status", "ok") != "ok":
        raise client._unwrap_exception(body)
    return body


def queue_status(client: ipp.Client, timeout: float = 5.0) -> dict[Any, Any]:
    """The controller's view: engine id -> ``{"queue": [msg ids], "completed", "tasks"}``."""
    from ipyparallel import util

    return util.int_keys(hub_request(client, "queue_request",
                                     {"targets": None, "verbose": True}, timeout))


def task_records(client: ipp.Client, msg_ids: Sequence[str], keys: Sequence[str],
                 timeout: float = 5.0) -> list[dict[str, Any]]:
    """Task records from the controller's database; dates as aware datetimes."""
    from ipyparallel import util

    body = hub_request(client, "db_request", {
        "query": {"msg_id": {"$in": list(msg_ids)}}, "keys": ["msg_id", *keys]}, timeout)
    out = []
    for rec in body.get("records", []):
        for key in ("submitted", "started", "completed"):
            when = rec.get(key)
            if isinstance(when, str):
                with contextlib.suppress(Exception):
                    when = util._parse_date(when)
            if isinstance(when, datetime.datetime):
                rec[key] = when if when.tzinfo else when.astimezone()
        out.append(rec)
    return out


def submitted_times(client: ipp.Client, msg_ids: Sequence[str],
                    timeout: float = 5.0) -> dict[str, datetime.datetime]:
    """When the controller received each task (its task database), as aware datetimes."""
    try:
        records = task_records(client, msg_ids, ["submitted"], timeout)
    except Exception:
        return {}
    return {r["msg_id"]: r["submitted"] for r in records
            if isinstance(r.get("submitted"), datetime.datetime)}


def pending(ar: Any) -> list[tuple[int, str]]:
    """``(engine id, msg id)`` of each part of the async result ``ar`` that is not done."""
    targets = list(getattr(ar, "_targets", []))
    try:
        done = [bool(ar._children[i].done()) for i in range(len(ar._children))]
    except Exception:
        done = [False] * len(targets)
    return [(eid, mid) for eid, mid, d in zip(targets, ar.msg_ids, done, strict=False) if not d]


def end_polling(engine_set: Any) -> None:
    """End the polling threads of an engine set whose engines are already gone (so that
    nothing signals their pids, which may be reused)."""
    for el in list(getattr(engine_set, "launchers", {}).values()):
        event = getattr(el, "_stop_waiting", None)
        if event is not None:
            event.set()
