"""Readable ``%%px`` output in JupyterLab: labelled by rank, progress bars that update in place.

Introduced in ``00_cluster_tour`` (the ``[rank 0, engine 0]`` labels) and ``03_pytorch_ddp``
(rank 0's tqdm bar). What ipyparallel 9 does by itself, inside a kernel, with streaming on:

- each engine's stdout/stderr is shown as one ``text/plain`` display, ``[stdout:<engine id>]``
  plus the whole stream so far, replaced in place (a display id) each time output arrives;
- a ``text/plain`` display keeps the carriage returns tqdm uses to redraw its bar, and the
  browser turns each ``\\r`` into a new line: one bar becomes one line per redraw;
- with ``%pxconfig --progress-after -1`` (the course's setting) the magic stops listening as
  soon as the results are in, without waiting for the engines' last output messages (they
  come on another socket): a rank's output is then lost now and then (seen in unit 0: one
  rank's line missing).
- output an engine sent before the cell's stream began is replayed from the result's metadata
  as messages without a parent header, so every engine's replay gets the same display id
  (``"-stdout"``): the second engine's display replaces the first's (seen in unit 0, a fast
  cell on a busy machine: only rank 1's line left), and the engine's later output opens a
  second display instead of updating its own.

:func:`install` wraps the two module-level functions ipyparallel's output display calls
(``publish_display_data`` and ``_raw_text`` in ``ipyparallel.client.asyncresult``) and
``AsyncResult._display_stream`` (the non-streaming path): labels name the rank (from the
current cluster's rank map) as well as the engine, and each line shows what a terminal would
show after its ``\\r`` redraws. A replayed message gets the parent header its engine's own
messages carry (the request's id), so each engine keeps one display. It also makes
``AsyncResult.stream_output`` wait (at most :data:`OUTPUT_GRACE` seconds) for a finished
cell's last output before it stops listening.
Nothing else changes; without a rank map the labels keep the engine id. The course kernel
(``dist-training-course``) loads this module as an IPython extension; :func:`install` is
idempotent and safe to call from ``activate()`` as well.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

from . import registry

#: Seconds a finished ``%%px`` cell waits for the engines' last output messages (they pass
#: through the controller apart from the results). 15, not 5: with four learners on the
#: workshop rig a cell's output has gone missing. It waits only while output is missing.
OUTPUT_GRACE = 15.0
_LABEL_RE = re.compile(r"^\[(stdout|stderr|output):(\d+)\]")
_PATCHED_ATTR = "_course_pxoutput"


def collapse_cr(text: str) -> str:
    """``text`` as a terminal shows it: within each line, a ``\\r`` returns to column 0.

    Later text overwrites earlier text character by character (``"abc\\rX"`` -> ``"Xbc"``), so a
    tqdm bar redrawn 100 times is one line. ``"\\r\\n"`` is a plain line end.
    """
    if "\r" not in text:
        return text
    lines = []
    for line in text.replace("\r\n", "\n").split("\n"):
        shown = ""
        for part in line.split("\r"):
            shown = part + shown[len(part):]
        lines.append(shown)
    return "\n".join(lines)


def rank_of_engine(engine_id: int) -> int | None:
    """The rank of ``engine_id`` in this kernel's cluster, or None when it is not known."""
    cc = registry.current_or_none()
    if cc is None or cc.rank_map is None:
        return None
    try:
        return cc.rank_map.by_engine(engine_id).rank
    except KeyError:
        return None


def rank_label(kind: str, engine_id: int, rank: int | None) -> str:
    """``[rank 1, engine 3]`` for stdout, ``[rank 1, engine 3, stderr]`` otherwise."""
    if rank is None:
        return f"[{kind}:{engine_id}]"
    suffix = "" if kind == "stdout" else f", {kind}"
    return f"[rank {rank}, engine {engine_id}{suffix}]"


def relabel(text: str) -> str:
    """Replace ipyparallel's leading ``[stdout:3]`` label by the rank's, and collapse ``\\r``.

    The label stays in front: a ``\\r`` in the stream returns to the start of the stream's
    line, not over the label.
    """
    m = _LABEL_RE.match(text)
    if not m:
        return collapse_cr(text)
    eid = int(m.group(2))
    rest = text[m.end():]
    space = " " if rest.startswith(" ") else ""
    return (rank_label(m.group(1), eid, rank_of_engine(eid)) + space
            + collapse_cr(rest[len(space):]))


def install() -> bool:
    """Patch ipyparallel's ``%%px`` output display in this process (idempotent).

    Returns False (and changes nothing) when ipyparallel's internals are not the ones this was
    written against, so a future ipyparallel degrades to its own labels rather than failing.
    """
    try:
        from ipyparallel.client import asyncresult as ar
    except ImportError:
        return False
    if getattr(ar, _PATCHED_ATTR, False):
        return True
    needed = ("publish_display_data", "_raw_text")
    methods = ("_display_stream", "stream_output", "wait_for_output", "done",
               "_iopub_streaming_output_callback")
    if not all(callable(getattr(ar, n, None)) for n in needed) or not all(
            callable(getattr(ar.AsyncResult, n, None)) for n in methods):
        return False
    publish, raw_text = ar.publish_display_data, ar._raw_text
    display_stream = ar.AsyncResult._display_stream
    stream_output = ar.AsyncResult.stream_output
    streaming_callback = ar.AsyncResult._iopub_streaming_output_callback

    def publish_display_data(data: dict, *args: Any, **kwargs: Any) -> Any:
        text = data.get("text/plain") if isinstance(data, dict) else None
        if isinstance(text, str):
            data = {**data, "text/plain": relabel(text)}
        return publish(data, *args, **kwargs)

    def _raw_text(s: Any) -> Any:
        return raw_text(relabel(s) if isinstance(s, str) else s)

    def _display_stream(self: Any, text: str, prefix: str = "", file: Any = None) -> Any:
        m = _LABEL_RE.match(prefix or "")
        if m:
            eid = int(m.group(2))
            prefix = rank_label(m.group(1), eid, rank_of_engine(eid)) + prefix[m.end():]
        return display_stream(self, text, prefix, file)

    def _iopub_streaming_output_callback(self: Any, eid: int, msg_future: Any, msg: dict) -> Any:
        if not msg.get("parent_header") and getattr(msg_future, "msg_id", None):
            msg = {**msg, "parent_header": {"msg_id": msg_future.msg_id}}
        return streaming_callback(self, eid, msg_future, msg)

    @contextlib.contextmanager
    def _stream_output(self: Any) -> Iterator[None]:
        with stream_output(self):
            try:
                yield
            finally:
                if self.done():  # not after Ctrl-C: then the engines may never finish
                    self.wait_for_output(OUTPUT_GRACE)

    ar.publish_display_data = publish_display_data
    ar.AsyncResult.stream_output = _stream_output
    ar._raw_text = _raw_text
    ar.AsyncResult._display_stream = _display_stream
    ar.AsyncResult._iopub_streaming_output_callback = _iopub_streaming_output_callback
    setattr(ar, _PATCHED_ATTR, True)
    return True


def load_ipython_extension(ip: Any) -> None:
    """``%load_ext course_utils.cluster.kernel.pxoutput`` (the course kernel loads it at start)."""
    install()
