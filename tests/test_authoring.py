"""``docs/authoring.md`` followed on a copy of the course: a small exercise added to unit 0 (the
task, the solution cell, a test with a visible and a hidden part) and one catalogued mistake.
Then ``course release`` stubs it and drops the hidden part, the catalogue runs the mistake and
the stub inside nbval's run of the unit, and ``course grade`` grades it, hidden test included."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from course_utils.notebook_cells import nbgrader_meta

ROOT = Path(__file__).resolve().parents[1]
UNIT0 = "00_cluster_tour.ipynb"

TASK = """## Exercise 3 — the bytes of a ring (1 point)

Write `ring_bytes_per_rank(n_bytes, p)`: how many bytes each of `p` ranks sends in a ring
all-reduce of a buffer of `n_bytes` bytes (`2(p-1)/p` of the buffer)."""

SOLUTION = """def ring_bytes_per_rank(n_bytes, p):
    ### BEGIN SOLUTION
    return 2 * (p - 1) * n_bytes / p
    ### END SOLUTION"""

TEST = """got = ring_bytes_per_rank(1000, 4)
assert got == 1500, checks.feedback("ring_bytes_per_rank(1000, 4)", "1500.0", f"{got}",
                                    "each rank sends 2(p-1)/p of the buffer")
### BEGIN HIDDEN TESTS
got = ring_bytes_per_rank(900, 3)
assert got == 1200, checks.feedback("ring_bytes_per_rank(900, 3)", "1200.0", f"{got}",
                                    "each rank sends 2(p-1)/p of the buffer")
### END HIDDEN TESTS"""

MISTAKE = '''"""The ring's bytes without the factor 2: the all-gather half forgotten."""

NOTEBOOK = "00_cluster_tour.ipynb"
GRADE_ID = "ex3-solution"
REPLACE = [("return 2 * (p - 1) * n_bytes / p", "return (p - 1) * n_bytes / p")]
FAILS = "ex3-test"
MESSAGE = "2(p-1)/p of the buffer"
WITHIN_S = 30
'''


def _meta(grade_id: str, *, solution: bool = False, points: int = 0) -> dict:
    """The metadata the page's table gives each kind of cell: nbgrader's, and the exercise a
    solution or test belongs to."""
    meta = {"nbgrader": {"grade": points > 0, "grade_id": grade_id, "locked": not solution,
                         "schema_version": 3, "solution": solution, "task": False,
                         **({"points": points} if points else {})}}
    return {**meta, "course": {"exercise": "ex3"}} if solution or points else meta


def add_exercise(notebook: Path) -> None:
    """The page's three cells, right after the unit's set-up cell: the answer needs no cluster,
    and the catalogue then runs only the set-up before it (the Summary stays last)."""
    nb = nbformat.read(notebook, as_version=4)
    at = next(i for i, c in enumerate(nb.cells) if nbgrader_meta(c).get("grade_id") == "setup") + 1
    nb.cells[at:at] = [
        nbformat.v4.new_markdown_cell(TASK, metadata=_meta("ex3-md")),
        nbformat.v4.new_code_cell(SOLUTION, metadata=_meta("ex3-solution", solution=True)),
        nbformat.v4.new_code_cell(TEST, metadata=_meta("ex3-test", points=1))]
    nbformat.write(nb, notebook)


def course_copy(dest: Path) -> Path:
    """The checkout's tracked files (what a maintainer edits), without its virtual env."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        if (ROOT / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dest / rel)
    return dest


def _env(copy: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COURSE_"))}
    return {**env, "PYTHONPATH": str(copy), "COURSE_CLUSTER_ID": f"authoring-{os.getpid()}",
            "COURSE_KERNEL_PREFIX": str(copy / "kernel"), "COURSE_WORKDIR": str(copy / "w")}


@pytest.fixture(scope="module")
def copy(tmp_path_factory):
    if not (ROOT / ".git").exists():
        pytest.skip("needs the course's git checkout (it copies the tracked files)")
    dest = course_copy(tmp_path_factory.mktemp("authoring") / "course")
    add_exercise(dest / "notebooks" / UNIT0)
    (dest / "tests" / "mistakes" / "u00_ring_bytes_no_two.py").write_text(MISTAKE)
    return dest


@pytest.mark.timeout(420)
def test_the_catalogue_runs_the_new_mistake_and_the_new_stub(copy):
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:randomly", "-n", "0", "-q",
         f"notebooks/{UNIT0}", "-k", "u00_ring_bytes_no_two or stub_00_ex3"],
        cwd=copy, env=_env(copy), capture_output=True, text=True, timeout=400)
    said = out.stdout[-3000:] + out.stderr[-2000:]
    assert out.returncode == 0, said
    assert "2 passed" in out.stdout, said


@pytest.mark.timeout(420)
def test_release_stubs_it_and_grade_scores_the_hidden_test(copy, tmp_path):
    course = tmp_path / "out"
    subprocess.run([sys.executable, "-m", "course_utils.cli", "release", str(course),
                    "--unit", "0", "--notebooks", str(copy / "notebooks")], cwd=copy,
                   env=_env(copy), check=True, capture_output=True, timeout=300)
    released = nbformat.read(course / "release" / "unit0" / UNIT0, as_version=4)
    cells = {nbgrader_meta(c).get("grade_id"): c for c in released.cells}
    assert "NotImplementedError" in cells["ex3-solution"].source
    assert "2 * (p - 1)" not in cells["ex3-solution"].source
    assert "900, 3" not in cells["ex3-test"].source and "1000, 4" in cells["ex3-test"].source
    # a learner whose answer passes the visible test and not the hidden one
    cells["ex3-solution"].source = cells["ex3-solution"].source.replace(
        next(ln for ln in cells["ex3-solution"].source.splitlines() if "NotImplementedError"
             in ln), "    return 1500.0")
    (tmp_path / "class" / "ann").mkdir(parents=True)
    nbformat.write(released, tmp_path / "class" / "ann" / UNIT0)
    subprocess.run([sys.executable, "-m", "course_utils.cli", "grade", str(tmp_path / "class"),
                    "--course", str(course), "--no-sandbox"], cwd=copy, env=_env(copy),
                   check=True, capture_output=True, timeout=400)
    grades = json.loads((course / "grades.json").read_text())
    (ann,) = grades["students"]
    got = {q["question"]: q for nb in ann["notebooks"] for q in nb["questions"]}
    assert got["ex3-test"]["max_score"] == 1 and got["ex3-test"]["score"] == 0, got["ex3-test"]
    assert "ring_bytes_per_rank(900, 3)" in got["ex3-test"]["reason"], got["ex3-test"]
