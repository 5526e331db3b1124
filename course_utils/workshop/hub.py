"""What JupyterHub calls for each learner (``jupyterhub_config.py`` from :mod:`.render`).

:func:`provision` is the spawner's ``pre_spawn_hook``: before a learner's JupyterLab starts,
their home holds ``~/course``, a copy of the student release (no solutions, no hidden tests),
owned by them; and their home is theirs alone (mode 0700), so one learner cannot read
another's work. A copy that exists is left as it is: a learner's work is never overwritten.

The hook runs as root, but the copy runs as the learner (a child process with their uid and
groups): a learner who makes ``~/course`` a symlink, even while the hook runs, leads the copy
only where they could write anyway. Root itself only makes and closes the home folder.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import CourseError

WORK_FOLDER = "course"


#: What the learner's own process runs: copy the release unless the folder (or a link) exists.
_COPY = ("import os, shutil, sys\n"
         "src, dst = sys.argv[1:3]\n"
         "if not os.path.lexists(dst):\n"
         "    shutil.copytree(src, dst, symlinks=False)\n")


def _copy_as(entry: pwd.struct_passwd, release: Path, work: Path) -> None:
    """Copy ``release`` to ``work`` in a process running as the learner ``entry``."""
    as_user = {} if os.getuid() == entry.pw_uid else {
        "user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
    try:
        done = subprocess.run([sys.executable, "-I", "-c", _COPY, str(release), str(work)],
                              cwd=entry.pw_dir, capture_output=True, text=True, timeout=300,
                              umask=0o077, env={"HOME": entry.pw_dir, "PATH": "/usr/bin:/bin"},
                              check=False, **as_user)
    except (OSError, subprocess.SubprocessError) as err:
        done = subprocess.CompletedProcess([], 1, "", str(err))
    if done.returncode != 0:
        raise CourseError(
            f"could not copy the release {release} into {work} as {entry.pw_name}: "
            f"{done.stderr.strip().splitlines()[-1:] or ['no reason given']}",
            f"let every learner read the release (chmod -R a+rX {release}, and a+x on the "
            "folders above it), then log in again")


def provide_folder(user: str, release: Path) -> Path:
    """Make ``~user/course`` from ``release`` if it is missing; close ``~user`` to others."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise CourseError(f"the hub user {user!r} is not a user of this host",
                          f"create it (useradd -m {user}); learners are OS users") from None
    home = Path(entry.pw_dir)
    if not release.is_dir():
        raise CourseError(f"the student release {release} is missing",
                          f"run `course release {release}` and then `course workshop` again")
    home.mkdir(mode=0o700, exist_ok=True)
    os.chown(home, entry.pw_uid, entry.pw_gid)
    home.chmod(0o700)
    work = home / WORK_FOLDER
    _copy_as(entry, release, work)
    return work


def port_blocks(blocks: dict[str, str]) -> Callable[[Any], str]:
    """The value of ``COURSE_PORTS`` in ``Spawner.environment``: each learner's block
    (``"LOW-HIGH"``), which JupyterHub asks for with the learner's spawner."""

    def block(spawner: Any) -> str:
        return blocks.get(spawner.user.name, "")

    return block


def provision(release: str | os.PathLike[str]) -> Callable[[Any], None]:
    """The ``pre_spawn_hook`` for a hub whose learners start in the release at ``release``."""
    path = Path(release)

    def hook(spawner: Any) -> None:
        provide_folder(spawner.user.name, path)

    return hook
