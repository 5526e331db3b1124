"""Every committed notebook: outputs stripped, the course skeleton, valid nbgrader metadata."""

from __future__ import annotations

import re

import nbformat
import pytest

from course_utils.assignments.lessons import read, source_notebooks
from course_utils.notebook_cells import (
    exercise,
    exercise_cells,
    is_solution_cell,
    is_teardown,
    is_test_cell,
    nbgrader_meta,
)

NOTEBOOKS = source_notebooks()
IDS = [p.name for p in NOTEBOOKS]


def test_there_are_notebooks():
    assert NOTEBOOKS and NOTEBOOKS[0].name.startswith("00_")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_outputs_are_stripped(path):
    nb = read(path)
    nbformat.validate(nb)
    dirty = [i for i, c in enumerate(nb.cells)
             if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count"))]
    assert not dirty, f"{path.name}: cells {dirty} carry outputs; strip them before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_skeleton(path):
    nb = read(path)
    first = nb.cells[0].source
    assert first.startswith("# "), "the first cell is the title"
    assert re.search(r"\*\*Time:\*\*", first), "state a time estimate in the first cell"
    assert "you can" in first.lower(), "list objectives in the first cell"
    headings = [c.source.splitlines()[0] for c in nb.cells if c.cell_type == "markdown"]
    assert any(h.startswith("## Setup") for h in headings), "a Setup section"
    assert any(h.startswith("## Exercise") for h in headings), "at least one exercise"
    assert headings[-1].startswith("## Summary"), "the last cell is the Summary"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_nbgrader_metadata(path):
    nb = read(path)
    ids = [nbgrader_meta(c)["grade_id"] for c in nb.cells if nbgrader_meta(c)]
    assert len(ids) == len(set(ids)), "grade_id values must be unique"
    tests = [c for c in nb.cells if is_test_cell(c)]
    solutions = [c for c in nb.cells if is_solution_cell(c)]
    assert tests and solutions, "every unit has graded exercises"
    for c in tests:
        meta = nbgrader_meta(c)
        assert meta.get("points", 0) > 0 and meta.get("locked"), meta["grade_id"]
        assert "assert" in c.source, f"{meta['grade_id']} asserts nothing"
    for c in solutions:
        assert "### BEGIN SOLUTION" in c.source and "### END SOLUTION" in c.source, (
            nbgrader_meta(c)["grade_id"])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_every_test_and_solution_names_its_exercise_and_each_test_follows_a_solution(path):
    """``metadata.course.exercise`` pairs tests with solutions (the catalogue's stubs, the
    learner's ``course solution``); one teardown, marked, is the last code cell."""
    cells = read(path).cells
    unnamed = [nbgrader_meta(c)["grade_id"] for c in cells
               if (is_solution_cell(c) or is_test_cell(c)) and not exercise(c)]
    assert not unnamed, f"{path.name}: give these cells metadata.course.exercise: {unnamed}"
    for name, found in exercise_cells(cells).items():
        assert found["solution"] and found["tests"], f"{path.name}: {name} lacks a solution or test"
        assert found["solution"][0] < found["tests"][0], f"{path.name}: {name}'s test comes first"
    code = [c for c in cells if c.cell_type == "code"]
    assert is_teardown(code[-1]) and not any(is_teardown(c) for c in code[:-1]), (
        f"{path.name}: mark the last code cell, and only it, metadata.course.teardown")


def _names_a_learner_must_write(source: str) -> set[str]:
    """The top-level names a solution cell's solution region defines (assigned, or a def or
    class): what the tests after it read, so what the text must tell the learner to write."""
    import ast

    body = re.search(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", source, re.S)
    if not body:
        return set()
    lines = [ln for ln in source.splitlines() if not ln.startswith("%%")]
    tree = ast.parse("\n".join(lines))
    start = source[: body.start()].count("\n") - sum(ln.startswith("%%") for ln in
                                                     source[: body.start()].splitlines()) + 1
    end = start + body.group(1).count("\n")
    names: set[str] = set()
    for node in tree.body:
        if not start <= node.lineno <= end + 1:
            continue  # given lines around the region, and what the region does inside a def
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        for target in getattr(node, "targets", []) + [getattr(node, "target", None)]:
            if isinstance(target, ast.Name) and target.id.isupper():
                names.add(target.id)   # module-level constants a test reads (PREDICTED_...)
    return names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_every_graded_cells_names_are_in_the_text_before_it(path):
    """A learner sees only the text and the stub: every name a solution defines at top level and
    the tests read must be named (`like_this`) in the cells before it."""
    nb = read(path)
    missing = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or not is_solution_cell(cell):
            continue
        before = "\n".join(c.source for c in nb.cells[:i]) + "\n" + re.sub(
            r"### BEGIN SOLUTION\n.*?### END SOLUTION", "", cell.source, flags=re.S)
        for name in sorted(_names_a_learner_must_write(cell.source)):
            if not re.search(rf"`[^`]*\b{re.escape(name)}\b[^`]*`|\b{re.escape(name)}\(", before):
                missing.append(f"{nbgrader_meta(cell).get('grade_id')}: {name}")
    assert not missing, f"{path.name}: names the text never gives the learner: {missing}"
