"""What JupyterHub calls for each learner (``jupyterhub_config.py`` from :mod:`.render`).

:func:`provision` is the spawner's ``pre_spawn_hook``: before a learner's JupyterLab starts,
their home holds ``~/course``, a copy of the student release (no solutions, no hidden tests),
owned by them; and their home is theirs alone (mode 0700), so one learner cannot read
another's work. A copy that exists is left as it is: a learner's work is never overwritten.
"""

from __future__ import annotations

import os
import pwd
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import CourseError

WORK_FOLDER = "course"


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    os.chown(root, uid, gid)
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            os.chown(os.path.join(folder, name), uid, gid, follow_symlinks=False)


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
    if not work.exists():
        shutil.copytree(release, work, symlinks=False)
        _chown_tree(work, entry.pw_uid, entry.pw_gid)
    return work


def provision(release: str | os.PathLike[str]) -> Callable[[Any], None]:
    """The ``pre_spawn_hook`` for a hub whose learners start in the release at ``release``."""
    path = Path(release)

    def hook(spawner: Any) -> None:
        provide_folder(spawner.user.name, path)

    return hook
