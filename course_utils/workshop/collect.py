"""``course workshop collect FILE --course DIR``: every learner's work, into the course folder.

Each learner works in ``~<learner>/course`` (the hub's hook made it from the student release:
:mod:`course_utils.workshop.hub`), laid out as the release is, ``unit<N>/<notebook>``. This
copies each learner's notebooks into nbgrader's ``DIR/submitted/<learner>/unit<N>/``, which
``course grade DIR`` grades (in a sandbox by default: the code is the learners'). The homes
are closed to everyone but their owner, so collecting runs as root. A learner with nothing to
hand in is listed, not an error.

Root reads only what the learner owns and never follows a link: a learner who makes a notebook
(or a unit folder) a symlink to another learner's work or to a system file hands in nothing for
it. The copies are closed: ``submitted/`` is 0700 and each copy 0600, so no learner can read
another's submission.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

from .hub import WORK_FOLDER
from .plan import Workshop, WorkshopError


@dataclass
class Collected:
    course: Path
    notebooks: dict[str, list[Path]] = field(default_factory=dict)  # learner -> copies
    missing: list[str] = field(default_factory=list)                # nothing to hand in

    def table(self) -> str:
        rows = [f"  {who}: {len(paths)} notebook(s)" for who, paths in self.notebooks.items()]
        rows += [f"  {who}: nothing to collect (no ~/{WORK_FOLDER} or no unit)"
                 for who in self.missing]
        return "\n".join(rows)


#: A notebook larger than this is not collected (it cannot be a lesson's; it would only fill
#: the grader's disk).
MAX_NOTEBOOK_BYTES = 50 * 2**20


def _owned_plain(path: Path, uid: int, kind: int) -> bool:
    """``path`` is a real file or folder (``kind``: ``stat.S_IFREG`` / ``S_IFDIR``), not a
    link, owned by ``uid``."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_IFMT(st.st_mode) == kind and st.st_uid == uid


def _units(folder: Path, units: list[int] | None, uid: int) -> list[Path]:
    found = sorted(p for p in folder.glob("unit*/*.ipynb")
                   if ".ipynb_checkpoints" not in p.parts
                   and _owned_plain(p.parent, uid, stat.S_IFDIR)
                   and _owned_plain(p, uid, stat.S_IFREG)
                   and p.lstat().st_size <= MAX_NOTEBOOK_BYTES)
    if units is None:
        return found
    return [p for p in found if p.parent.name.removeprefix("unit") in {str(u) for u in units}]


def _copy_closed(src: Path, dest: Path) -> None:
    """Copy ``src`` (opened without following a link) to ``dest``, readable by root only."""
    fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as fin:
        if dest.is_symlink():
            dest.unlink()
        out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(out, "wb") as fout:
            shutil.copyfileobj(fin, fout)
    os.chmod(dest, 0o600)


def collect_work(ws: Workshop, course: Path, units: list[int] | None = None) -> Collected:
    """Copy every learner's notebooks of ``units`` (default: all) into ``course/submitted``."""
    course = Path(course).resolve()
    if not (course / "nbgrader_config.py").exists():
        raise WorkshopError(f"{course} is not a course folder (no nbgrader_config.py)",
                            "pass --course, the folder `course release` made for the workshop")
    out = Collected(course)
    submitted = course / "submitted"
    submitted.mkdir(mode=0o700, exist_ok=True)
    submitted.chmod(0o700)
    for learner in ws.learners:
        try:
            entry = pwd.getpwnam(learner)
        except KeyError:
            out.missing.append(learner)
            continue
        work = Path(entry.pw_dir) / WORK_FOLDER
        try:
            found = (_units(work, units, entry.pw_uid)
                     if _owned_plain(work, entry.pw_uid, stat.S_IFDIR) else [])
        except PermissionError:
            raise WorkshopError(f"cannot read {work}: learners' homes are closed to others",
                                "collect as root: sudo course workshop collect ...") from None
        if not found:
            out.missing.append(learner)
            continue
        copies = []
        for nb in found:
            dest = submitted / learner / nb.parent.name / nb.name
            dest.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            _copy_closed(nb, dest)  # owned by the grader: the learner cannot change it now
            copies.append(dest)
        out.notebooks[learner] = copies
    return out
