"""The mistakes catalogue's files, checked without a kernel. The catalogue itself runs inside
nbval's run of each notebook (:mod:`tests.notebook_items`, a plugin loaded by ``conftest.py``):
``pytest notebooks/04_tf_classic_ps.ipynb -k u04_loss_on_ps`` runs one mistake."""

from __future__ import annotations

import copy

from course_utils.assignments.lessons import NOTEBOOK_DIR, read
from course_utils.instructor.graded_tests import with_solution
from course_utils.notebook_cells import is_test_cell, nbgrader_meta
from tests.notebook_items.entries import ENTRIES, MISTAKES, STUBS, Stub, cell_order, index_of, load


def test_every_graded_test_is_run_on_a_student_version():
    """Each graded test of every lesson follows the stub of its exercise in ``STUBS``."""
    assert STUBS
    for name in sorted({st.notebook for st in STUBS}):
        tested = {t for st in STUBS if st.notebook == name for t in st.tests}
        tests = [nbgrader_meta(c)["grade_id"] for c in read(NOTEBOOK_DIR / name).cells
                 if is_test_cell(c)]
        assert tests and set(tests) <= tested, (
            f"{name}: tests no stub runs: {sorted(set(tests) - tested)}")
    assert all(st.tests for st in STUBS), [st.id for st in STUBS if not st.tests]


def test_catalogue_files_are_well_formed():
    assert MISTAKES, "no mistakes in tests/mistakes/"
    for path in MISTAKES:
        mod = load(path)
        nb = read(NOTEBOOK_DIR / mod.NOTEBOOK)
        s, f = index_of(nb, mod.GRADE_ID), index_of(nb, mod.FAILS)
        assert s < f and is_test_cell(nb.cells[f]), f"{path.name}: FAILS must be a later test"
        with_solution(copy.deepcopy(nb), mod.GRADE_ID, mod.BODY,
                      getattr(mod, "REGION", 0))  # the region exists


def test_every_entry_sits_at_a_solution_cell_of_a_lesson():
    """Each mistake and stub is placed before nbval's item for its solution cell."""
    for entry in ENTRIES:
        name, at = (entry.notebook, entry.at) if isinstance(entry, Stub) else cell_order(entry)[:2]
        cells = read(NOTEBOOK_DIR / name).cells
        assert 0 <= at < len(cells) and cells[at].cell_type == "code", (name, at)
        assert nbgrader_meta(cells[at]).get("solution"), f"{name} cell {at} is not a solution"
