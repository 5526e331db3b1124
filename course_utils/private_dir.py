"""This user's private runtime folder: where engines write their stack dumps and the fork
server keeps its sockets (used from ``cu.start()`` in ``00_cluster_tour.ipynb`` on).

On a shared host every name under ``/tmp`` can be taken first by another user: a file planted
at a predictable path blocks a start, and a symlink planted there redirects a write. So the
course writes only inside a folder it has checked is a real directory (not a link), owned by
this user and closed to everyone else (mode 0700), and opens files in it with ``O_NOFOLLOW``.
If the usual place is taken, it uses the next one instead of failing, so that no other user
can stop a learner's cluster from starting.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

#: The last place tried, under the home folder: it may be on shared storage (slower), but no
#: other user can take a name in it.
_HOME_FALLBACK = ".cache/dist-training-course/run"


def is_private(path: Path | str, uid: int | None = None) -> bool:
    """True when ``path`` is a directory (not a symlink) owned by ``uid`` that no one else can
    enter or list."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    uid = os.getuid() if uid is None else uid
    return stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not st.st_mode & 0o077


def _make(path: Path) -> Path | None:
    """``path`` made (or found) private, or ``None`` where another user holds the name."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    if is_private(path):
        return path
    try:  # ours but too open (an older course made it with the umask's mode): close it
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid():
            os.chmod(path, 0o700, follow_symlinks=False)
    except (OSError, NotImplementedError):
        return None
    return path if is_private(path) else None


def candidates() -> list[Path]:
    """The places :func:`private_dir` tries, best first: the session's runtime folder (systemd
    makes it per user, 0700), the temporary folder, then :data:`_HOME_FALLBACK`."""
    uid = os.getuid()
    out = []
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and is_private(runtime):
        out.append(Path(runtime) / "dist-training-course")
    out.append(Path(tempfile.gettempdir()) / f"course-{uid}")
    out.append(Path.home() / _HOME_FALLBACK)
    return out


def private_dir(sub: str = "") -> Path:
    """This user's private folder (made on first use), or its subfolder ``sub`` (also 0700).

    Raises ``PermissionError`` naming every place tried only if none can be made private.
    """
    tried = []
    for base in candidates():
        got = _make(base)
        if got is not None:
            if not sub:
                return got
            inner = _make(got / sub)
            if inner is not None:
                return inner
        tried.append(str(base / sub if sub else base))
    raise PermissionError(
        "no private folder could be made for the course's runtime files; tried "
        + ", ".join(tried) + ". Fix: set XDG_RUNTIME_DIR to a folder only you can open "
        "(mode 0700).")


def open_private(path: Path | str, mode: str = "w"):  # noqa: ANN201  # a text or binary file
    """Open ``path`` (inside :func:`private_dir`) for writing, never through a symlink, and
    readable by this user only."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags, 0o600)
    return os.fdopen(fd, mode)
