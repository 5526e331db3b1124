"""Checks that the graded tests bite: the graded test ids of a notebook, the student version
in memory, a learner's mistake planted in a solution region.

The student version is made with nbgrader's own ``ClearSolutions`` preprocessor (what
``nbgrader generate_assignment`` runs). ``tests/notebook_items`` (the mistakes catalogue, a
pytest plugin run inside nbval's run of each notebook) plants each exercise's stub, and each
catalogued mistake, in the solved notebook and checks that the exercise's graded tests fail:
the "tests can fail" guarantee.
"""

from __future__ import annotations

import copy
import re

from nbformat import NotebookNode

from ..notebook_cells import is_test_cell, nbgrader_meta


def graded_test_ids(nb: NotebookNode) -> list[str]:
    return [nbgrader_meta(c)["grade_id"] for c in nb.cells if is_test_cell(c)]


def student_version(nb: NotebookNode) -> NotebookNode:
    """The notebook as students get it: solution regions replaced by nbgrader's stub.

    Hidden tests stay in, as they do when nbgrader autogrades a submission.
    """
    from nbgrader.preprocessors import ClearSolutions

    nb = copy.deepcopy(nb)
    nb, _ = ClearSolutions(enforce_metadata=True).preprocess(nb, {})
    return nb


def _regions(nb: NotebookNode, grade_id: str) -> tuple[NotebookNode, list[re.Match[str]]]:
    for cell in nb.cells:
        if nbgrader_meta(cell).get("grade_id") == grade_id:
            return cell, list(re.finditer(r"( *)### BEGIN SOLUTION\n(.*?)( *)### END SOLUTION\n?",
                                          cell.source, re.S))
    raise KeyError(f"the notebook has no cell with grade_id {grade_id!r}")


def solution_region(nb: NotebookNode, grade_id: str, region: int = 0) -> str:
    """The code of solution region ``region`` of cell ``grade_id``, dedented to the region's
    ``### BEGIN SOLUTION`` line: what :func:`with_solution` replaces."""
    _, found = _regions(nb, grade_id)
    if len(found) <= region:
        raise ValueError(f"cell {grade_id!r} has no solution region {region}")
    indent = len(found[region].group(1))
    return "\n".join(ln[indent:] if ln[:indent].strip() == "" else ln
                     for ln in found[region].group(2).rstrip("\n").splitlines())


def with_solution(nb: NotebookNode, grade_id: str, body: str, region: int = 0
                  ) -> NotebookNode:
    """``nb`` with solution region number ``region`` (0: the first) of cell ``grade_id``
    replaced by ``body`` (indented to match). Tests use it to plant a learner's typical
    mistake and check a graded test fails."""
    cell, found = _regions(nb, grade_id)
    if len(found) <= region:
        raise ValueError(f"cell {grade_id!r} has no solution region {region}")
    m = found[region]
    lines = [m.group(1) + ln if ln else ln for ln in body.strip("\n").splitlines()]
    cell.source = cell.source[: m.start()] + "\n".join(lines) + "\n" + cell.source[m.end():]
    return nb
