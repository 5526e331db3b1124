"""``course release``: an nbgrader course folder whose student versions leak nothing, whose stubs
say what to do, and whose every graded test really fails when executed."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from course_utils.assignments.release import (
    FOLDERS,
    ReleaseError,
    assignment_id,
    bare_asserts,
    leaked_lines,
    lesson_notebooks,
    read_nb,
    release,
    secret_lines,
    stub_hint,
    unit_of,
)
from course_utils.instructor.graded_tests import graded_test_ids
from course_utils.notebook_cells import nbgrader_meta

UNITS = lesson_notebooks()
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    return release(tmp_path_factory.mktemp("course") / "course")


def test_unit_and_assignment_names():
    assert unit_of("03_pytorch_ddp.ipynb") == 3 and assignment_id("10_x.ipynb") == "unit10"
    with pytest.raises(ReleaseError, match="unit number"):
        unit_of("intro.ipynb")
    with pytest.raises(ReleaseError, match="choose from"):
        lesson_notebooks([99])


def test_release_is_an_nbgrader_course_folder(course):
    from nbgrader.api import Gradebook

    root = course.root
    assert all((root / f).is_dir() for f in FOLDERS)
    assert (root / "nbgrader_config.py").exists()
    assert [u.unit for u in course.units] == [unit_of(p) for p in UNITS]
    for u in course.units:
        assert u.release == root / "release" / u.assignment / u.source.name and u.release.exists()
        assert u.source.read_bytes() == (ROOT / "notebooks" / u.source.name).read_bytes()
        assert u.tests and u.points > 0, f"{u.assignment} has no graded test"
    # The instructor notes beside the units (notebooks/instructor_notes/) are not handed out.
    notes = {p.name for p in (ROOT / "notebooks" / "instructor_notes").glob("*.md")}
    handed = [p for p in root.rglob("*") if "instructor_notes" in p.parts or p.name in notes]
    assert notes and not handed, handed
    with Gradebook(f"sqlite:///{root}/gradebook.db", "dist-training") as gb:
        assert sorted(a.name for a in gb.assignments) == sorted(u.assignment for u in course.units)
        for u in course.units:
            nb = gb.find_notebook(u.source.stem, u.assignment)
            assert {c.name: c.max_score for c in nb.grade_cells} == {**u.tests, **u.answers}


@pytest.mark.parametrize("path", UNITS, ids=[p.name for p in UNITS])
def test_no_solution_or_hidden_test_survives(course, path):
    u = next(u for u in course.units if u.source.name == path.name)
    source, released = read_nb(u.source), read_nb(u.release)
    secrets = secret_lines(source)
    assert len(secrets) >= 3, "the check has nothing to look for: solution regions empty?"
    assert leaked_lines(source, released) == []
    for cell in released.cells:
        assert not cell.get("outputs"), "outputs must be cleared"
        m = nbgrader_meta(cell)
        if m.get("locked") or m.get("grade"):
            assert m.get("checksum"), f"{m['grade_id']} has no nbgrader checksum"
        if m.get("solution") and cell.cell_type == "code":
            assert re.search(r"raise NotImplementedError\(['\"]\w", cell.source), cell.source
            assert "replace this line with your code" in cell.source
        elif m.get("solution"):  # a written answer, graded by hand
            assert cell.source.strip() == "YOUR ANSWER HERE", cell.source
    assert graded_test_ids(released) == graded_test_ids(source)


def test_leak_check_catches_a_solution_line_outside_its_region(course):
    u = course.units[0]
    source, released = read_nb(u.source), read_nb(u.release)
    planted = copy.deepcopy(released)
    secret = secret_lines(source)[0]
    lesson = next(c for c in planted.cells if c.cell_type == "code")
    lesson.source += "\n" + secret  # a solution line copied into a lesson cell
    assert secret in leaked_lines(source, planted)
    with_output = copy.deepcopy(released)
    next(c for c in with_output.cells if c.cell_type == "code").outputs = [
        nbformat.v4.new_output("stream", text=f"  {secret}\n")]
    assert secret in leaked_lines(source, with_output)


def test_stub_hint_names_the_exercise():
    msg = stub_hint("Exercise 2 — wrap the model in DDP (3 points)", "ex2-solution")
    assert msg.startswith("Exercise 2 — wrap the model in DDP: replace this line")
    assert stub_hint("", "ex9-solution").startswith("ex9-solution:")


def test_nbgrader_itself_runs_from_the_course_folder(course):
    """An instructor who uses nbgrader directly gets the same pipeline (config file loads)."""
    proc = subprocess.run([sys.executable, "-m", "nbgrader", "generate_assignment", "unit0",
                           "--force"], cwd=course.root, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    stub = next(c for c in read_nb(course.root / "release" / "unit0" / UNITS[0].name).cells
                if nbgrader_meta(c).get("solution"))
    assert "raise NotImplementedError('" in stub.source  # our StubHints ran inside nbgrader


def test_bare_asserts_are_found():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "%%px\nassert x == 1\nassert y, 'y'\n### BEGIN HIDDEN TESTS\nassert z\n"
        "### END HIDDEN TESTS\n", metadata={"nbgrader": {"grade": True, "grade_id": "t",
                                                          "points": 1, "solution": False}})])
    assert bare_asserts(nb) == [("t", 2, "assert x == 1", False), ("t", 5, "assert z", True)]


def test_visible_tests_say_what_was_expected():
    """Learner feedback: no visible graded assert without a message (hidden ones are listed in
    the instructor's report, not enforced)."""
    bare = [(p.name, gid, line) for p in UNITS for gid, _, line, hidden in bare_asserts(read_nb(p))
            if not hidden]
    assert not bare, f"visible test asserts without a message (say what was expected): {bare}"


def test_the_release_hands_out_exactly_the_visible_tests(course):
    """Each unit's student version has its graded test cells, in order, and nothing else graded.
    That each of them fails on the student version, executed, is checked exercise by exercise
    in ``tests/notebook_items`` (``stub_*``); unit 0's untouched release is graded whole in
    ``test_instructor_grade.py``."""
    for u in course.units:
        assert graded_test_ids(read_nb(u.release)) == list(u.tests), u.source.name


def test_course_commands_are_thin_faces(tmp_path, capsys):
    """`course release/grade/feedback/slides` call the library; errors end with a Fix line."""
    from course_utils.cli import main

    assert main(["release", str(tmp_path / "c"), "--unit", "0"]) == 0
    assert "unit0" in capsys.readouterr().out
    assert (tmp_path / "c" / "release" / "unit0" / UNITS[0].name).exists()
    assert main(["slides", "--unit", "0", "--out", str(tmp_path / "decks")]) == 0
    assert (tmp_path / "decks" / f"{UNITS[0].stem}.slides.html").exists()
    (tmp_path / "class" / "nobody").mkdir(parents=True)
    assert main(["grade", str(tmp_path / "class"), "--course", str(tmp_path / "c"),
                 "--no-sandbox"]) == 1
    assert main(["feedback", str(tmp_path / "c")]) == 1
    assert main(["release", str(tmp_path / "d"), "--unit", "99"]) == 1
    err = capsys.readouterr().err
    assert "no submitted notebooks" in err and "nothing autograded" in err
    assert "no notebook for unit(s) [99]" in err and err.count("Fix: ") == 3


def test_course_grade_sandboxes_by_default_where_bubblewrap_is(monkeypatch, capsys):
    import shutil

    from course_utils.instructor.commands import _sandbox_choice

    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/bwrap")
    assert _sandbox_choice(None) is True and _sandbox_choice(False) is False
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert _sandbox_choice(None) is False and _sandbox_choice(True) is True
    err = capsys.readouterr().err
    assert "not sandboxed" in err and "apt-get install bubblewrap" in err


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    from course_utils.assignments.release import ENV_CACHE, cache_dir

    monkeypatch.setenv(ENV_CACHE, str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"
    monkeypatch.delenv(ENV_CACHE)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cache_dir() == tmp_path / "x" / "dist-training-course"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == Path.home() / ".cache" / "dist-training-course"


def test_a_config_written_before_the_set_up_moved_is_pointed_at_its_new_module(tmp_path):
    from course_utils.assignments.release import update_config, write_config

    path = write_config(tmp_path)
    new = path.read_text()
    old = new.replace("course_utils.assignments import", "course_utils.instructor import")
    path.write_text(old + "# the instructor's own line\n")
    update_config(tmp_path)
    assert path.read_text() == new + "# the instructor's own line\n"
