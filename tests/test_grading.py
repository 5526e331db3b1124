"""The in-memory student version (nbgrader's ClearSolutions) used by the mutation tests.

That every graded test fails on the student version is checked on the real release, the
notebook a learner gets, in ``test_instructor_release.py``; that it passes on the source is
nbval's job."""

from __future__ import annotations

from course_utils.assignments.lessons import read, source_notebooks
from course_utils.instructor.graded_tests import graded_test_ids, student_version

NOTEBOOKS = [p for p in source_notebooks() if graded_test_ids(read(p))]


def test_student_version_replaces_solutions_with_a_stub():
    nb = student_version(read(NOTEBOOKS[0]))
    text = "\n".join(c.source for c in nb.cells)
    assert "### BEGIN SOLUTION" not in text and "raise NotImplementedError()" in text
    assert "### BEGIN HIDDEN TESTS" in text  # autograding keeps hidden tests


def test_test_and_solution_cells_are_told_apart_by_their_nbgrader_metadata():
    from course_utils.notebook_cells import is_solution_cell, is_test_cell

    test = {"metadata": {"nbgrader": {"grade": True, "solution": False, "points": 1}}}
    answer = {"metadata": {"nbgrader": {"grade": True, "solution": True}}}
    exercise = {"metadata": {"nbgrader": {"grade": False, "solution": True}}}
    plain = {"metadata": {}}
    assert [is_test_cell(c) for c in (test, answer, exercise, plain)] == [1, 0, 0, 0]
    assert [is_solution_cell(c) for c in (test, answer, exercise, plain)] == [0, 1, 1, 0]
