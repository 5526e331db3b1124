"""The mistakes catalogue (``tests/mistakes/u*.py``, format in ``tests/mistakes/README.md``):
each typical learner mistake, planted in its solution cell, must fail the graded test aimed at
it, with a message naming the fix, within ``WITHIN_S`` seconds, while no earlier graded test
fails.

Speed: one kernel and one cluster for the whole catalogue (mistakes are sorted by notebook),
but for a kernel that imported TensorFlow, which is replaced before the next torch unit (so any
``-k`` subset runs as the whole does).
Cells before a mistake's solution cell run once per notebook in their original form; for each
mistake only the mutated solution cell and the cells up to its failing test run. A mistake can
leave the process group with unfinished messages (that is what the learner meets too): before
the next mistake a probe checks the group, and if it is unusable the engines are restarted and
the notebook's cells re-run from the top.

The same kernel also runs **the student version of every exercise** (``stub_*`` ids): the
released cell (nbgrader's stub with our hint) in place of the solution, and the released (visible
only) tests of its exercise after it: each of those tests must fail with a message. It
is the release's "every graded test fails" check, one exercise at a time, so a test that passes
only because an earlier exercise broke the notebook is caught too. What the solution cell had
bound (at top level, or as a function's ``global``) is removed first, in the kernel or on the
engines, so a stub's test cannot pass on the solution's leftovers. The untouched release itself,
run whole, is graded in ``test_instructor_grade.py`` (unit 0's class).
"""

from __future__ import annotations

import ast
import contextlib
import copy
import importlib.util
import os
import shutil
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

import pytest

from course_utils.assignments.lessons import NOTEBOOK_DIR, read
from course_utils.assignments.release import lesson_notebooks, student_notebooks
from course_utils.instructor.graded_tests import solution_region, with_solution
from course_utils.notebook_cells import is_solution_cell, is_test_cell, nbgrader_meta
from tests.workdir import private_notebook_dir

MISTAKE_DIR = Path(__file__).parent / "mistakes"


def _cell_order(path: Path) -> tuple[str, int, str]:
    """Notebook, then the position of the planted solution cell: the catalogue runs forwards
    through each notebook (one kernel), so a mistake in exercise 1 must come before one in 2."""
    text = path.read_text()
    consts = {k: v for k, v in (ln.split(" = ", 1) for ln in text.splitlines()
                                if ln.startswith(("NOTEBOOK = ", "GRADE_ID = ")))}
    notebook, grade = (ast.literal_eval(consts[k]) for k in ("NOTEBOOK", "GRADE_ID"))
    cells = read(NOTEBOOK_DIR / notebook).cells
    at = next((i for i, c in enumerate(cells) if nbgrader_meta(c).get("grade_id") == grade), -1)
    return notebook, at, path.name


MISTAKES = sorted(MISTAKE_DIR.glob("u*.py"), key=_cell_order)
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
    e, Stub) else _cell_order(e))
FIELDS = ("NOTEBOOK", "GRADE_ID", "FAILS", "MESSAGE", "WITHIN_S")

PROBE = '''
import course_utils as _cu


def _course_group_is_clean():
    import datetime
    import sys

    if "torch.distributed" not in sys.modules:
        return True
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        return True
    r, p, wait = dist.get_rank(), dist.get_world_size(), datetime.timedelta(seconds=3)
    total = torch.ones(1)
    dist.all_reduce(total, async_op=True).wait(timeout=wait)
    got, mine = torch.empty(1), torch.full((1,), float(r))
    reqs = [dist.isend(mine, (r + 1) % p), dist.irecv(got, (r - 1) % p)]
    for q in reqs:
        q.wait(timeout=wait)
    return total.item() == p and got.item() == float((r - 1) % p)


try:
    _course_clean = all(_cu.current().run(_course_group_is_clean, timeout=15))
except Exception:
    _course_clean = False
if not _course_clean:
    cluster = _cu.restart()
print("clean" if _course_clean else "restarted")
'''


#: Asked when the catalogue's kernel moves on to another notebook: a kernel that imported
#: TensorFlow (units 4 and 5 make the kernel their coordinator) is replaced before a torch
#: unit, as a learner's next notebook gets a kernel of its own (torch's triton hooks refuse a
#: process with TensorFlow; the full catalogue passed only because a unit 5 mistake happened
#: to restart the engines last).
HAS_TF = 'import sys\nprint("tensorflow" in sys.modules)'


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


def errors_of(cell) -> list[str]:
    return [f"{o.get('ename')}: {o.get('evalue')}" for o in cell.get("outputs", [])
            if o.get("output_type") == "error"]


class Kernel:
    """One kernel (and one cluster) for the whole catalogue. ``notebook`` is the notebook whose
    first ``done`` cells ran in their original form; switching notebooks runs the next one from
    its top, like "Run all" in a kernel that already ran the previous unit."""

    def __init__(self) -> None:
        # Its own working folder: planted mistakes write unit 6's train_ddp.py and checkpoints.
        self.workdir = private_notebook_dir(Path(tempfile.mkdtemp(prefix="course-mistakes-")))
        self.stack = contextlib.ExitStack()
        self._start_kernel()
        self.notebook, self.nb, self.done = "", None, 0
        self.used = False
        self.failed_tests: list[str] = []
        self.errors: list[str] = []

    def _start_kernel(self) -> None:
        from nbclient import NotebookClient

        self.client = NotebookClient(read(NOTEBOOK_DIR / MISTAKES_NOTEBOOKS[0]), timeout=300,
                                     allow_errors=True, kernel_name="python3",
                                     resources={"metadata": {"path": str(self.workdir)}})
        env = {**os.environ, "COURSE_CLUSTER_ID": f"mistakes-{os.getpid()}"}
        self.stack.enter_context(self.client.setup_kernel(env=env))

    def _kernel_has_tf(self) -> bool:
        from nbformat.v4 import new_code_cell

        cell = new_code_cell(HAS_TF)
        self.client.execute_cell(cell, 0)
        return "True" in "".join(o.get("text", "") for o in cell.outputs)

    def open(self, name: str) -> None:
        if name != self.notebook:
            if self.notebook and "_tf" not in name and self._kernel_has_tf():
                self._teardown()  # the kernel's cu.stop(): its cluster goes with it
                self.stack.close()
                self.stack = contextlib.ExitStack()
                self._start_kernel()
            self.notebook, self.nb, self.done = name, read(NOTEBOOK_DIR / name), 0
            self.failed_tests, self.errors = [], []

    def execute(self, cell, index: int) -> tuple[list[str], float]:
        cell = copy.deepcopy(cell)
        cell.outputs = []
        t0 = time.perf_counter()
        self.client.execute_cell(cell, 0)   # the index only names a slot in the client's copy
        return errors_of(cell), time.perf_counter() - t0

    def run_original(self, upto: int) -> None:
        """Run the original cells [done, upto) and note graded tests that failed."""
        for i in range(self.done, upto):
            cell = self.nb.cells[i]
            if cell.cell_type != "code" or "teardown" in nbgrader_meta(cell).get("grade_id", ""):
                continue
            errs, _ = self.execute(cell, i)
            if errs:   # a lesson cell's error explains a graded test's failure below it
                self.errors.append(f"{nbgrader_meta(cell)['grade_id']}: {errs[0][:300]}")
            if errs and is_test_cell(cell):
                self.failed_tests.append(f"{nbgrader_meta(cell)['grade_id']}: {errs[0][:200]}")
        self.done = max(self.done, upto)

    def make_clean(self) -> None:
        """After a mistake: probe the group; restart and start over if it is unusable."""
        from nbformat.v4 import new_code_cell

        probe = new_code_cell(PROBE)
        self.client.execute_cell(probe, 0)
        said = "".join(o.get("text", "") for o in probe.outputs if o.get("name") == "stdout")
        if "clean" not in said:
            self.done = 0

    def _teardown(self) -> None:
        with contextlib.suppress(Exception):
            for i, cell in enumerate(self.nb.cells if self.nb else []):
                if "teardown" in nbgrader_meta(cell).get("grade_id", ""):
                    self.execute(cell, i)

    def close(self) -> None:
        self._teardown()
        self.stack.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


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


@pytest.fixture(scope="module")
def released() -> dict[str, object]:
    """Each lesson's student version, exactly as ``course release`` hands it out (cached)."""
    names = sorted({st.notebook for st in STUBS})
    return dict(zip(names, student_notebooks([NOTEBOOK_DIR / n for n in names]), strict=True))


@pytest.fixture(scope="module")
def kernel():
    k = Kernel()
    yield k
    k.close()


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


@pytest.mark.parametrize("entry", ENTRIES,
                         ids=[e.id if isinstance(e, Stub) else e.stem for e in ENTRIES])
def test_fails_where_it_is_made(entry, kernel, released):
    """A catalogued mistake fails its aimed test with the fix named; an exercise's stub (the
    student version) fails every test of its exercise, each with a message."""
    session = kernel
    if session.used:
        session.make_clean()
    session.used = True
    if isinstance(entry, Stub):
        stub_fails_its_tests(entry, session, released[entry.notebook])
    else:
        mistake_fails_its_test(entry, session)


def stub_fails_its_tests(stub: Stub, session: Kernel, release) -> None:
    session.open(stub.notebook)
    session.run_original(stub.at)
    assert not session.failed_tests, (
        f"graded tests failed before {stub.grade_id}: {session.failed_tests}; cell errors: "
        f"{session.errors}")
    handed_out = {nbgrader_meta(c).get("grade_id"): c for c in release.cells
                  if nbgrader_meta(c).get("grade_id")}
    magic, names = bound_names(session.nb.cells[stub.at].source)
    if names:  # the solution's leftovers go, where the cell ran (kernel or engines)
        from nbformat.v4 import new_code_cell

        forget = f"for _n in {names!r}:\n    globals().pop(_n, None)\n"
        errs, _ = session.execute(new_code_cell(f"{magic}\n{forget}" if magic else forget), -1)
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
        errs, _ = session.execute(cell, i)
        if gid in stub.tests:
            outcome[gid] = errs
    session.done = stub.at
    print(f"{stub.id}: " + "; ".join(f"{t}: {e[0][:120] if e else 'PASSED'}"
                                     for t, e in outcome.items()))
    passed = [t for t, e in outcome.items() if not e]
    assert not passed, f"{stub.id}: these tests pass on the student version: {passed}"
    empty = [t for t, e in outcome.items() if not e[0].split(":", 1)[-1].strip()]
    assert not empty, f"{stub.id}: these tests fail with no message on the student version: {empty}"


def mistake_fails_its_test(path: Path, session: Kernel) -> None:
    mod = load(path)
    session.open(mod.NOTEBOOK)
    mutated = with_solution(copy.deepcopy(session.nb), mod.GRADE_ID, mod.BODY,
                            getattr(mod, "REGION", 0))
    s, f = index_of(mutated, mod.GRADE_ID), index_of(mutated, mod.FAILS)
    session.run_original(s)
    assert not session.failed_tests, (
        f"graded tests failed before the mistake: {session.failed_tests}; cell errors: "
        f"{session.errors}")

    earlier_failed, result, seconds = [], [], 0.0
    for i in range(s, f + 1):
        cell = mutated.cells[i]
        if cell.cell_type != "code":
            continue
        errs, secs = session.execute(cell, i)
        if i == f:
            result, seconds = errs, secs
        elif errs and is_test_cell(cell):
            earlier_failed.append(f"{nbgrader_meta(cell)['grade_id']}: {errs[0][:300]}")
    session.done = s
    print(f"{path.stem}: {mod.FAILS} failed after {seconds:.1f} s: "
          f"{result[0] if result else 'did not fail'}")
    assert not earlier_failed, f"{path.stem}: earlier graded tests failed: {earlier_failed}"
    assert result, f"{path.stem}: {mod.FAILS} passed with the mistake planted"
    assert mod.MESSAGE in result[0], (
        f"{path.stem}: {mod.FAILS} failed without naming the fix {mod.MESSAGE!r}: {result[0]}")
    assert seconds <= mod.WITHIN_S, (
        f"{path.stem}: {mod.FAILS} took {seconds:.1f} s to fail (limit {mod.WITHIN_S} s)")
