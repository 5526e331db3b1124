"""Processes on this machine, read from ``/proc``: is a pid alive, what runs it, which of them
carry a marker in their environment. One place for what the cluster layer, grading and the
test rigs all need (framework-free, standard library only)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

PROC = Path("/proc")


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (which may hold spaces)."""
    try:
        return (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs: it exists and is not a zombie waiting to be reaped."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    fields = _stat_fields(pid)
    if fields is None:
        return not PROC.is_dir()  # no /proc (not Linux): trust the signal
    return fields[0] != "Z"


def state(pid: int) -> str | None:
    """The one-letter state of ``pid`` (``R``, ``S``, ``Z``, ...), None if gone."""
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def parent(pid: int) -> int | None:
    """The parent pid of ``pid``, None if gone."""
    fields = _stat_fields(pid)
    return int(fields[1]) if fields else None


def start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (field 22 of ``/proc/PID/stat``): with the pid it
    names one process, even after the pid is reused. None if gone."""
    fields = _stat_fields(pid)
    return fields[19] if fields else None


def all_pids() -> list[int]:
    """Every pid visible in ``/proc`` (empty where there is none)."""
    try:
        return [int(e) for e in os.listdir(PROC) if e.isdigit()]
    except OSError:
        return []


def cmdline(pid: int) -> list[str]:
    """The arguments ``pid`` was started with ([] if gone or unreadable)."""
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def environ_has(pid: int, entry: str | bytes) -> bool:
    """True when ``pid``'s environment holds ``entry`` exactly (``"NAME=value"``)."""
    want = entry.encode() if isinstance(entry, str) else entry
    try:
        return want in (PROC / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:
        return False


def pids_with_environ(entry: str | bytes) -> Iterator[int]:
    """The live pids whose environment holds ``entry`` (a marker a launcher set)."""
    for pid in all_pids():
        if environ_has(pid, entry) and pid_alive(pid):
            yield pid


def pids_with_environ_prefix(prefix: str | bytes) -> Iterator[int]:
    """The live pids with an environment entry that starts with ``prefix`` (``"NAME=run-7-"``:
    every run of one launcher)."""
    want = prefix.encode() if isinstance(prefix, str) else prefix
    for pid in all_pids():
        try:
            env = (PROC / str(pid) / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(e.startswith(want) for e in env) and pid_alive(pid):
            yield pid


def pids_running(needle: str) -> Iterator[int]:
    """The live pids whose command line contains ``needle``, this process excepted."""
    me = os.getpid()
    for pid in all_pids():
        if pid != me and needle in " ".join(cmdline(pid)) and pid_alive(pid):
            yield pid
