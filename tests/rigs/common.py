"""What the test rigs (two hosts, Slurm, Chromium, the grading sandbox) share: their errors, the
one decision about a missing piece (a package, root, a kernel feature), and the one way they
install Debian packages (:func:`apt_install`).

Under ``CI=true`` (any case) every rig must run, so a missing piece fails the test. Elsewhere
it skips, naming the one command that enables it; ``COURSE_TEST_INSTALL=1`` (or CI) lets a
rig install its system packages itself (as root)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
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


_POLICY = Path("/usr/sbin/policy-rc.d")
_apt_updated = False


def install_command(packages: Sequence[str], recommends: bool = False) -> str:
    """The shell line (as root) that installs ``packages`` the way :func:`apt_install` does."""
    extra = "" if recommends else "--no-install-recommends "
    return ("apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y "
            + extra + " ".join(packages))


def apt_install(packages: Sequence[str], recommends: bool = False,
                timeout: float = 900.0) -> None:
    """``apt-get install`` ``packages`` (after one ``apt-get update`` per process), starting no
    service: a temporary ``/usr/sbin/policy-rc.d`` (exit 101) keeps package scripts from
    starting daemons (sshd on port 22, slurmctld), so installing opens no port here.

    Call it only where :func:`install_allowed` and as root. Raises :class:`RigError` with
    apt's output and the command to run by hand when a step fails.
    """
    global _apt_updated
    made = not _POLICY.exists()
    if made:
        _POLICY.write_text("#!/bin/sh\n# course test rig: start no services while installing\n"
                           "exit 101\n")
        _POLICY.chmod(0o755)
    steps = [] if _apt_updated else [["apt-get", "update", "-q"]]
    steps.append(["apt-get", "install", "-y", "-q", "-o", "DPkg::Lock::Timeout=300",
                  *([] if recommends else ["--no-install-recommends"]), *packages])
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        for argv in steps:
            done = subprocess.run(argv, env=env, capture_output=True, text=True,
                                  timeout=timeout, check=False)
            if done.returncode != 0:
                raise RigError(f"`{' '.join(argv)}` failed ({done.returncode}):\n"
                               f"{(done.stdout + done.stderr)[-2000:]}",
                               f"run by hand as root: {install_command(packages, recommends)}")
            _apt_updated = _apt_updated or argv[1] == "update"
    finally:
        if made:
            _POLICY.unlink(missing_ok=True)


def require_bwrap() -> None:
    """bubblewrap for ``course grade --sandbox``: installed where allowed, else a skip naming
    the command."""
    import shutil

    if shutil.which("bwrap") is None and install_allowed() and os.geteuid() == 0:
        apt_install(["bubblewrap"], timeout=600)
    if shutil.which("bwrap") is None:
        unavailable("bubblewrap (bwrap) is not installed",
                    install_command(["bubblewrap"]) + "  # as root")
