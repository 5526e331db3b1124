"""The mistakes catalogue (``tests/mistakes/u*.py``, format in ``tests/mistakes/README.md``),
run inside nbval's run of each notebook: each typical learner mistake, planted in its solution
cell, must fail the graded test aimed at it, with a message naming the fix, within ``WITHIN_S``
seconds, while no earlier graded test fails.

Each mistake is a pytest item of its notebook
(``notebooks/04_tf_classic_ps.ipynb::u04_loss_on_ps``), placed just before nbval's item for the
solution cell it replaces, and it runs in nbval's kernel for that notebook: the cells before it
have just run there, in their original form, as nbval's own items. So every notebook runs once
for nbval and its mistakes together (it ran twice when the catalogue walked the notebooks in a
kernel of its own). For a mistake only the mutated solution cell and the cells up to its failing
test run; nbval then runs the solution cell and what follows in their original form. A mistake
can leave the process group with unfinished messages (that is what the learner meets too): after
each one a probe checks the group, and if it is unusable the engines are restarted and the
notebook's cells before the mistake run again from the top. A ``-k`` subset works: an item first
runs, in their original form, the cells before it that nbval did not run.

The same kernel also runs **the student version of every exercise** (``stub_*`` ids): the
released cell (nbgrader's stub with our hint) in place of the solution, and the released (visible
only) tests of its exercise after it: each of those tests must fail with a message. It
is the release's "every graded test fails" check, one exercise at a time, so a test that passes
only because an earlier exercise broke the notebook is caught too. What the solution cell had
bound (at top level, or as a function's ``global``) is removed first, in the kernel or on the
engines, so a stub's test cannot pass on the solution's leftovers. The untouched release itself,
run whole, is graded in ``test_instructor_grade.py`` (unit 0's class).

``conftest.py`` loads this module as a plugin; ``tests/test_mistakes.py`` checks the catalogue's
files without a kernel.
"""

from __future__ import annotations

import ast
import copy
import importlib.util
import queue
import time
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

import pytest

from course_utils.assignments.lessons import NOTEBOOK_DIR, read
from course_utils.assignments.release import lesson_notebooks, student_notebooks
from course_utils.instructor.graded_tests import solution_region, with_solution
from course_utils.notebook_cells import is_solution_cell, is_test_cell, nbgrader_meta

MISTAKE_DIR = Path(__file__).parent / "mistakes"


def cell_order(path: Path) -> tuple[str, int, str]:
    """Notebook, then the position of the planted solution cell: the catalogue runs forwards
    through each notebook (one kernel), so a mistake in exercise 1 must come before one in 2."""
    text = path.read_text()
    consts = {k: v for k, v in (ln.split(" = ", 1) for ln in text.splitlines()
                                if ln.startswith(("NOTEBOOK = ", "GRADE_ID = ")))}
    notebook, grade = (ast.literal_eval(consts[k]) for k in ("NOTEBOOK", "GRADE_ID"))
    cells = read(NOTEBOOK_DIR / notebook).cells
    at = next((i for i, c in enumerate(cells) if nbgrader_meta(c).get("grade_id") == grade), -1)
    return notebook, at, path.name


MISTAKES = sorted(MISTAKE_DIR.glob("u*.py"), key=cell_order)
MISTAKES_NOTEBOOKS = sorted({p.name for p in NOTEBOOK_DIR.glob("*.ipynb")})


class Stub(NamedTuple):
    """The student version of one exercise: solution cell ``grade_id`` (at ``at``) and the
    graded tests of its exercise after it, which must fail on its stub."""

    notebook: str
    at: int
    grade_id: str
    tests: tuple[str, ...]

    @property
    def id(self) -> str:
        return f"stub_{self.notebook[:2]}_{self.grade_id}"


def exercise_of(grade_id: str) -> str:
    """``ex3-save-solution`` and ``ex3-test`` -> ``ex3``: a solution cell's tests share it."""
    return grade_id.split("-")[0]


def stubs_of(name: str) -> list[Stub]:
    cells = read(NOTEBOOK_DIR / name).cells
    out = []
    for s, c in enumerate(cells):
        if c.cell_type == "code" and is_solution_cell(c):
            gid = nbgrader_meta(c)["grade_id"]
            tests = tuple(nbgrader_meta(t)["grade_id"] for t in cells[s + 1:] if is_test_cell(t)
                          and exercise_of(nbgrader_meta(t)["grade_id"]) == exercise_of(gid))
            out.append(Stub(name, s, gid, tests))
    return out


STUBS = [st for path in lesson_notebooks() for st in stubs_of(path.name)]
#: Mistakes and stubs together, forwards through each notebook (one kernel for all).
ENTRIES = sorted([*MISTAKES, *STUBS], key=lambda e: (e.notebook, e.at, e.id) if isinstance(
    e, Stub) else cell_order(e))
FIELDS = ("NOTEBOOK", "GRADE_ID", "FAILS", "MESSAGE", "WITHIN_S")

#: Defines, in the notebook's kernel, what :meth:`Walk.group_state` asks every rank.
PROBE = '''
import course_utils as _cu


def _course_group_state():
    """none: no process group; clean: one that answers; broken: one that does not."""
    import datetime
    import sys

    if "torch.distributed" not in sys.modules:
        return "none"
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        return "none"
    r, p, wait = dist.get_rank(), dist.get_world_size(), datetime.timedelta(seconds=3)
    try:
        total = torch.ones(1)
        dist.all_reduce(total, async_op=True).wait(timeout=wait)
        got, mine = torch.empty(1), torch.full((1,), float(r))
        reqs = [dist.isend(mine, (r + 1) % p), dist.irecv(got, (r - 1) % p)]
        for q in reqs:
            q.wait(timeout=wait)
    except Exception:
        return "broken"
    return "clean" if total.item() == p and got.item() == float((r - 1) % p) else "broken"


def _course_group_leave():
    import torch.distributed as dist

    dist.destroy_process_group()


def _course_state():
    try:
        states = set(_cu.current().run(_course_group_state, timeout=15))
    except Exception:
        return "broken"
    return states.pop() if len(states) == 1 else "broken"
'''


def is_teardown(cell) -> bool:
    return "teardown" in nbgrader_meta(cell).get("grade_id", "")


def cell_index(item) -> int:
    """Where nbval's item ``item`` sits among its notebook's cells."""
    return next(i for i, c in enumerate(item.parent.nb.cells) if c is item.cell)


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"mistake_{path.stem}", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    missing = [f for f in FIELDS if not hasattr(mod, f)]
    assert not missing, f"{path.name} lacks {missing}"
    assert 0 < mod.WITHIN_S <= 30, f"{path.name}: WITHIN_S must be in (0, 30]"
    assert hasattr(mod, "BODY") != hasattr(mod, "REPLACE"), f"{path.name}: BODY or REPLACE"
    if hasattr(mod, "REPLACE"):
        mod.BODY = planted(path.name, read(NOTEBOOK_DIR / mod.NOTEBOOK), mod.GRADE_ID,
                           mod.REPLACE, getattr(mod, "REGION", 0))
    return mod


def planted(name: str, nb, grade_id: str, replace: list[tuple[str, str]], region: int = 0
            ) -> str:
    """The solution region with each ``(old, new)`` of ``REPLACE`` made once: the mistake as
    a change of the working code, so that it follows the solution when that is edited."""
    body = solution_region(nb, grade_id, region)
    for old, new in replace:
        assert body.count(old) == 1, (
            f"{name}: {old!r} occurs {body.count(old)} times in {grade_id}'s solution, not once")
        body = body.replace(old, new)
    return body


def index_of(nb, grade_id: str) -> int:
    for i, c in enumerate(nb.cells):
        if nbgrader_meta(c).get("grade_id") == grade_id:
            return i
    raise KeyError(f"no cell with grade_id {grade_id!r}")




#: Seconds a catalogue cell may run (nbclient's limit when the catalogue had its own kernel).
CELL_TIMEOUT = 300


def execute(kernel, source: str, timeout: float = CELL_TIMEOUT) -> tuple[list[str], float, str]:
    """Run ``source`` in nbval's kernel: its errors (``"ename: evalue"``), its seconds from
    the request to the kernel's idle, and what it printed."""
    msg_id = kernel.execute_cell_input(source, allow_stdin=False)
    t0 = time.perf_counter()
    try:
        kernel.await_reply(msg_id, timeout=timeout)
    except queue.Empty:
        kernel.interrupt()
        raise AssertionError(f"a catalogue cell ran past {timeout} s: {source[:200]!r}") from None
    errors, printed = [], []
    while True:
        msg = kernel.get_message("iopub", timeout=60)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "status" and content["execution_state"] == "idle":
            break
        if kind == "error":
            errors.append(f"{content.get('ename')}: {content.get('evalue')}")
        elif kind == "stream" and content.get("name") == "stdout":
            printed.append(content.get("text", ""))
    return errors, time.perf_counter() - t0, "".join(printed)


class Walk:
    """One notebook's nbval kernel, as the catalogue sees it: the original cells ``[0, done)``
    ran (nbval's items, or :meth:`run_original`), and which graded tests failed doing so."""

    def __init__(self, nbfile) -> None:
        self.nbfile = nbfile
        self.name = nbfile.path.name
        self.nb = read(NOTEBOOK_DIR / self.name)
        self.done = 0
        self.failed_tests: list[str] = []
        self.errors: list[str] = []
        self._released = None

    def execute(self, cell) -> tuple[list[str], float]:
        errors, seconds, _ = execute(self.nbfile.kernel, cell.source)
        return errors, seconds

    def ran(self, index: int, errors: list[str]) -> None:
        """Cell ``index`` ran in its original form (here or as nbval's item)."""
        cell = self.nb.cells[index]
        if errors:   # a lesson cell's error explains a graded test's failure below it
            self.errors.append(f"{nbgrader_meta(cell).get('grade_id', index)}: {errors[0][:300]}")
        if errors and is_test_cell(cell):
            self.failed_tests.append(f"{nbgrader_meta(cell)['grade_id']}: {errors[0][:200]}")
        self.done = max(self.done, index + 1)

    def run_original(self, upto: int) -> None:
        """Run the original cells [done, upto) that have not run (a restart, a -k subset)."""
        for i in range(self.done, upto):
            cell = self.nb.cells[i]
            if cell.cell_type != "code" or is_teardown(cell):
                continue
            self.ran(i, self.execute(cell)[0])
        self.done = max(self.done, upto)

    def wait_until_idle(self, limit: float = 30.0) -> None:
        """Until no rank is busy (a %%px cell can fail while other ranks still run it)."""
        execute(self.nbfile.kernel, f"import time as _t\n_end = _t.monotonic() + {limit}\n"
                "while _cu.current().busy() and _t.monotonic() < _end:\n    _t.sleep(0.2)\n",
                timeout=limit + 30)

    def group_state(self) -> str:
        """The ranks' process group: ``none``, ``clean`` (it answers) or ``broken``."""
        errors, _, said = execute(self.nbfile.kernel, PROBE + "print(_course_state())",
                                  timeout=60)
        return "broken" if errors else said.strip()

    def make_clean(self, before: str, upto: int) -> None:
        """After a mistake, give nbval's next item the kernel it expects: the ranks' process
        group as it was ``before`` the mistake. A group the mistake left where there was none
        is destroyed (a ``leave_group`` that does not leave); otherwise, if the group changed
        or stopped answering, the engines are restarted and the original cells [0, upto) run
        again."""
        after = self.group_state()
        if after == "clean" and before == "none":
            execute(self.nbfile.kernel, "_cu.current().run(_course_group_leave, timeout=15)",
                    timeout=60)
            after = self.group_state()
        print(f"catalogue: the group was {before!r} before, {after!r} after"
              + (": restarting the engines" if after != before else ""))
        if after != before:
            errors, _, _ = execute(self.nbfile.kernel, "cluster = _cu.restart()")
            assert not errors, f"the catalogue could not restart the engines: {errors}"
            self.done = 0
            self.run_original(upto)
        self.done = upto

    def released(self):
        """This notebook as ``course release`` hands it out (cached)."""
        if self._released is None:
            self._released = student_notebooks([NOTEBOOK_DIR / self.name])[0]
        return self._released


_WALKS: dict[str, Walk] = {}


def walk_of(nbfile) -> Walk:
    if nbfile.nodeid not in _WALKS:
        _WALKS[nbfile.nodeid] = Walk(nbfile)
    return _WALKS[nbfile.nodeid]


class CatalogueItem(pytest.Item):
    """A catalogued mistake or an exercise's stub, run in its notebook's nbval kernel."""

    def __init__(self, *, entry, at: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.entry, self.at = entry, at

    def runtest(self) -> None:
        walk = walk_of(self.parent)
        stub, at = isinstance(self.entry, Stub), self.at
        walk.run_original(at)  # the cells before it that nbval did not run (a restart, -k)
        before = walk.group_state()
        try:
            if stub:
                stub_fails_its_tests(self.entry, walk)
            else:
                mistake_fails_its_test(self.entry, walk)
        finally:
            walk.make_clean(before, at)

    def reportinfo(self):
        return self.path, None, f"{self.parent.path.name}::{self.name}"


def entry_id(entry) -> str:
    return entry.id if isinstance(entry, Stub) else entry.stem


@pytest.hookimpl(tryfirst=True)  # before -k and -m deselect: the entries can be selected
def pytest_collection_modifyitems(session, config, items) -> None:
    """Each entry goes just before nbval's item for the solution cell it replaces."""
    from nbval.plugin import IPyNbCell

    if not any(isinstance(it, IPyNbCell) for it in items):
        return
    at: dict[tuple[str, int], list] = {}
    for entry in ENTRIES:
        name, index = ((entry.notebook, entry.at) if isinstance(entry, Stub)
                       else cell_order(entry)[:2])
        at.setdefault((name, index), []).append(entry)
    placed = []
    for item in items:
        if isinstance(item, IPyNbCell):
            index = cell_index(item)
            for entry in at.get((item.parent.path.name, index), []):
                placed.append(CatalogueItem.from_parent(item.parent, name=entry_id(entry),
                                                        entry=entry, at=index))
        placed.append(item)
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
        walk.ran(index, [f"{error[0].__name__}: {str(error[1])[:300]}"] if error else [])

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


def stub_fails_its_tests(stub: Stub, session: Walk) -> None:
    release = session.released()
    assert not session.failed_tests, (
        f"graded tests failed before {stub.grade_id}: {session.failed_tests}; cell errors: "
        f"{session.errors}")
    handed_out = {nbgrader_meta(c).get("grade_id"): c for c in release.cells
                  if nbgrader_meta(c).get("grade_id")}
    magic, names = bound_names(session.nb.cells[stub.at].source)
    if names:  # the solution's leftovers go, where the cell ran (kernel or engines)
        from nbformat.v4 import new_code_cell

        forget = f"for _n in {names!r}:\n    globals().pop(_n, None)\n"
        errs, _ = session.execute(new_code_cell(f"{magic}\n{forget}" if magic else forget))
        assert not errs, f"could not remove the solution's names {names}: {errs}"
    last = max(i for i, c in enumerate(session.nb.cells)
               if nbgrader_meta(c).get("grade_id") in stub.tests) if stub.tests else stub.at
    outcome = {}
    for i in range(stub.at, last + 1):
        cell = session.nb.cells[i]
        gid = nbgrader_meta(cell).get("grade_id", "")
        if cell.cell_type != "code" or "teardown" in gid:
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
    assert seconds <= mod.WITHIN_S, (
        f"{path.stem}: {mod.FAILS} took {seconds:.1f} s to fail (limit {mod.WITHIN_S} s)")
