"""The catalogue's items: a mistake or a stub, run in its notebook's nbval kernel just before
nbval's item for the solution cell it replaces (:mod:`tests.notebook_items` places them)."""

from __future__ import annotations

import ast
import copy
from pathlib import Path

import pytest

from course_utils.instructor.graded_tests import with_solution
from course_utils.notebook_cells import is_teardown, is_test_cell, nbgrader_meta

from .entries import Stub, index_of, load
from .kernel import Walk, walk_of
from .mutants import MutantEntry, record, run_mutant


class CatalogueItem(pytest.Item):
    """A catalogued mistake, an exercise's stub or a mutant of its solution, run in its
    notebook's nbval kernel."""

    def __init__(self, *, entry, at: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.entry, self.at = entry, at

    def runtest(self) -> None:
        walk = walk_of(self.parent)
        entry, at = self.entry, self.at
        walk.run_original(at)  # the cells before it that nbval did not run (a restart, -k)
        before = walk.group_state()
        try:
            if isinstance(entry, Stub):
                stub_fails_its_tests(entry, walk)
            elif isinstance(entry, MutantEntry):
                outcome = mutant_is_killed(entry, walk)
            else:
                mistake_fails_its_test(entry, walk)
        finally:  # a mutant may leave TF servers, on ports the original cells then want
            damaged = walk.make_clean(before, at, renew=isinstance(
                entry, MutantEntry) and walk.engines_hold_tensorflow())
        if isinstance(entry, MutantEntry):
            outcome["damaged"] = damaged
            record(outcome)
            assert outcome["status"] in ("killed", "equivalent"), (
                f"{entry.mutant.id}: {outcome['status']} (a gap in the visible tests of "
                f"{entry.stub.grade_id}, or an equivalent mutant to list in "
                "tests/mistakes/equivalent_mutants.toml with why)")
            assert not damaged, (f"{entry.mutant.id}: after its visible test failed, the ranks' "
                                 "process group no longer answered")

    def reportinfo(self):
        return self.path, None, f"{self.parent.path.name}::{self.name}"


def entry_id(entry) -> str:
    return entry.stem if isinstance(entry, Path) else entry.id


def bound_names(source: str) -> tuple[str, list[str]]:
    """The cell's magic line (``%%px ...`` or "") and the names its code binds at top level or
    declares ``global`` in a function: what the stub must not find left over from the solution."""
    magic, _, code = source.partition("\n") if source.startswith("%%") else ("", "", source)
    if magic and not magic.startswith("%%px"):
        return magic, []  # e.g. %%writefile: the cell is a file, not code run here
    tree = ast.parse(code)
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            continue  # a module left over is no answer, and earlier cells may import it too
        else:
            names.update(n.id for n in ast.walk(node)
                         if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))
    names.update(g for n in ast.walk(tree) if isinstance(n, ast.Global) for g in n.names)
    return magic, sorted(names)


def forget_solution(session: Walk, at: int) -> None:
    """Remove what solution cell ``at`` binds, where it ran (kernel or engines): a stub's or a
    mutant's tests must not pass on the solution's leftovers."""
    magic, names = bound_names(session.nb.cells[at].source)
    if names:
        from nbformat.v4 import new_code_cell

        forget = f"for _n in {names!r}:\n    globals().pop(_n, None)\n"
        errs, _ = session.execute(new_code_cell(f"{magic}\n{forget}" if magic else forget))
        assert not errs, f"could not remove the solution's names {names}: {errs}"


def mutant_is_killed(entry: MutantEntry, session: Walk) -> dict:
    """The mutant in place of the solution, then its exercise's visible tests: the outcome
    (:func:`.mutants.run_mutant`), printed with the change."""
    assert not session.failed_tests, (
        f"graded tests failed before {entry.stub.grade_id}: {session.failed_tests}")
    forget_solution(session, entry.at)
    outcome = run_mutant(entry, session)
    print(f"{entry.mutant.id}: {outcome['status']} in {outcome['seconds']} s"
          + (f" by {outcome['test']}: {outcome['message']}" if outcome["test"] else ""))
    return outcome


def stub_fails_its_tests(stub: Stub, session: Walk) -> None:
    """The released stub and visible tests in place of the solution: each test must fail, with
    a message."""
    release = session.released()
    assert not session.failed_tests, (
        f"graded tests failed before {stub.grade_id}: {session.failed_tests}; cell errors: "
        f"{session.errors}")
    handed_out = {nbgrader_meta(c).get("grade_id"): c for c in release.cells
                  if nbgrader_meta(c).get("grade_id")}
    forget_solution(session, stub.at)
    last = max(i for i, c in enumerate(session.nb.cells)
               if nbgrader_meta(c).get("grade_id") in stub.tests) if stub.tests else stub.at
    outcome = {}
    for i in range(stub.at, last + 1):
        cell = session.nb.cells[i]
        gid = nbgrader_meta(cell).get("grade_id", "")
        if cell.cell_type != "code" or is_teardown(cell):
            continue
        cell = handed_out.get(gid, cell) if gid else cell  # the stub, the visible tests
        errs, _ = session.execute(cell)
        if gid in stub.tests:
            outcome[gid] = errs
    print(f"{stub.id}: " + "; ".join(f"{t}: {e[0][:120] if e else 'PASSED'}"
                                     for t, e in outcome.items()))
    passed = [t for t, e in outcome.items() if not e]
    assert not passed, f"{stub.id}: these tests pass on the student version: {passed}"
    empty = [t for t, e in outcome.items() if not e[0].split(":", 1)[-1].strip()]
    assert not empty, f"{stub.id}: these tests fail with no message on the student version: {empty}"


def mistake_fails_its_test(path: Path, session: Walk) -> None:
    """The mistake planted: its test fails, naming the fix, within ``WITHIN_S`` (or, on a
    machine slow enough that it took longer, within :data:`SLOWER` times the right answer's
    run); no earlier graded test fails."""
    mod = load(path)
    mutated = with_solution(copy.deepcopy(session.nb), mod.GRADE_ID, mod.BODY,
                            getattr(mod, "REGION", 0))
    s, f = index_of(mutated, mod.GRADE_ID), index_of(mutated, mod.FAILS)
    assert not session.failed_tests, (
        f"graded tests failed before the mistake: {session.failed_tests}; cell errors: "
        f"{session.errors}")

    earlier_failed, result, seconds = [], [], 0.0
    for i in range(s, f + 1):
        cell = mutated.cells[i]
        if cell.cell_type != "code":
            continue
        errs, secs = session.execute(cell)
        if i == f:
            result, seconds = errs, secs
        elif errs and is_test_cell(cell):
            earlier_failed.append(f"{nbgrader_meta(cell)['grade_id']}: {errs[0][:300]}")
        elif errs:  # Run All stops here: the learner reads the error, then runs the next cell
            session.wait_until_idle()
    print(f"{path.stem}: {mod.FAILS} failed after {seconds:.1f} s: "
          f"{result[0] if result else 'did not fail'}")
    assert not earlier_failed, f"{path.stem}: earlier graded tests failed: {earlier_failed}"
    assert result, f"{path.stem}: {mod.FAILS} passed with the mistake planted"
    assert mod.MESSAGE in result[0], (
        f"{path.stem}: {mod.FAILS} failed without naming the fix {mod.MESSAGE!r}: {result[0]}")
    if seconds > mod.WITHIN_S:  # a slow failure, or a slow machine: time the right answer here
        passing = passing_seconds(session, s, f)
        assert seconds <= SLOWER * passing, (
            f"{path.stem}: {mod.FAILS} took {seconds:.1f} s to fail: over {mod.WITHIN_S} s, and "
            f"over {SLOWER}x the {passing:.1f} s it takes to pass on this machine now")


#: How much longer than the right answer's run a mistake's failing test may take, where it
#: took longer than the entry's ``WITHIN_S`` (on a loaded machine every run is slower).
SLOWER = 1.5


def passing_seconds(session: Walk, s: int, f: int) -> float:
    """The seconds the original test cell ``f`` takes to pass now, after the original cells
    ``s`` (the solution) up to it."""
    seconds = 0.0
    for i in range(s, f + 1):
        cell = session.nb.cells[i]
        if cell.cell_type == "code":
            errs, seconds = session.execute(cell)
            assert not (errs and is_test_cell(cell)), f"the original failed its test: {errs}"
    return seconds
