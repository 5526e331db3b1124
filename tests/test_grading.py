"""Every exercise test fails on the student version (solutions cleared by nbgrader's own
ClearSolutions) and passes on the source notebook (the latter is nbval's job)."""

from __future__ import annotations

import pytest

from course_utils.instructor.grading import (
    execute_until_last_test,
    grade_outcomes,
    graded_test_ids,
    read,
    source_notebooks,
    student_version,
)

NOTEBOOKS = [p for p in source_notebooks() if graded_test_ids(read(p))]


def test_student_version_replaces_solutions_with_a_stub():
    nb = student_version(read(NOTEBOOKS[0]))
    text = "\n".join(c.source for c in nb.cells)
    assert "### BEGIN SOLUTION" not in text and "raise NotImplementedError()" in text
    assert "### BEGIN HIDDEN TESTS" in text  # autograding keeps hidden tests


@pytest.mark.cluster
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_every_exercise_test_fails_on_the_student_version(path):
    executed = execute_until_last_test(student_version(read(path)))
    outcomes = grade_outcomes(executed)
    assert [o.grade_id for o in outcomes] == graded_test_ids(read(path))
    passed = [o.grade_id for o in outcomes if not o.failed]
    assert not passed, f"these tests pass without a solution: {passed}"
