"""``course grade`` and ``course feedback``: the grader's parts, then a hostile class graded end
to end on a real cluster.

The class sits unit 0 (the shortest notebook; three graded tests, 6 points). Each student's
expected score is worked out per question from the release's own cells: the question a
breakage targets scores 0 with its reason, tests that run before it keep their points. The class
is graded as a workshop's would be, ``--jobs 2`` (two students at once, each job with its own
clusters) with a 30 s cell limit (a hang costs the limit); the full-marks student comes last,
after every hostile one, so it also shows that nothing leaks from one student into the next
score.
"""

from __future__ import annotations

import copy
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from course_utils import procs
from course_utils.assignments.nbgrader_setup import CourseExecute, RestoreDeletedTests
from course_utils.assignments.release import read_nb, release
from course_utils.instructor import grade_notebook
from course_utils.instructor.autograde import GradingError, collect, find_course, grade
from course_utils.instructor.grade_report import one_line_reason, tampering
from course_utils.instructor.grading_cluster import RUN_MARK, kill_marked, marked_processes
from course_utils.notebook_cells import nbgrader_meta
from tests.submissions import insert_after as _insert_after
from tests.submissions import solved as _solved
from tests.submissions import swap_helpers as _swap_helpers

# The module fixture grades a whole class first (minutes on a loaded machine).
pytestmark = pytest.mark.timeout(1200)

CELL_TIMEOUT = 30
NOTEBOOK_TIMEOUT = 150
UNIT0 = "00_cluster_tour.ipynb"


# ---- parts -----------------------------------------------------------------------------------
def test_one_line_reason_keeps_the_cause_and_collapses_ranks():
    evalue = ("code failed on the engines:\n  [rank 0] ValueError: bad\n  [rank 1] ValueError: bad"
              "\nFix: read the rank's error above")
    assert one_line_reason("EngineError", evalue) == (
        "EngineError: code failed on the engines: [ranks 0, 1] ValueError: bad")
    assert one_line_reason("\x1b[31mAssertionError\x1b[0m", "") == "AssertionError"
    assert len(one_line_reason("E", "x" * 1000)) == 240
    from course_utils.checks import feedback

    long = feedback("join_group(...)" + " x" * 60, "one call on every rank" + " y" * 100,
                    "ranks [0, 1] never called it. rank 0: ValueError: forgot", "call" + " z" * 60)
    assert one_line_reason("AssertionError", long) == (
        "AssertionError: found: ranks [0, 1] never called it. rank 0: ValueError: forgot")
    short = feedback("the sum", "3", "4", "add")
    assert one_line_reason("AssertionError", short) == (
        "AssertionError: checked: the sum expected: 3 found: 4 try: add")


def _cell(source: str, gid: str, **meta) -> nbformat.NotebookNode:
    m = {"grade": False, "solution": False, "locked": True, "grade_id": gid, **meta}
    return nbformat.v4.new_code_cell(source, metadata={"nbgrader": m})


def _nb(*cells) -> nbformat.NotebookNode:
    return nbformat.v4.new_notebook(cells=list(cells))


def test_tampering_names_edited_and_deleted_locked_cells():
    released = _nb(_cell("a = 1", "lesson"), _cell("x = 1", "sol", solution=True, locked=False),
                   _cell("assert x == 1, x", "t1", grade=True, points=1),
                   _cell("assert x, x", "t2", grade=True, points=1))
    submitted = copy.deepcopy(released)
    submitted.cells[1].source = "x = 2"  # a solution: allowed
    submitted.cells[2].source = "pass"
    del submitted.cells[3]
    assert tampering(submitted, released) == {"t1": "edited", "t2": "deleted"}


def test_restore_deleted_tests_puts_them_back_after_their_neighbour(tmp_path):
    released = _nb(_cell("a = 1", "lesson"), _cell("x = 1", "sol", solution=True, locked=False),
                   _cell("# lesson between", "try"), _cell("assert x", "t1", grade=True, points=1),
                   _cell("b = 2", "after"))
    (tmp_path / "unit9").mkdir()
    nbformat.write(released, tmp_path / "unit9" / "09_x.ipynb")
    submitted = copy.deepcopy(released)
    del submitted.cells[3]
    pp = RestoreDeletedTests(release_root=str(tmp_path))
    nb, _ = pp.preprocess(submitted, {"nbgrader": {"assignment": "unit9", "notebook": "09_x"}})
    assert [nbgrader_meta(c)["grade_id"] for c in nb.cells] == ["lesson", "sol", "try", "t1",
                                                                 "after"]


def test_course_execute_stops_after_a_hang_and_bounds_the_notebook(tmp_path):
    nb = _nb(nbformat.v4.new_code_cell("x = 1"),
             nbformat.v4.new_code_cell("import time\nwhile True: time.sleep(0.1)"),
             nbformat.v4.new_code_cell("x"))
    t0 = time.monotonic()
    out, _ = CourseExecute(timeout=4).preprocess(nb, {"metadata": {"path": str(tmp_path)}})
    assert time.monotonic() - t0 < 30
    assert [o.get("ename") for o in out.cells[1].outputs if o.output_type == "error"][-1] == (
        "CellTimeoutError")
    assert out.cells[2].outputs[0]["ename"] == "NotRun"
    assert "ran past its 4 s limit" in out.cells[2].outputs[0]["evalue"]

    nb = _nb(nbformat.v4.new_code_cell("import time; time.sleep(3)"),
             nbformat.v4.new_code_cell("time.sleep(3)"), nbformat.v4.new_code_cell("1"))
    out, _ = CourseExecute(timeout=60, notebook_timeout=4).preprocess(
        nb, {"metadata": {"path": str(tmp_path)}})
    assert "not run" in out.cells[2].outputs[0]["evalue"]


def test_kill_marked_ends_exactly_the_marked_processes():
    """Under load a killed child may still be running when ``kill_marked`` first looks; it used
    to reap *any* child then (``waitpid(-1)``), stealing the exit status from its ``Popen``
    (``wait()`` gave 0, not -9). It reaps nothing now; zombies count as gone."""
    mark = f"test-{os.getpid()}-{time.monotonic_ns()}"
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    marked = subprocess.Popen(sleeper, env={**os.environ, RUN_MARK: mark})
    other = subprocess.Popen(sleeper, env={**os.environ, RUN_MARK: mark + "-other"})
    try:
        deadline = time.monotonic() + 60  # until exec() has put the mark in its environment
        while marked.pid not in marked_processes(mark) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marked_processes(mark) == [marked.pid], "the marked child never showed its mark"
        assert kill_marked(mark, timeout=30) == [marked.pid]
        assert marked.wait(timeout=30) == -9
        assert marked_processes(mark) == [] and other.poll() is None
        assert other.pid in marked_processes(mark + "-other")
    finally:
        for p in (marked, other):
            p.kill()
            p.wait(timeout=30)


def test_kill_runs_of_ends_every_run_of_one_grader_only():
    """What a ``--jobs`` job that died leaves: processes of its runs ``grade-<its pid>-<n>``."""
    from course_utils.instructor.grading_cluster import kill_runs_of

    job = 10**6 + os.getpid() % 1000  # a pid no live job has: only its marks matter
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    runs = [subprocess.Popen(sleeper, env={**os.environ, RUN_MARK: f"grade-{job}-{n}"})
            for n in (1, 2)]
    other = subprocess.Popen(sleeper, env={**os.environ, RUN_MARK: f"grade-{job}1-1"})
    try:
        deadline = time.monotonic() + 60
        while len(marked_processes_with_prefix(f"grade-{job}-")) < 2 and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        assert sorted(kill_runs_of(job, timeout=30)) == sorted(p.pid for p in runs)
        assert [p.wait(timeout=30) for p in runs] == [-9, -9] and other.poll() is None
    finally:
        for p in (*runs, other):
            p.kill()
            p.wait(timeout=30)


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    return release(tmp_path_factory.mktemp("grade") / "course", units=[0])


def test_collect_takes_both_layouts_and_says_what_is_missing(course, tmp_path):
    rel = course.units[0].release
    flat = tmp_path / "flat" / "ann"
    flat.mkdir(parents=True)
    (flat / UNIT0).write_bytes(rel.read_bytes())
    (flat / "notes.ipynb").write_text("{}")  # not a course notebook: ignored
    nbg = tmp_path / "nbg" / "ben" / "unit0"
    nbg.mkdir(parents=True)
    (nbg / UNIT0).write_bytes(rel.read_bytes())
    got = collect(tmp_path / "flat", course.root) + collect(tmp_path / "nbg", course.root)
    assert [(s, a, p.relative_to(course.root).as_posix()) for s, a, p in got] == [
        ("ann", "unit0", f"submitted/ann/unit0/{UNIT0}"),
        ("ben", "unit0", f"submitted/ben/unit0/{UNIT0}")]
    (tmp_path / "empty" / "cy").mkdir(parents=True)
    with pytest.raises(GradingError, match="no submitted notebooks"):
        collect(tmp_path / "empty", course.root)
    with pytest.raises(GradingError, match="--course"):
        find_course(tmp_path / "flat", None)
    assert find_course(course.root / "submitted", None) == course.root
    with pytest.raises(GradingError, match="at least one job"):
        grade(tmp_path / "flat", course=course.root, jobs=0)


def test_jobs_grade_what_one_job_grades_in_the_same_order(course, tmp_path):
    """``--jobs 2`` against one job, on notebooks nothing of which runs (no cluster starts):
    the spawned jobs, the shared gradebook and the order of the grades."""
    released = course.units[0].release.read_text()
    for student, text in (("ann", released[:1500]), ("ben", "{}"), ("cy", released[:900])):
        (tmp_path / "class" / student).mkdir(parents=True)
        (tmp_path / "class" / student / UNIT0).write_text(text)

    def graded(jobs):
        res = grade(tmp_path / "class", course=course.root, progress=None, jobs=jobs)
        return res, [(g.student, g.status, g.error, g.score, [(q.question, q.score, q.reason)
                                                            for q in g.questions])
                     for g in res.notebooks]

    one, serial = graded(1)
    two, parallel = graded(2)
    assert parallel == serial and [row[0] for row in serial] == ["ann", "ben", "cy"]
    assert all(status == "error" for _, status, *_ in serial), serial
    assert one.job_pids == [] and len(two.job_pids) == 2
    assert not [p for p in two.job_pids if procs.pid_alive(p)]


# ---- the hostile class -----------------------------------------------------------------------
# Unit 0's graded cells, in notebook order (from the release itself, never typed in here):
# solution cells ex1-solution, ex1-leave-solution, predict-solution, ex2-solution and the test
# cells ex1-test (3 points), predict-test (1), ex2-test (2). A student's breakage sits in one
# solution cell (the *target*); every test cell before it still earns its points, and what the
# later ones score is worked out per student below.
def _gid(cell) -> str:
    return nbgrader_meta(cell).get("grade_id", "")


def _find(nb, gid):
    return next(c for c in nb.cells if _gid(c) == gid)


def _tests(nb) -> dict[str, float]:
    """grade_id -> points of the autograded test cells, in notebook order."""
    return {_gid(c): float(nbgrader_meta(c).get("points", 0)) for c in nb.cells
            if nbgrader_meta(c).get("grade") and not nbgrader_meta(c).get("solution")}


def _pos(nb, gid) -> int:
    return next(i for i, c in enumerate(nb.cells) if _gid(c) == gid)


def _tests_before(nb, gid) -> list[str]:
    return [t for t in _tests(nb) if _pos(nb, t) < _pos(nb, gid)]


def _append(nb, gid, code):
    _find(nb, gid).source += "\n" + code
    return nb


def _replace_stub(nb, gid, line):
    cell = _find(nb, gid)
    cell.source, n = re.subn(r"raise NotImplementedError\(.*\)", line, cell.source)
    assert n == 1, cell.source
    return nb


def _edit(nb, gid, code):
    _find(nb, gid).source = code
    return nb


def _delete(nb, gid):
    del nb.cells[_pos(nb, gid)]
    return nb


#: What each question of the untouched release fails with: the instructor's visible tests run on
#: nbgrader's stubs (the hint names the exercise).
UNTOUCHED = {
    "ex1-test": r"AssertionError: .*never called dist\.init_process_group.* rank 0: "
                r"NotImplementedError: Exercise 1 ",
    "predict-test": r"AssertionError: .*no predicted_after",
    "ex2-test": r"EngineError: .*NotImplementedError: Exercise 2 .* replace this line",
}
HANGS = ("c_infinite_loop", "d_partial_collective")


def build_class(course, folder: Path) -> dict[str, dict]:
    """One folder per student, as handed in; returns, per student, the breakage's target cell,
    each question's exact score and reason (regex) and the notebook's status."""
    u = course.units[0]
    released, source = read_nb(u.release), read_nb(u.source)
    tests = _tests(released)
    assert tests == u.tests and list(tests) == ["ex1-test", "predict-test", "ex2-test"]
    full = _solved(released, source)
    R, S = (lambda: copy.deepcopy(released)), (lambda: copy.deepcopy(full))  # noqa: E731

    def limit(cell):
        return rf"NotRun: not run: cell {cell} ran past its {CELL_TIMEOUT} s limit"

    def after(target, nb, later):
        """Tests before ``target`` earn their points; ``later`` gives the rest's reasons."""
        before = _tests_before(nb, target)
        return {t: (p, "") if t in before else (0.0, later[t]) for t, p in tests.items()}

    untouched = {t: (0.0, why) for t, why in UNTOUCHED.items()}
    dead = r"^EngineError: ranks 0-1 are gone: the engine died"
    students = {
        # ex1 raises; ex2 is the stub, with the helpers its test calls replaced (in the
        # kernel and on the engines) so that the stub's wrong answer would pass: not run, 0
        "b_raises_and_swaps": (_swap_helpers(_replace_stub(
            R(), "ex1-solution", 'raise ValueError("forgot the all_reduce")')),
            "ex1-solution", {**untouched, "ex1-test": (
                0.0, r"AssertionError: .*never called dist\.init_process_group.* "
                     r"rank 0: ValueError: forgot the all_reduce"), "ex2-test": (
                # unit 0's `again` is the same cluster object: its methods are replaced too
                0.0, r"^ReplacedHelper: .*not run \(0 points\): .*kernel: cluster\.call, "
                     r"kernel: cluster\.run, rank 0: course_utils\.checks\.collective_calls\."
                     r"engine_ch")},
            "graded"),
        # a %%px cell that never returns: the cell limit stops it, nothing after it runs. It
        # sleeps in its loop: a bare `pass` would keep both cores of a 2-core machine busy
        # for the whole limit, and the grader stops either the same way (an interrupt)
        "c_infinite_loop": (_append(S(), "ex1-solution",
                                    "import time\nwhile True:\n    time.sleep(0.05)\n"),
                            "ex1-solution", None, "timeout"),
        # only rank 0 calls all_reduce on cu.start_torch()'s group (60 s timeout): rank 0 waits
        # for rank 1 past the cell limit. ex1 and the prediction were tested before it.
        "d_partial_collective": (_append(
            S(), "ex2-solution",
            "if rank == 0:\n    dist.all_reduce(torch.ones(1))  # rank 1 never joins\n"),
            "ex2-solution", None, "timeout"),
        # every engine exits in ex1's cell: nothing on the engines works any more
        "e_kills_engine": (_append(S(), "ex1-solution", "import os\nos._exit(3)\n"),
                           "ex1-solution", {t: (0.0, dead) for t in tests}, "graded"),
        "f_stops_cluster": (_insert_after(S(), "ex1-solution", "cu.stop(force=True)"),
                            "ex1-solution", None, "graded"),
        # tampering on the untouched release, one student for both kinds (an edited test,
        # ex1's, and a deleted one, ex2's): the instructor's tests are what runs (checked below
        # against the full-marks student's run), so this student also stands for the release
        # handed in untouched: every test runs on the stubs and fails with its own message.
        "g_tests_tampered": (_delete(_edit(R(), "ex1-test", "pass"), "ex2-test"),
                             "ex1-test ex2-test", untouched, "graded"),
        "i_malformed_json": (None, "", {t: (0.0, r"^not a valid notebook: NotJSONError")
                                        for t in tests}, "error"),
        "z_full": (S(), "", {t: (p, "") for t, p in tests.items()}, "graded"),
    }
    students["c_infinite_loop"] = (*students["c_infinite_loop"][:2], after(
        "ex1-solution", full, {t: limit("ex1-solution") for t in tests}), "timeout")
    students["d_partial_collective"] = (*students["d_partial_collective"][:2], after(
        "ex2-solution", full, {t: limit("ex2-solution") for t in tests}), "timeout")
    students["f_stops_cluster"] = (*students["f_stops_cluster"][:2], after(
        "ex1-solution", full, STOPPED), "graded")
    out = {}
    for name, (nb, target, questions, status) in students.items():
        d = folder / name
        d.mkdir(parents=True)
        if nb is None:
            (d / UNIT0).write_text(nbformat.writes(released)[:2000])  # cut mid-JSON
        else:
            nbformat.write(nb, d / UNIT0)
        out[name] = {"target": target, "questions": questions, "status": status,
                     "score": sum(p for p, _ in questions.values())}
    return out


#: After ``cu.stop(force=True)`` in the kernel every later call on the notebook's ``cluster``
#: is refused with the course's error (not ipyparallel's closed client's).
STOPPED = {t: r"^ClusterNotRunning: cluster '.*' was stopped by cu\.stop\(\) \d+ s ago"
           for t in ("ex1-test", "predict-test", "ex2-test")}


JOBS = 2


@pytest.fixture(scope="module")
def graded(course, tmp_path_factory):
    """The class graded by ``grade(..., jobs=2)``, as ``course grade --jobs 2`` does it."""
    folder = tmp_path_factory.mktemp("class")
    expected = build_class(course, folder)
    lines: list[str] = []

    def progress(msg: str) -> None:
        lines.append(msg)
        print(msg, flush=True)

    t0 = time.perf_counter()
    result = grade(folder, course=course.root, cell_timeout=CELL_TIMEOUT,
                   notebook_timeout=NOTEBOOK_TIMEOUT, progress=progress, jobs=JOBS)
    return [(result, lines)], expected, time.perf_counter() - t0, result.job_pids


def _by_student(runs) -> dict:
    return {g.student: g for result, _ in runs for g in result.notebooks}


def test_hostile_class_scores_exactly_what_each_student_earned(graded):
    runs, expected, seconds, _ = graded
    for result, _ in runs:
        print("\n" + result.table())
    print(f"class graded in {seconds:.1f} s")
    got = _by_student(runs)
    assert sorted(got) == sorted(expected)
    wrong = []
    for name, want in expected.items():
        g = got[name]
        if g.status != want["status"]:
            wrong.append(f"{name}: status {g.status}, wanted {want['status']} ({g.error})")
        have = {q.question: q for q in g.questions}
        assert list(have) == list(want["questions"]), (name, list(have))
        for gid, (score, why) in want["questions"].items():
            q = have[gid]
            if q.score != score or (why and not re.search(why, q.reason)) or (
                    not why and q.reason):
                wrong.append(f"{name} {gid}: {q.score}/{q.max_score} reason {q.reason!r}; "
                             f"wanted {score} and /{why}/")
        if g.score != want["score"]:
            wrong.append(f"{name}: total {g.score}, wanted {want['score']}")
    assert not wrong, "\n".join(wrong)
    # The targeted question, by grade_id: what the student broke is named in its reason.
    assert re.search(r"ValueError: forgot the all_reduce",
                     _q(got["b_raises_and_swaps"], "ex1-test").reason)
    swapped = _q(got["b_raises_and_swaps"], "ex2-test").note
    assert "helpers replaced before this test:" in swapped and "kernel: cluster.call" in swapped
    assert "rank 1: course_utils.checks.collective_calls.engine_check_collectives" in swapped
    assert "ex2-solution ran past" in _q(got["d_partial_collective"], "ex2-test").reason
    assert _q(got["g_tests_tampered"], "ex1-test").note.startswith("test cell was edited")
    assert _q(got["g_tests_tampered"], "ex2-test").note.startswith("test cell was deleted")
    assert not any(q.note for g in got.values() for q in g.questions
                   if (g.student, q.question) not in {("g_tests_tampered", "ex1-test"),
                                                      ("g_tests_tampered", "ex2-test"),
                                                      ("b_raises_and_swaps", "ex2-test")})
    # What ran for the tamperer is what ran for the full-marks student, but for the answers:
    # every test cell, edited, deleted or not, is the instructor's.
    root = runs[0][0].root / "autograded"
    ran = {s: [(c.cell_type, c.source) for c in read_nb(root / s / "unit0" / UNIT0).cells
               if not nbgrader_meta(c).get("solution")] for s in ("g_tests_tampered", "z_full")}
    assert ran["g_tests_tampered"] == ran["z_full"]
    assert sum(1 for t, src in ran["z_full"] if "assert" in src) >= len(UNTOUCHED)
    # Progress: one line per student, then the summary, in each run.
    for result, lines in runs:
        n = len(result.notebooks)
        assert sum(bool(re.match(rf"\[\s*\d+/{n}\]", ln)) for ln in lines) == n
        assert any(ln.startswith(f"graded {n} notebook(s) of {n} student(s)") for ln in lines)
    # The unreadable notebook ran nothing, so it cost no cluster start.
    assert len(runs[0][0].reset_seconds) == len(runs[0][0].notebooks) - 1


def _q(g, gid):
    return next(q for q in g.questions if q.question == gid)


def test_a_hang_costs_at_most_the_limit_and_nothing_is_left_running(graded):
    runs, _, seconds, job_pids = graded
    got = _by_student(runs)
    normal = max(g.seconds for g in got.values() if g.student not in HANGS)
    for name in HANGS:  # the notebook's normal time plus one cell limit, never the whole limit
        assert got[name].seconds < min(NOTEBOOK_TIMEOUT, normal + CELL_TIMEOUT + 20), (
            name, got[name].seconds, normal)
    # Two jobs, each its own process and clusters, graded at the same time: the class took
    # less than its notebooks one after the other; the jobs are gone, and all they started.
    serial = sum(g.seconds for g in got.values())
    print(f"\n{JOBS} jobs: {seconds:.0f} s for notebooks that took {serial:.0f} s in all")
    assert len(job_pids) == JOBS and os.getpid() not in job_pids and seconds < serial
    assert not [p for p in job_pids if procs.pid_alive(p)]
    left = [pid for grader in (os.getpid(), *job_pids)
            for pid in marked_processes_with_prefix(f"grade-{grader}-")]
    assert not left, f"processes left running after grading: {left}"


def marked_processes_with_prefix(prefix: str) -> list[int]:
    return list(procs.pids_with_environ_prefix(f"{RUN_MARK}={prefix}"))


def test_grades_csv_and_json_have_a_row_per_student_and_question(graded):
    import csv
    import json

    runs, expected, _, _ = graded
    for result, _ in runs:
        names = [g.student for g in result.notebooks]
        rows = list(csv.DictReader(open(result.root / "grades.csv")))
        assert [(r["student"], r["question"], float(r["score"])) for r in rows] == [
            (s, q, p) for s in names for q, (p, _) in expected[s]["questions"].items()]
        assert all(r["reason"] for r in rows if r["passed"] == "False")
        doc = json.loads((result.root / "grades.json").read_text())
        assert doc["cell_timeout"] == result.cell_timeout and len(doc["students"]) == len(names)
        assert {s["student"]: s["score"] for s in doc["students"]} == {
            s: expected[s]["score"] for s in names}
    assert [r.cell_timeout for r, _ in runs] == [CELL_TIMEOUT]


def test_feedback_is_an_offline_html_page_per_graded_student(graded):
    from course_utils.instructor.feedback_html import feedback

    runs, expected, _, _ = graded
    result = runs[0][0]
    done = feedback(result.root, progress=None)
    assert {f.student for f in done} == {g.student for g in result.notebooks} - {
        "i_malformed_json"}
    assert all(f.ok and len(f.html) == 1 for f in done)
    page = {f.student: f.html[0].read_text() for f in done}
    full = expected["z_full"]["score"]
    assert f"Score: {full:.1f} / {full:.1f}" in page["z_full"]
    assert f"Score: 0.0 / {full:.1f}" in page["b_raises_and_swaps"]
    assert "forgot the all_reduce" in page["b_raises_and_swaps"]
    for html in page.values():
        assert not re.search(r'<link[^>]+href="https?:', html), "stylesheet from the network"
        external = re.findall(r'<script[^>]+src="(https?:[^"]+)"', html)
        assert all("mathjax" in s.lower() for s in external), external


def test_a_tiny_course_end_to_end_with_a_written_answer(tmp_path):
    """release -> grade on a two-cell notebook: autograded test scored, the written answer
    left to a person (pending, not failed), reasons for the student who did nothing."""
    def nbg(gid, **kw):
        return {"nbgrader": {"grade_id": gid, "grade": False, "solution": False, "locked": True,
                             "schema_version": 3, **kw}}

    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# Unit 0 — Tiny", metadata=nbg("intro")),
        nbformat.v4.new_code_cell("def f():\n    ### BEGIN SOLUTION\n    return 42\n"
                                  "    ### END SOLUTION", metadata=nbg("ex1-solution",
                                                                      solution=True,
                                                                      locked=False)),
        nbformat.v4.new_code_cell('assert f() == 42, f"f() should return 42, got {f()}"',
                                  metadata=nbg("ex1-test", grade=True, points=1)),
        nbformat.v4.new_markdown_cell("### BEGIN SOLUTION\nA reference answer.\n"
                                      "### END SOLUTION", metadata=nbg(
                                          "answer", grade=True, solution=True, locked=False,
                                          points=2)),
    ])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    (tmp_path / "nbs").mkdir()
    nbformat.write(nb, tmp_path / "nbs" / "00_tiny.ipynb")
    rel = release(tmp_path / "course", notebook_dir=tmp_path / "nbs")
    assert rel.units[0].tests == {"ex1-test": 1.0} and rel.units[0].answers == {"answer": 2.0}
    released = read_nb(rel.units[0].release)
    solved = _solved(released, read_nb(rel.units[0].source))
    solved.cells[3].source = "My own words."
    for name, book in (("ann", solved), ("bob", released)):
        (tmp_path / "class" / name).mkdir(parents=True)
        nbformat.write(book, tmp_path / "class" / name / "00_tiny.ipynb")
    res = grade(tmp_path / "class", course=rel.root, progress=None)
    ann, bob = res.notebooks
    assert (ann.score, ann.max_score, bob.score) == (1.0, 3.0, 0.0)
    assert [(q.question, q.score, q.by_hand) for q in ann.questions] == [
        ("ex1-test", 1.0, False), ("answer", 0.0, True)]
    assert "formgrader" in ann.questions[1].note and not ann.questions[1].reason
    assert re.search(r"NotImplementedError: Exercise|NotImplementedError: Unit 0",
                     bob.questions[0].reason), bob.questions[0].reason


def test_a_cluster_that_does_not_start_is_tried_once_more_on_a_fresh_id(monkeypatch, capsys):
    """One failed start (on a loaded machine both engines can lose the controller's
    heartbeat) does not end a class's grading: the grader says so and starts a fresh cluster;
    a second failure is the error."""
    from course_utils.cluster.kernel import lifecycle
    from course_utils.errors import EnginesDidNotStart
    from course_utils.instructor.grading_cluster import RUN_MARK, GradingCluster

    asked: list[str] = []

    def start(n, cluster_id, timeout):
        asked.append(cluster_id)
        if len(asked) in (1, 3, 4):
            raise EnginesDidNotStart("2 of 2 engines exited before registering", "retry")
        return None

    monkeypatch.setattr(lifecycle, "start", start)
    monkeypatch.setattr(lifecycle, "stop_running", lambda cid: False)
    with GradingCluster(engines=2) as gc:
        gc.restart()
        assert asked == [f"grade-{os.getpid()}-1", f"grade-{os.getpid()}-2"]
        assert os.environ[RUN_MARK] == asked[-1]
        assert "did not start (2 of 2 engines exited" in capsys.readouterr().err
        with pytest.raises(EnginesDidNotStart):
            gc.restart()  # the third and fourth starts fail
    assert len(asked) == 4 and RUN_MARK not in os.environ


class _FlakyStart:
    """An autograder whose first kernels never start (the port race) or whose notebook fails."""

    starts: list[str] = []

    def __init__(self, coursedir: object, config: object) -> None:
        self.log = logging.getLogger(f"flaky-{len(self.starts)}")
        self.force = self.create_student = False

    def start(self) -> None:
        outcome = self.plan[len(self.starts)]
        self.starts.append(outcome)
        if outcome == "port":
            self.log.error("RuntimeError: Kernel died before replying to kernel_info")
            raise RuntimeError("nbgrader.converters.base.NbGraderException: see above")
        if outcome == "notebook":
            raise RuntimeError("nbgrader.converters.base.NbGraderException: a cell failed")


@pytest.mark.parametrize("plan, success, tries", [
    (["port", "ok"], True, 2),          # the kernel lost its port once: graded on the retry
    (["port", "port"], False, 2),       # twice: reported, not retried for ever
    (["notebook", "ok"], False, 1),     # the notebook's own failure is not retried
])
def test_autograde_runs_once_more_only_when_the_kernel_never_started(plan, success, tries):
    flaky = type("Flaky", (_FlakyStart,), {"plan": plan, "starts": []})
    res = grade_notebook._autograde(flaky, object(), object())
    assert res["success"] is success and len(flaky.starts) == tries
