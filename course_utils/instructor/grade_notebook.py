"""One notebook graded: nbgrader's ``Autograde`` on a fresh cluster, then each question's score,
reason and tampering notes read back (``course grade``, serial or in jobs: :mod:`.autograde`,
:mod:`.grade_jobs`)."""

from __future__ import annotations

import contextlib
import re
import time
import warnings
from pathlib import Path

import nbformat
from nbformat import NotebookNode

from ..assignments.integrity import replaced_in
from ..assignments.release import load_config, run_app
from ..errors import CourseError
from ..notebook_cells import grade_id, nbgrader_meta
from .grade_report import NotebookGrade, Question, cell_reason, one_line_reason, tampering
from .grading_cluster import GradingCluster


class GradingError(CourseError):
    """The class could not be graded (no course folder, no submissions...)."""


def released_notebooks(root: Path) -> dict[str, tuple[str, Path]]:
    """Notebook file name -> (assignment, released path), from the course's ``release/``."""
    out = {}
    for path in sorted((root / "release").glob("*/*.ipynb")):
        out[path.name] = (path.parent.name, path)
    return out


def grading_config(root: Path, cell_timeout: int | None = None,
                   notebook_timeout: int | None = None, busy_timeout: float | None = None,
                   sandbox: bool = False):  # noqa: ANN201 - traitlets Config
    """The course folder's nbgrader config with the run's limits. ``busy_timeout``: seconds a
    writer to ``gradebook.db`` waits for another (parallel jobs) instead of failing on a lock.
    ``sandbox``: each notebook's kernel starts in :mod:`.sandbox`'s sandbox."""
    cfg = load_config(root)
    if cell_timeout:
        cfg.CourseExecute.timeout = cell_timeout
    if notebook_timeout:
        cfg.CourseExecute.notebook_timeout = notebook_timeout
    if busy_timeout:
        cfg.CourseDirectory.db_url = f"sqlite:///{root / 'gradebook.db'}?timeout={busy_timeout:g}"
    if sandbox:
        from .sandbox import configure

        configure(cfg, root)
    return cfg


def grade_item(gc: GradingCluster, cfg: object, root: Path, known: dict[str, tuple[str, Path]],
               student: str, aid: str, path: Path) -> tuple[NotebookGrade, float | None]:
    """Grade one notebook on a fresh cluster of ``gc``; the grade and the cluster's start time
    (None when nothing of it could run, so no cluster was started)."""
    from nbgrader.converters import Autograde

    t0 = time.perf_counter()
    reset = None
    try:
        if _readable(path):  # nothing of an unreadable notebook runs: no cluster
            reset = gc.restart()
    except CourseError as exc:
        raise GradingError(f"could not start a cluster to grade with: {exc.cause}",
                           exc.fix) from exc
    with warnings.catch_warnings():
        # nbgrader's gradebook code trips SQLAlchemy's autoflush warnings; they mean nothing here
        warnings.filterwarnings("ignore", message=".*not in session.*")
        g = _grade_one(Autograde, cfg, root, student, aid, path, known[path.name][1])
    g.seconds = time.perf_counter() - t0
    return g, reset


def progress_line(i: int, n: int, g: NotebookGrade) -> str:
    """``[ 3/9] student  unit0  2/6  25.1 s  ex2-test: ...``: one graded notebook."""
    failed = next((q for q in g.questions if not q.passed and not q.by_hand), None)
    why = g.error or (f"{failed.question}: {failed.reason}" if failed else "")
    return (f"[{i:>2}/{n}] {g.student:<16} {g.assignment:<8} {g.score:>4g}/{g.max_score:<4g} "
            f"{g.seconds:>6.1f} s  {why[:100]}")


def _readable(path: Path) -> bool:
    """Whether nbgrader will run the notebook at all (it is notebook JSON nbformat can read)."""
    try:
        nbformat.read(str(path), as_version=4)
    except Exception:
        return False
    return True


def _grade_one(autograde_cls: type, cfg: object, root: Path, student: str, aid: str,
               path: Path, released_path: Path) -> NotebookGrade:
    from nbgrader.api import Gradebook, MissingEntry
    from nbgrader.coursedir import CourseDirectory

    nb_id = path.stem
    released = nbformat.read(str(released_path), as_version=4)
    graded = [c for c in released.cells if nbgrader_meta(c).get("grade")]  # tests + answers
    tests = [c for c in graded if not nbgrader_meta(c).get("solution")]
    g = NotebookGrade(student, aid, path.name, 0.0,
                      sum(float(nbgrader_meta(c).get("points", 0)) for c in graded), 0.0, "graded")
    submitted: NotebookNode | None = None
    try:
        submitted = nbformat.read(str(path), as_version=4)
        nbformat.validate(submitted)
    except Exception as exc:  # malformed JSON, not a notebook
        reason = one_line_reason(type(exc).__name__, str(exc), 160)
        g.status, g.error = "error", f"not a valid notebook: {reason}"
    changed = tampering(submitted, released) if submitted is not None else {}
    test_ids = [grade_id(c) for c in tests]
    for gid, what in changed.items():
        if gid not in test_ids:
            g.notes.append(f"lesson cell {gid} {what}; the released version ran")

    coursedir = CourseDirectory(config=cfg)
    coursedir.assignment_id, coursedir.student_id = aid, student
    res = _autograde(autograde_cls, coursedir, cfg) if submitted is not None else {
        "success": False}
    if not res.get("success") and g.status != "error":
        g.status = "error"
        g.error = "nbgrader could not grade it: " + _last_line(res.get("error", ""))

    autograded = root / "autograded" / student / aid / path.name
    g.notes += _sandbox_notes(cfg, autograded.parent)
    by_cell: dict[str, NotebookNode] = {}
    if g.status != "error" and autograded.exists():
        done = nbformat.read(str(autograded), as_version=4)
        by_cell = {grade_id(c): c for c in done.cells}
        if any(o.get("ename") == "CellTimeoutError" for c in done.cells
               for o in c.get("outputs", [])):
            g.status = "timeout"
    scores: dict[str, float] = {}
    by_hand: set[str] = set()
    with contextlib.suppress(MissingEntry), Gradebook(coursedir.db_url, coursedir.course_id) as gb:
        sub = gb.find_submission_notebook(nb_id, aid, student)
        for grade in sub.grades:
            if g.status == "error":  # nothing ran: what nbgrader does for a missing notebook
                grade.auto_score, grade.needs_manual_grade = 0.0, False
            scores[grade.name] = float(grade.score or 0.0)
            if grade.needs_manual_grade:
                by_hand.add(grade.name)
        gb.db.commit()
    for cell in graded:
        if nbgrader_meta(cell).get("solution"):  # a written answer: nbgrader leaves it to a person
            gid = grade_id(cell)
            pending = gid in by_hand
            g.questions.append(Question(
                gid, scores.get(gid, 0.0), float(nbgrader_meta(cell).get("points", 0)),
                "", "graded by hand: open formgrader (nbgrader) in the course folder"
                if pending else "graded by hand"))
            continue
        gid = grade_id(cell)
        pts = float(nbgrader_meta(cell).get("points", 0))
        score = scores.get(gid, 0.0) if g.status != "error" else 0.0
        reason = ""
        if score < pts:
            reason = g.error or (cell_reason(by_cell[gid]) if gid in by_cell else "not run")
        note = {"edited": "test cell was edited; the instructor's version ran",
                "deleted": "test cell was deleted; the instructor's version was put back and ran"
                }.get(changed.get(gid, ""), "")
        replaced = replaced_in(by_cell[gid].get("outputs", [])) if gid in by_cell else []
        if replaced:
            note = "; ".join(filter(None, [note, "helpers replaced before this test: "
                                           f"{', '.join(replaced)}; the test was not run"]))
        g.questions.append(Question(gid, score, pts, reason, note))
    g.score = sum(q.score for q in g.questions)
    return g


#: nbgrader's (jupyter_client's) words for a kernel that never started: its port taken by
#: another process between jupyter_client choosing it and the kernel binding it
KERNEL_NEVER_STARTED = re.compile(r"Kernel died before replying|Kernel didn't respond|"
                                  r"DeadKernelError|Address already in use")


def _autograde(autograde_cls: type, coursedir: object, cfg: object) -> dict:
    """nbgrader's autograde of one submission (:func:`run_app`); once more when its kernel
    never started, which says nothing about the notebook."""
    res: dict = {}
    for _ in range(2):
        app = autograde_cls(coursedir=coursedir, config=cfg)
        app.force, app.create_student = True, True
        res = run_app(app)
        if res.get("success") or not KERNEL_NEVER_STARTED.search(
                f"{res.get('log', '')}\n{res.get('error', '')}"):
            break
    return res


def _sandbox_notes(cfg: object, folder: Path) -> list[str]:
    """Under ``--sandbox``: what the notebook graded in ``folder`` tried and was denied."""
    if "kernel_manager_class" not in cfg.CourseExecute:  # type: ignore[attr-defined]
        return []
    from .sandbox import attempts_in, describe

    tried = attempts_in(folder)
    return [describe(tried)] if tried else []


def _last_line(text: str) -> str:
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return one_line_reason("", lines[-1]).lstrip(": ") if lines else "(no message)"
