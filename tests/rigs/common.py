"""What the test rigs (two hosts, Slurm, Chromium) share: their errors, and the one decision
about a missing piece (a package, root, a kernel feature).

Under ``CI=true`` (any case) every rig must run, so a missing piece fails the test. Elsewhere
it skips, naming the one command that enables it; ``COURSE_TEST_INSTALL=1`` (or CI) lets a
rig install its system packages itself (as root)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import NoReturn

INSTALL_FLAG = "COURSE_TEST_INSTALL=1"


class RigError(RuntimeError):
    """A rig step failed: ``cause``, a ``Fix:`` line when known and the daemons' log tails."""

    def __init__(self, cause: str, fix: str = "", logs: str = "") -> None:
        self.cause, self.fix, self.logs = cause, fix, logs
        text = f"{cause}\nFix: {fix}" if fix else cause
        super().__init__(f"{text}\n{logs}" if logs else text)


class RigUnavailable(RigError):
    """This machine cannot build the rig (not root, a package missing); the cause says why."""


def in_ci(environ: Mapping[str, str] | None = None) -> bool:
    """True under ``CI=true`` (``True``, ``TRUE`` too): every rig must run."""
    env = os.environ if environ is None else environ
    return env.get("CI", "").strip().lower() == "true"


def install_allowed(environ: Mapping[str, str] | None = None) -> bool:
    """True when a rig may install system packages: in CI or with ``COURSE_TEST_INSTALL=1``."""
    env = os.environ if environ is None else environ
    return in_ci(env) or env.get("COURSE_TEST_INSTALL") == "1"


def unavailable(reason: str, enable: str = "") -> NoReturn:
    """In a test: a rig's missing piece. Fails in CI; else skips, naming ``enable``, the one
    command that would make the piece available."""
    import pytest  # here: the rigs also run by hand (python -m tests.rigs.twohosts)

    if in_ci():
        pytest.fail(f"CI must run every rig: {reason}", pytrace=False)
    pytest.skip(f"{reason}. Enable: {enable}" if enable else reason)
