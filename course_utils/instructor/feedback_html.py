"""``course feedback``: nbgrader's HTML feedback, one file per student and unit.

Runs nbgrader's ``GenerateFeedback`` on what ``course grade`` autograded: each page shows the
student's notebook with every test's score and, for a failed test, its error. The pages carry
their CSS inline, so they open from disk without a network (MathJax, which nbgrader's template
loads from a CDN, only matters for formulas; the course's notebooks have none).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..assignments.release import load_config, run_app
from ..errors import CourseError


class FeedbackError(CourseError):
    """Feedback could not be generated."""


@dataclass
class Feedback:
    student: str
    assignment: str
    html: list[Path]
    ok: bool
    error: str = ""


def autograded(root: Path) -> list[tuple[str, str]]:
    """(student, assignment) pairs that have an autograded notebook in ``root``."""
    return sorted({(p.parent.parent.name, p.parent.name)
                   for p in (root / "autograded").glob("*/*/*.ipynb")})


def feedback(course: str | Path, units: list[int] | None = None,
             students: list[str] | None = None,
             progress: Callable[[str], None] | None = print) -> list[Feedback]:
    """Write ``course/feedback/<student>/<assignment>/<notebook>.html`` for every autograded
    submission (optionally only some units or students)."""
    from nbgrader.converters import GenerateFeedback
    from nbgrader.coursedir import CourseDirectory

    say = progress or (lambda _msg: None)
    root = Path(course).resolve()
    if not (root / "nbgrader_config.py").exists():
        raise FeedbackError(f"{root} is not a course folder (no nbgrader_config.py)",
                            "pass the folder `course release` made and `course grade` filled")
    work = autograded(root)
    if units is not None:
        work = [w for w in work if w[1] in {f"unit{u}" for u in units}]
    if students is not None:
        work = [w for w in work if w[0] in students]
    if not work:
        raise FeedbackError(f"nothing autograded in {root / 'autograded'}",
                            "run `course grade` first")
    out = []
    for student, aid in work:
        coursedir = CourseDirectory(config=load_config(root))
        coursedir.assignment_id, coursedir.student_id = aid, student
        app = GenerateFeedback(coursedir=coursedir, config=coursedir.config)
        app.force = True
        res = run_app(app)
        html = sorted((root / "feedback" / student / aid).glob("*.html"))
        fb = Feedback(student, aid, html, bool(res["success"] and html),
                      "" if res["success"] else res.get("error", "").strip().splitlines()[-1])
        out.append(fb)
        say(f"{student:<16} {aid:<8} " + (", ".join(str(p.relative_to(root)) for p in html)
                                          if fb.ok else f"FAILED: {fb.error}"))
    return out
