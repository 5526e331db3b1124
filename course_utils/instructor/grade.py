"""``course grade``: autograde a class headless with nbgrader, on a real cluster.

nbgrader does the grading (``Autograde``: instructor cells restored from the gradebook by
checksum, hidden tests put back, the notebook executed, scores saved to ``gradebook.db``); this
module adds what a distributed course needs around it:

* a **cluster** the notebooks' ``cu.start()`` connects to, and a **fresh one per notebook**: its
  own cluster id, and every process of the previous run (controller, engines, the kernel, engines
  the kernel's ``cu.restart()`` started) ended by pid, so no state or process group leaks from
  one student into the next score;
* **time limits** per cell and per notebook
  (:class:`course_utils.assignments.nbgrader_setup.CourseExecute`): a student whose notebook
  hangs costs at most the limit;
* a **per-student, per-question** table (CSV and JSON) with each failure's one-line reason and
  notes on tampering (a test cell edited or deleted: the instructor's version ran).
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import shutil
import signal
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat
from nbformat import NotebookNode

from .. import settings
from ..assignments.release import load_config, run_app
from ..errors import CourseError
from .grading import nbgrader_meta

#: Marks every process started for one graded notebook (the controller, engines, the kernel and
#: anything it starts inherit it), so that all of them can be ended by pid afterwards.
RUN_MARK = "COURSE_GRADING_RUN"
REASON_CHARS = 240
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_FEEDBACK_DROP = ("checked:", "try:", "expected:")  # checks.feedback's lines, least use first


class GradingError(CourseError):
    """The class could not be graded (no course folder, no submissions...)."""


# ---- results ---------------------------------------------------------------------------------
@dataclass
class Question:
    question: str
    score: float
    max_score: float
    reason: str = ""
    note: str = ""

    @property
    def passed(self) -> bool:
        return self.score >= self.max_score > 0

    @property
    def by_hand(self) -> bool:
        return self.note.startswith("graded by hand")


@dataclass
class NotebookGrade:
    student: str
    assignment: str
    notebook: str
    score: float
    max_score: float
    seconds: float
    status: str  # "graded", "timeout" (a cell hit its limit), "error" (nbgrader could not run it)
    error: str = ""
    notes: list[str] = field(default_factory=list)
    questions: list[Question] = field(default_factory=list)


@dataclass
class ClassGrades:
    root: Path
    notebooks: list[NotebookGrade] = field(default_factory=list)
    seconds: float = 0.0
    reset_seconds: list[float] = field(default_factory=list)
    cell_timeout: int = 0
    notebook_timeout: int = 0

    def student(self, name: str) -> list[NotebookGrade]:
        return [g for g in self.notebooks if g.student == name]

    def totals(self) -> dict[str, tuple[float, float]]:
        out: dict[str, tuple[float, float]] = {}
        for g in self.notebooks:
            s, m = out.get(g.student, (0.0, 0.0))
            out[g.student] = (s + g.score, m + g.max_score)
        return out

    def rows(self) -> list[dict]:
        return [{"student": g.student, "assignment": g.assignment, "notebook": g.notebook,
                 "question": q.question, "score": q.score, "max_score": q.max_score,
                 "passed": q.passed, "reason": q.reason, "note": q.note}
                for g in self.notebooks for q in g.questions]

    def write(self, folder: str | Path | None = None) -> tuple[Path, Path]:
        """Write ``grades.csv`` (one row per student and question) and ``grades.json``."""
        folder = Path(folder or self.root)
        csv_path, json_path = folder / "grades.csv", folder / "grades.json"
        fields = ["student", "assignment", "notebook", "question", "score", "max_score",
                  "passed", "reason", "note"]
        with open(csv_path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            w.writerows(self.rows())
        doc = {
            "course": str(self.root), "seconds": round(self.seconds, 1),
            "cell_timeout": self.cell_timeout, "notebook_timeout": self.notebook_timeout,
            "reset_seconds": [round(s, 2) for s in self.reset_seconds],
            "students": [
                {"student": s, "score": t[0], "max_score": t[1],
                 "notebooks": [_nb_dict(g) for g in self.student(s)]}
                for s, t in self.totals().items()],
        }
        json_path.write_text(json.dumps(doc, indent=1) + "\n")
        return csv_path, json_path

    def table(self) -> str:
        """The score table: one line per graded notebook."""
        lines = [f"{'student':<16} {'assignment':<10} {'score':>9} {'time':>7}  first reason"]
        for g in self.notebooks:
            failed = next((q for q in g.questions if not q.passed and not q.by_hand), None)
            why = g.error or (f"{failed.question}: {failed.reason}" if failed else "")
            lines.append(f"{g.student:<16} {g.assignment:<10} {g.score:>4g}/{g.max_score:<4g} "
                         f"{g.seconds:>6.1f}s  {why[:90]}")
        return "\n".join(lines)

    def summary(self) -> str:
        n = len(self.notebooks)
        students = len(self.totals())
        full = sum(1 for s, m in self.totals().values() if s >= m > 0)
        times = [g.seconds for g in self.notebooks]
        resets = self.reset_seconds
        mean, worst = sum(times) / max(n, 1), max(times or [0])
        return (f"graded {n} notebook(s) of {students} student(s) in {self.seconds:.1f} s "
                f"(per notebook: mean {mean:.1f} s, max {worst:.1f} s; "
                f"cluster reset: mean {sum(resets) / max(len(resets), 1):.1f} s); "
                f"full marks: {full}/{students}; "
                f"total {sum(g.score for g in self.notebooks):g}/"
                f"{sum(g.max_score for g in self.notebooks):g} points")


def _nb_dict(g: NotebookGrade) -> dict:
    d = asdict(g)
    d["seconds"] = round(g.seconds, 1)
    for q, qd in zip(g.questions, d["questions"], strict=True):
        qd["passed"] = q.passed
    return d


# ---- reasons ---------------------------------------------------------------------------------
def one_line_reason(ename: str, evalue: str, limit: int = REASON_CHARS) -> str:
    """``ename: evalue`` on one line: ANSI codes and a course error's ``Fix:`` line dropped,
    identical per-rank errors collapsed (``[ranks 0, 1] ValueError: ...``). A test's
    ``checks.feedback`` message that is too long loses its ``checked:``, then ``try:``, then
    ``expected:`` line before anything is cut, so what was *found* stays."""
    text = _ANSI.sub("", evalue or "")
    text = text.split("\nFix:")[0]
    lines = text.splitlines()
    for key in _FEEDBACK_DROP:
        if len(_ANSI.sub("", ename)) + 2 + len(" ".join(" ".join(lines).split())) <= limit:
            break
        lines = [ln for ln in lines if not ln.startswith(key)]
    text = "\n".join(lines)
    per_rank = re.findall(r"\[rank (\d+)\] (.+)", text)
    if per_rank:
        by_msg: dict[str, list[str]] = {}
        for r, msg in per_rank:
            by_msg.setdefault(msg.strip(), []).append(r)
        head = text.split("[rank ")[0]
        text = head + " ".join(
            f"[rank{'s' if len(rs) > 1 else ''} {', '.join(rs)}] {msg}"
            for msg, rs in by_msg.items())
    text = " ".join(text.split())
    out = f"{_ANSI.sub('', ename)}: {text}" if text else _ANSI.sub("", ename)
    return out if len(out) <= limit else out[: limit - 3] + "..."


def cell_reason(cell: NotebookNode) -> str:
    errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    if not errors:
        return ""
    e = errors[-1] if errors[-1].get("ename") != "KeyboardInterrupt" else errors[0]
    return one_line_reason(e.get("ename", "Error"), e.get("evalue", ""))


def tampering(submitted: NotebookNode, released: NotebookNode) -> dict[str, str]:
    """Locked cells (tests and lesson cells) the student edited or deleted: grade_id -> what."""
    sub = {nbgrader_meta(c).get("grade_id"): c for c in submitted.cells
           if nbgrader_meta(c).get("grade_id")}
    out = {}
    for cell in released.cells:
        m = nbgrader_meta(cell)
        gid = m.get("grade_id")
        if not gid or not m.get("locked"):
            continue
        if gid not in sub:
            out[gid] = "deleted"
        elif sub[gid].source.strip() != cell.source.strip():
            out[gid] = "edited"
    return out


# ---- the cluster a class is graded on --------------------------------------------------------
def marked_processes(value: str, key: str = RUN_MARK) -> list[int]:
    """Pids of live processes whose environment has ``key=value`` (never this process)."""
    needle = f"{key}={value}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in env and state != "Z":
            pids.append(int(entry.name))
    return pids


def kill_marked(value: str, timeout: float = 5.0) -> list[int]:
    """SIGKILL every process carrying ``RUN_MARK=value``; wait (bounded) until they are gone.

    A killed child of this process stays a zombie until its owner (a ``Popen``, ipyparallel's
    launcher) reaps it: :func:`marked_processes` counts zombies as gone, and nothing here reaps,
    so no owner loses its child's exit status.
    """
    pids = marked_processes(value)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while marked_processes(value) and time.monotonic() < deadline:
        time.sleep(0.05)
    return pids


class GradingCluster:
    """A fresh cluster for each graded notebook: its own id and processes, torn down by pid.

    :meth:`reset` ends every process the previous notebook left (controller, engines, the
    kernel, engines its ``cu.restart()`` started) and starts a new controller and engines.
    Measured against keeping the controller and replacing only the engines, the difference is
    small (see the README), and a fresh cluster survives a student's ``cu.stop(force=True)``.
    """

    def __init__(self, engines: int | None = None, start_timeout: float | None = None) -> None:
        self.engines = engines or settings.default_engines()
        self.start_timeout = start_timeout
        self.count = 0
        self.cc = None
        self.cluster_id = ""
        self.mark = ""
        self._saved_env = {k: os.environ.get(k) for k in (settings.ENV_CLUSTER_ID, RUN_MARK)}

    def reset(self) -> float:
        """End everything of the previous run and have a clean cluster ready; seconds taken."""
        from ..cluster import lifecycle

        t0 = time.perf_counter()
        self._stop()
        if self.mark:
            kill_marked(self.mark)
        self.count += 1
        self.mark = self.cluster_id = f"grade-{os.getpid()}-{self.count}"
        os.environ[RUN_MARK] = self.mark
        os.environ[settings.ENV_CLUSTER_ID] = self.cluster_id
        self.cc = lifecycle.start(n=self.engines, cluster_id=self.cluster_id,
                                  timeout=self.start_timeout)
        return time.perf_counter() - t0

    def _stop(self) -> None:
        from ..cluster import lifecycle

        if self.cc is not None:
            with contextlib.suppress(Exception):
                self.cc.stop(force=True)
            with contextlib.suppress(Exception):
                lifecycle.stop_running(self.cluster_id)
            self.cc = None

    def close(self) -> None:
        self._stop()
        if self.mark:
            kill_marked(self.mark)
        for k, v in self._saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    def __enter__(self) -> GradingCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---- submissions -----------------------------------------------------------------------------
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
                    result.reset_seconds.append(gc.reset())
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
    test_ids = [nbgrader_meta(c)["grade_id"] for c in tests]
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
        by_cell = {nbgrader_meta(c).get("grade_id"): c for c in done.cells}
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
            gid = nbgrader_meta(cell)["grade_id"]
            pending = gid in by_hand
            g.questions.append(Question(
                gid, scores.get(gid, 0.0), float(nbgrader_meta(cell).get("points", 0)),
                "", "graded by hand: open formgrader (nbgrader) in the course folder"
                if pending else "graded by hand"))
            continue
        gid = nbgrader_meta(cell)["grade_id"]
        pts = float(nbgrader_meta(cell).get("points", 0))
        score = scores.get(gid, 0.0) if g.status != "error" else 0.0
        reason = ""
        if score < pts:
            reason = g.error or (cell_reason(by_cell[gid]) if gid in by_cell else "not run")
        note = {"edited": "test cell was edited; the instructor's version ran",
                "deleted": "test cell was deleted; the instructor's version was put back and ran"
                }.get(changed.get(gid, ""), "")
        g.questions.append(Question(gid, score, pts, reason, note))
    g.score = sum(q.score for q in g.questions)
    return g


def _last_line(text: str) -> str:
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return one_line_reason("", lines[-1]).lstrip(": ") if lines else "(no message)"
