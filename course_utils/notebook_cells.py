"""Cells of a notebook by their nbgrader metadata or id: one place for the look-ups that
grading, the release, the slides, the learner's home page and the lessons' helpers share.
Works on nbformat nodes and on plain ``json.load`` dicts alike (standard library only)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def nbgrader_meta(cell: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the cell's nbgrader metadata ({} when it has none)."""
    return dict(cell.get("metadata", {}).get("nbgrader", {}))


def grade_id(cell: Mapping[str, Any]) -> str:
    """The cell's nbgrader ``grade_id`` ("" when it has none)."""
    return str(nbgrader_meta(cell).get("grade_id", "") or "")


def is_test_cell(cell: Mapping[str, Any]) -> bool:
    """An nbgrader autograded test: graded, and not a solution (an answer cell)."""
    m = nbgrader_meta(cell)
    return bool(m.get("grade")) and not m.get("solution")


def is_solution_cell(cell: Mapping[str, Any]) -> bool:
    """A cell the learner writes in (nbgrader ``solution``)."""
    return bool(nbgrader_meta(cell).get("solution"))


def source_text(cell: Mapping[str, Any]) -> str:
    """The cell's source as one string (a saved notebook may store it as a list of lines)."""
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def find_cell(cells: Iterable[Mapping[str, Any]], key: str,
              cell_type: str | None = None) -> Mapping[str, Any] | None:
    """The first cell whose ``grade_id`` or cell ``id`` is ``key`` (of ``cell_type`` if given),
    None if there is none."""
    for cell in cells:
        if cell_type and cell.get("cell_type") != cell_type:
            continue
        if key and key in (grade_id(cell), cell.get("id")):
            return cell
    return None


def without_px(source: str) -> str:
    """``source`` without its ``%%px`` line(s): the Python a ``%%px`` cell runs on the engines."""
    return "\n".join(ln for ln in source.splitlines() if not ln.startswith("%%px"))


# The course's own cell metadata, beside nbgrader's: nbgrader says which cell is an answer
# (``solution``) and which a test (``grade``) but has no field tying a test to its answer, so
# ``metadata.course.exercise`` names the exercise each of them belongs to, and
# ``metadata.course.teardown`` marks the cell that stops what the notebook started.
# nbgrader copies both into the release untouched. docs/authoring.md shows them.

def course_meta(cell: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the cell's ``metadata.course`` ({} when it has none)."""
    return dict(cell.get("metadata", {}).get("course", {}))


def exercise(cell: Mapping[str, Any]) -> str:
    """The exercise a solution or test cell belongs to (``metadata.course.exercise``; "" for
    any other cell)."""
    return str(course_meta(cell).get("exercise", "") or "")


def is_teardown(cell: Mapping[str, Any]) -> bool:
    """The notebook's teardown cell (``metadata.course.teardown``): re-runs and the catalogue
    leave it to nbval, and the slides skip it."""
    return cell.get("cell_type") == "code" and bool(course_meta(cell).get("teardown"))


def exercise_cells(cells: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, list[int]]]:
    """``{"ex1": {"solution": [code cell indices], "tests": [cell indices]}}``, in notebook
    order, paired by ``metadata.course.exercise``."""
    out: dict[str, dict[str, list[int]]] = {}
    for i, cell in enumerate(cells):
        name = exercise(cell)
        if not name:
            continue
        if is_solution_cell(cell) and cell.get("cell_type") == "code":
            out.setdefault(name, {"solution": [], "tests": []})["solution"].append(i)
        elif is_test_cell(cell):
            out.setdefault(name, {"solution": [], "tests": []})["tests"].append(i)
    return out
