"""Quiet TensorFlow: import it without start-up noise, and turn its errors into one line.

Used by every TF helper (units 4 and 5); learners never call these directly.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any


def quiet_tensorflow() -> Any:
    """Import TensorFlow with its C++ and Python logging reduced to errors that matter."""
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import logging
    import sys

    if "tensorflow" not in sys.modules:
        # TF 2.21 prints its start-up lines (oneDNN, CUDA stub) from C++ before its log level is
        # read, straight to file descriptor 2, where a notebook shows them: silence that fd
        # for the import only. Python errors still propagate.
        with contextlib.suppress(OSError), _stderr_fd_silenced():
            import tensorflow  # noqa: F401
    import tensorflow as tf

    logger = tf.get_logger()
    logger.setLevel(logging.ERROR)
    if not any(isinstance(f, _DropUnusedTensorNotes) for f in logger.filters):
        logger.addFilter(_DropUnusedTensorNotes())
    try:
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.ERROR)
    except ImportError:  # pragma: no cover - absl ships with TF
        pass
    return tf



class _DropUnusedTensorNotes:
    """Drops TF's "Object was never used" note, logged at ERROR when a graph built only to be
    inspected (e.g. for its device placement) is garbage-collected."""

    def filter(self, record: Any) -> bool:
        return "Object was never used" not in str(record.msg)



@contextlib.contextmanager
def _stderr_fd_silenced() -> Iterator[None]:
    import sys

    with contextlib.suppress(Exception):
        sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)



def short_error(exc: BaseException) -> str:
    """One readable line for a TF error: its type and the line that names the cause."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()] or [""]
    keys = ("UNAVAILABLE:", "failed to connect", "Socket closed", "Connection")
    cause = next((ln for ln in lines if any(k in ln for k in keys)), lines[0])
    return f"{type(exc).__name__}: {cause[:200]}"
