"""``course grade --jobs N``: N students graded at once, each job a process with its own clusters.

A job is a process of its own (``multiprocessing``, spawned), because a grading cluster lives
in its process's environment (``COURSE_CLUSTER_ID``, the run mark of
:mod:`.grading_cluster`): one job's notebooks connect to that job's cluster only. Jobs take
students from one queue, a student's notebooks in order within one job (nbgrader creates a
student's records once); the grades come back in the order a serial run gives them. The
gradebook (SQLite) is shared: a writer waits for another (a busy timeout) rather than failing
on its lock. Every process a job started is ended by its run marks afterwards, also when a job
died or the class ran past its limit.
"""

from __future__ import annotations

import multiprocessing
import queue
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import CourseError
from .grade_notebook import (
    GradingError,
    grade_item,
    grading_config,
    progress_line,
    released_notebooks,
)
from .grade_report import Graded
from .grading_cluster import GradingCluster, kill_runs_of

#: Seconds a job waits for another job's write to ``gradebook.db``.
BUSY_TIMEOUT_S = 120.0


def _job(root: str, limits: tuple[int | None, int | None], engines: int | None,
         tasks: Any, results: Any, sandbox: bool = False) -> None:
    """One job: grade the students it takes from ``tasks`` until the ``None`` at the end."""
    cfg = grading_config(Path(root), *limits, busy_timeout=BUSY_TIMEOUT_S, sandbox=sandbox)
    known = released_notebooks(Path(root))
    with GradingCluster(engines=engines, sandbox=sandbox) as gc:
        while (task := tasks.get()) is not None:
            for i, student, aid, path in task:
                try:
                    g, reset = grade_item(gc, cfg, Path(root), known, student, aid, Path(path))
                    results.put((i, g, reset, None))
                except CourseError as exc:
                    results.put((i, None, None, (exc.cause, exc.fix)))
                    return
                except Exception as exc:  # the parent reports it; the job stops
                    results.put((i, None, None, (f"{type(exc).__name__}: {exc}",
                                                 "see the job's output above")))
                    return


def run_jobs(root: Path, work: list[tuple[str, str, Path]], jobs: int,
             cell_timeout: int | None, notebook_timeout: int | None, engines: int | None,
             say: Callable[[str], None], notebook_limit: int = 0,
             sandbox: bool = False) -> Graded:
    """Grade ``work`` (``(student, assignment, path)``, the class's order) in ``jobs``
    processes; the grades in that order. ``notebook_limit``: the configured per-notebook
    limit (0: none), which bounds the wait for the whole class."""
    per_notebook = (notebook_limit or 1200) + 120
    ctx = multiprocessing.get_context("spawn")
    tasks, results = ctx.Queue(), ctx.Queue()
    tasks.cancel_join_thread()  # after an error, students nobody took must not hold us at exit
    by_student: dict[str, list[tuple[int, str, str, str]]] = {}
    for i, (student, aid, path) in enumerate(work):
        by_student.setdefault(student, []).append((i, student, aid, str(path)))
    for items in by_student.values():
        tasks.put(items)
    for _ in range(jobs):
        tasks.put(None)
    procs = [ctx.Process(target=_job, args=(str(root), (cell_timeout, notebook_timeout),
                                            engines, tasks, results, sandbox),
                         name=f"grade-job-{j}")
             for j in range(jobs)]
    for p in procs:
        p.start()
    got: dict[int, tuple[Any, float | None]] = {}
    deadline = time.monotonic() + per_notebook * len(work)
    try:
        while len(got) < len(work):
            try:
                i, g, reset, err = results.get(timeout=1.0)
            except queue.Empty:
                if not any(p.is_alive() for p in procs):
                    raise GradingError(
                        f"the grading jobs ended with {len(work) - len(got)} notebook(s) "
                        "not graded", "see their output above; grade again with --jobs 1"
                    ) from None
                if time.monotonic() > deadline:
                    raise GradingError(
                        f"the class was not graded within {per_notebook * len(work)} s",
                        "lower --cell-timeout/--notebook-timeout, or grade fewer students "
                        "at once") from None
                continue
            if err is not None:
                raise GradingError(*err)
            got[i] = (g, reset)
            say(progress_line(len(got), len(work), g))
    finally:
        _end_jobs(procs)
    out = Graded(pids=[p.pid for p in procs if p.pid])
    for i in range(len(work)):
        g, reset = got[i]
        out.grades.append(g)
        if reset is not None:
            out.resets.append(reset)
    return out


def _end_jobs(procs: list[Any]) -> None:
    """Let each job end (it stops its own cluster), else kill it; then end every process any
    of its runs left."""
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
            p.join(timeout=10)
    for p in procs:
        if p.pid is not None:
            kill_runs_of(p.pid)
