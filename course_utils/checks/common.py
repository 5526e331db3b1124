"""What the engine-side probes of ``checks`` share: name the learner's own line in an error
(they find the learner's ``%%px`` names with
:func:`course_utils.cluster.engines.engine.px_name`)."""

from __future__ import annotations


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
