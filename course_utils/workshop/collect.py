"""``course workshop collect FILE --course DIR``: every learner's work, into the course folder.

Each learner works in ``~<learner>/course`` (the hub's hook made it from the student release:
:mod:`course_utils.workshop.hub`), laid out as the release is, ``unit<N>/<notebook>``. This
copies each learner's notebooks into nbgrader's ``DIR/submitted/<learner>/unit<N>/``, which
``course grade DIR`` grades (in a sandbox by default: the code is the learners'). The homes
are closed to everyone but their owner, so collecting runs as root. A learner with nothing to
hand in is listed, not an error.
"""

from __future__ import annotations

import pwd
import shutil
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


def _units(folder: Path, units: list[int] | None) -> list[Path]:
    found = sorted(p for p in folder.glob("unit*/*.ipynb") if ".ipynb_checkpoints" not in p.parts)
    if units is None:
        return found
    return [p for p in found if p.parent.name.removeprefix("unit") in {str(u) for u in units}]


def collect_work(ws: Workshop, course: Path, units: list[int] | None = None) -> Collected:
    """Copy every learner's notebooks of ``units`` (default: all) into ``course/submitted``."""
    course = Path(course).resolve()
    if not (course / "nbgrader_config.py").exists():
        raise WorkshopError(f"{course} is not a course folder (no nbgrader_config.py)",
                            "pass --course, the folder `course release` made for the workshop")
    out = Collected(course)
    for learner in ws.learners:
        try:
            home = Path(pwd.getpwnam(learner).pw_dir)
        except KeyError:
            out.missing.append(learner)
            continue
        work = home / WORK_FOLDER
        try:
            found = _units(work, units) if work.is_dir() else []
        except PermissionError:
            raise WorkshopError(f"cannot read {work}: learners' homes are closed to others",
                                "collect as root: sudo course workshop collect ...") from None
        if not found:
            out.missing.append(learner)
            continue
        copies = []
        for nb in found:
            dest = course / "submitted" / learner / nb.parent.name / nb.name
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(nb, dest)  # owned by the grader: the learner cannot change it now
            copies.append(dest)
        out.notebooks[learner] = copies
    return out
