"""``course grade``: autograde a class headless with nbgrader, on a real cluster.

nbgrader does the grading (``Autograde``: instructor cells restored from the gradebook by
checksum, hidden tests put back, the notebook executed, scores saved to ``gradebook.db``); this
module adds what a distributed course needs around it:

* a **cluster** the notebooks' ``cu.start()`` connects to, and a **fresh one per notebook**: its
  own cluster id, and every process of the previous run (controller, engines, the kernel, engines
  the kernel's ``cu.restart()`` started) ended by pid, so no state or process group leaks from
  one student into the next score (:mod:`.grading_cluster`);
* **time limits** per cell and per notebook
  (:class:`course_utils.assignments.nbgrader_setup.CourseExecute`): a student whose notebook
  hangs costs at most the limit;
* a **per-student, per-question** table (CSV and JSON) with each failure's one-line reason and
  notes on tampering (a test cell edited or deleted: the instructor's version ran)
  (:mod:`.grade_report`).
"""

from __future__ import annotations

import contextlib
import shutil
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import nbformat
from nbformat import NotebookNode

from .. import settings
from ..assignments.integrity import replaced_in
from ..assignments.release import load_config, run_app
from ..errors import CourseError
from ..notebook_cells import grade_id, nbgrader_meta
from .grade_report import (
    ClassGrades,
    NotebookGrade,
    Question,
    cell_reason,
    one_line_reason,
    tampering,
)
from .grading_cluster import GradingCluster


class GradingError(CourseError):
    """The class could not be graded (no course folder, no submissions...)."""


def released_notebooks(root: Path) -> dict[str, tuple[str, Path]]:
    """Notebook file name -> (assignment, released path), from the course's ``release/``."""
    out = {}
    for path in sorted((root / "release").glob("*/*.ipynb")):
        out[path.name] = (path.parent.name, path)
    return out


def find_course(submissions: Path, course: str | Path | None) -> Path:
    if course is not None:
        root = Path(course).resolve()
    elif (submissions / "nbgrader_config.py").exists():
        root = submissions
    elif (submissions.parent / "nbgrader_config.py").exists():
        root = submissions.parent
    else:
        raise GradingError(f"no course folder found for {submissions}",
                           "pass --course OUTDIR, the folder `course release OUTDIR` made")
    if not (root / "nbgrader_config.py").exists() or not (root / "release").is_dir():
        raise GradingError(f"{root} is not a course folder (no nbgrader_config.py or release/)",
                           "run `course release OUTDIR` first and pass --course OUTDIR")
    return root


def collect(submissions: str | Path, root: Path) -> list[tuple[str, str, Path]]:
    """Put every submission in ``root/submitted/<student>/<assignment>/`` (nbgrader's layout)
    and return ``(student, assignment, notebook path)``, sorted by student.

    ``submissions`` is either nbgrader's ``submitted/`` folder (``<student>/<assignment>/*.ipynb``)
    or one folder per student holding the notebooks as handed out (``<student>/*.ipynb``).
    """
    submissions = Path(submissions).resolve()
    if (submissions / "nbgrader_config.py").exists():
        submissions = submissions / "submitted"
    if not submissions.is_dir():
        raise GradingError(f"{submissions} is not a folder",
                           "pass the folder that holds one folder per student")
    known = released_notebooks(root)
    target = root / "submitted"
    out = []
    for student_dir in sorted(p for p in submissions.iterdir() if p.is_dir()):
        student = student_dir.name
        if student.startswith("."):
            continue
        found = [p for p in student_dir.glob("*/*.ipynb") if p.parent.name in
                 {a for a, _ in known.values()}] or list(student_dir.glob("*.ipynb"))
        for nb in sorted(found):
            if ".ipynb_checkpoints" in nb.parts or nb.name not in known:
                continue
            aid = known[nb.name][0]
            dest = target / student / aid / nb.name
            if nb.resolve() != dest.resolve():
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(nb, dest)
            out.append((student, aid, dest))
    if not out:
        names = ", ".join(sorted(known)) or "(none released)"
        raise GradingError(f"no submitted notebooks found under {submissions}",
                           f"lay them out as <student>/<notebook> with notebook names from: "
                           f"{names}")
    return out


# ---- grading ---------------------------------------------------------------------------------
def grade(submissions: str | Path, course: str | Path | None = None,
          units: list[int] | None = None, cell_timeout: int | None = None,
          notebook_timeout: int | None = None, engines: int | None = None,
          progress: Callable[[str], None] | None = print) -> ClassGrades:
    """Autograde every submission under ``submissions`` with nbgrader, one fresh cluster per
    notebook; write ``grades.csv``/``grades.json`` into the course folder and return them."""
    from nbgrader.converters import Autograde

    from ..assignments.release import unit_of

    say = progress or (lambda _msg: None)
    submissions = Path(submissions).resolve()
    root = find_course(submissions, course)
    work = collect(submissions, root)
    if units is not None:
        work = [w for w in work if unit_of(w[2]) in units]
    cfg = load_config(root)
    if cell_timeout:
        cfg.CourseExecute.timeout = cell_timeout
    if notebook_timeout:
        cfg.CourseExecute.notebook_timeout = notebook_timeout
    result = ClassGrades(root, cell_timeout=int(cfg.CourseExecute.get("timeout", 0) or 0),
                         notebook_timeout=int(cfg.CourseExecute.get("notebook_timeout", 0) or 0))
    known = released_notebooks(root)
    t_class = time.perf_counter()
    say(f"course grade: {len(work)} notebook(s) of {len({w[0] for w in work})} student(s); "
        f"cell limit {result.cell_timeout} s, notebook limit {result.notebook_timeout} s; "
        f"a fresh {engines or settings.default_engines()}-engine cluster for each")
    with GradingCluster(engines=engines) as gc, warnings.catch_warnings():
        # nbgrader's gradebook code trips SQLAlchemy's autoflush warnings; they mean nothing here
        warnings.filterwarnings("ignore", message=".*not in session.*")
        for i, (student, aid, path) in enumerate(work, start=1):
            t0 = time.perf_counter()
            try:
                if _readable(path):  # nothing of an unreadable notebook runs: no cluster
                    result.reset_seconds.append(gc.restart())
            except CourseError as exc:
                raise GradingError(f"could not start a cluster to grade with: {exc.cause}",
                                   exc.fix) from exc
            g = _grade_one(Autograde, cfg, root, student, aid, path, known[path.name][1])
            g.seconds = time.perf_counter() - t0
            result.notebooks.append(g)
            failed = next((q for q in g.questions if not q.passed and not q.by_hand), None)
            why = g.error or (f"{failed.question}: {failed.reason}" if failed else "")
            say(f"[{i:>2}/{len(work)}] {student:<16} {aid:<8} {g.score:>4g}/{g.max_score:<4g} "
                f"{g.seconds:>6.1f} s  {why[:100]}")
    result.seconds = time.perf_counter() - t_class
    result.write()
    say(result.summary())
    say(f"wrote {root / 'grades.csv'} and {root / 'grades.json'}")
    return result


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
    app = autograde_cls(coursedir=coursedir, config=cfg)
    app.force, app.create_student = True, True
    res = run_app(app) if submitted is not None else {"success": False}
    if not res.get("success") and g.status != "error":
        g.status = "error"
        g.error = "nbgrader could not grade it: " + _last_line(res.get("error", ""))

    autograded = root / "autograded" / student / aid / path.name
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


def _last_line(text: str) -> str:
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return one_line_reason("", lines[-1]).lstrip(": ") if lines else "(no message)"
