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
  (:mod:`.grade_report`);
* ``--jobs N``: N students at once, each job with its own clusters (:mod:`.grade_jobs`).

One notebook's grading is :mod:`.grade_notebook`.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

from .. import settings
from .grade_notebook import (
    GradingError,
    grade_item,
    grading_config,
    progress_line,
    released_notebooks,
)
from .grade_report import ClassGrades, Graded
from .grading_cluster import GradingCluster

__all__ = ["GradingError", "collect", "find_course", "grade", "released_notebooks"]


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
          progress: Callable[[str], None] | None = print, jobs: int = 1,
          sandbox: bool = False) -> ClassGrades:
    """Autograde every submission under ``submissions`` with nbgrader, one fresh cluster per
    notebook; write ``grades.csv``/``grades.json`` into the course folder and return them.
    ``jobs`` > 1 grades that many students at once, each job with its own clusters
    (:mod:`.grade_jobs`); the grades are the same, in the same order. ``sandbox``: each
    notebook's kernel and the cluster it starts run in a sandbox (:mod:`.sandbox`)."""
    from ..assignments.release import unit_of

    say = progress or (lambda _msg: None)
    if jobs < 1:
        raise GradingError(f"--jobs {jobs}: there must be at least one job",
                           "pass --jobs 1 (one notebook at a time) or more")
    submissions = Path(submissions).resolve()
    root = find_course(submissions, course)
    work = collect(submissions, root)
    if units is not None:
        work = [w for w in work if unit_of(w[2]) in units]
    cfg = grading_config(root, cell_timeout, notebook_timeout, sandbox=sandbox)
    result = ClassGrades(root, cell_timeout=int(cfg.CourseExecute.get("timeout", 0) or 0),
                         notebook_timeout=int(cfg.CourseExecute.get("notebook_timeout", 0) or 0))
    known = released_notebooks(root)
    t_class = time.perf_counter()
    jobs = min(jobs, len({w[0] for w in work}))
    say(f"course grade: {len(work)} notebook(s) of {len({w[0] for w in work})} student(s); "
        f"cell limit {result.cell_timeout} s, notebook limit {result.notebook_timeout} s; "
        f"a fresh {engines or settings.default_engines()}-engine cluster for each"
        + (f"; {jobs} jobs at once" if jobs > 1 else "")
        + ("; each in a sandbox" if sandbox else ""))
    if jobs > 1:
        from .grade_jobs import run_jobs

        graded = run_jobs(root, work, jobs, cell_timeout, notebook_timeout, engines, say,
                          notebook_limit=result.notebook_timeout, sandbox=sandbox)
        result.job_pids = graded.pids
    else:
        graded = _grade_serially(root, work, cfg, known, engines, say, sandbox)
    result.notebooks, result.reset_seconds = graded.grades, graded.resets
    result.seconds = time.perf_counter() - t_class
    result.write()
    say(result.summary())
    say(f"wrote {root / 'grades.csv'} and {root / 'grades.json'}")
    return result


def _grade_serially(root: Path, work: list[tuple[str, str, Path]], cfg: object,
                    known: dict[str, tuple[str, Path]], engines: int | None,
                    say: Callable[[str], None], sandbox: bool = False) -> Graded:
    out = Graded()
    with GradingCluster(engines=engines, sandbox=sandbox) as gc:
        for i, (student, aid, path) in enumerate(work, start=1):
            g, reset = grade_item(gc, cfg, root, known, student, aid, path)
            out.grades.append(g)
            if reset is not None:
                out.resets.append(reset)
            say(progress_line(i, len(work), g))
    return out
