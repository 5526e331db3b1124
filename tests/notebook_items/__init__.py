"""A pytest plugin that adds items of its own to nbval's run of each notebook, in nbval's kernel
for that notebook (``conftest.py`` loads it; ``docs/testing.md`` shows how to run its items).

**The mistakes catalogue** (:mod:`.catalogue`, entries in :mod:`.entries`): each typical learner
mistake (``tests/mistakes/u*.py``, format in ``tests/mistakes/README.md``), planted in its
solution cell, must fail the graded test aimed at it, with a message naming the fix, within
``WITHIN_S`` seconds (where it took longer: within 1.5 times the right answer's run, timed
then), while no earlier graded test fails. The same kernel also runs **the
student version of every exercise** (``stub_NN_<grade_id>``): the released stub in place of the
solution, then the released (visible only) tests of its exercise, each of which must fail with
a message; what the solution had bound is removed first, so a stub's test cannot pass on its
leftovers. The untouched release, run whole, is graded in ``test_instructor_grade.py``.

**Mutants of the solutions** (:mod:`.mutants`, made by ``tools/mutation``): a slip a learner
might make, planted in place of the solution; its exercise's visible tests must fail on it
(``COURSE_MUTANTS_PER_EXERCISE`` and ``COURSE_MUTANTS_PER_RUN`` say how many run; ``make
mutants`` runs all).

**Re-runs** (:mod:`.rerun`): three notebooks run again in the same kernel, as a learner
re-runs them (set-up and teardown are idempotent).

How items are placed and paired, by the notebooks' metadata only:

* a catalogue item goes just before nbval's item for the solution cell it replaces (a mistake's
  ``GRADE_ID``; a stub's solution cell), so the cells before it have just run, in their original
  form, as nbval's own items: each notebook runs once for nbval and the catalogue together;
* a stub's tests are the test cells (nbgrader ``grade`` and not ``solution``) after it whose
  ``metadata.course.exercise`` is its own (:func:`course_utils.notebook_cells.exercise_cells`);
* the teardown is the cell marked ``metadata.course.teardown``: the catalogue never runs it,
  and a re-run plan runs it last.

From nbval the plugin uses what it hands to items: ``IPyNbCell.cell`` and ``.parent`` (the
``IPyNbFile``, whose ``nb`` and ``kernel`` it shares) and the kernel's ``execute_cell_input``,
``await_reply`` and ``get_message``. After a mistake a probe checks the ranks' process group;
if the mistake left it unusable, the engines are restarted and the cells before it run again
(:meth:`.kernel.Walk.make_clean`). A ``-k`` subset works: an item first runs, in their original
form, the cells before it that nbval did not run. ``tests/test_mistakes.py`` checks the
catalogue's files without a kernel; ``tests/test_rerun.py`` the re-run plans.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from . import rerun
from .catalogue import CatalogueItem, entry_id
from .entries import ENTRIES, cell_order
from .kernel import cell_index, walk_of
from .mutants import drawn, selection


def pytest_report_header(config) -> str:
    sel = selection()
    return (f"mutants of the solutions: {sel.per_exercise} per exercise and {sel.per_run} in "
            f"all, seed {sel.seed} (COURSE_MUTANTS_PER_EXERCISE, COURSE_MUTANTS_PER_RUN, "
            "COURSE_MUTANTS_SEED)")


@pytest.hookimpl(tryfirst=True)  # before -k and -m deselect: the items can be selected
def pytest_collection_modifyitems(session, config, items) -> None:
    """Each catalogue entry just before nbval's item for the solution cell it replaces; each
    re-run beside its notebook's teardown item."""
    from nbval.plugin import IPyNbCell

    if not any(isinstance(it, IPyNbCell) for it in items):
        return
    at: dict[tuple[str, int], list] = {}
    sel = selection()
    for entry in [*ENTRIES, *(drawn(sel.per_exercise, sel.seed, sel.per_run) if sel.any else [])]:
        name, index = (cell_order(entry)[:2] if isinstance(entry, Path)
                       else (entry.notebook, entry.at))
        at.setdefault((name, index), []).append(entry)
    placed = []
    for item in items:
        if isinstance(item, IPyNbCell):
            index = cell_index(item)
            for entry in at.get((item.parent.path.name, index), []):
                placed.append(CatalogueItem.from_parent(item.parent, name=entry_id(entry),
                                                        entry=entry, at=index))
        placed.append(item)
    rerun.place(placed)
    items[:] = placed


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """nbval ran one of a notebook's cells: the catalogue's items after it need not."""
    outcome = yield
    from nbval.plugin import IPyNbCell

    if isinstance(item, IPyNbCell):
        walk = walk_of(item.parent)
        index = cell_index(item)
        error = outcome.excinfo
        if error and issubclass(error[0], pytest.skip.Exception):
            return
        walk.ran(index, [failure_line(error[1])] if error else [])


def failure_line(exc: BaseException) -> str:
    """What a failed cell raised, in one line: nbval's ``NbCellError`` says only "Cell
    execution caused an exception"; the last line of the kernel's traceback names the cause
    (seen in a CI log, which keeps a test's short line when it cuts the rest)."""
    tb = re.sub(r"\x1b\[[0-9;]*m", "", getattr(exc, "inner_traceback", None) or "")
    last = [ln.strip() for ln in tb.splitlines() if ln.strip()]
    return (last[-1] if last else f"{type(exc).__name__}: {exc}")[:300]
