"""The mistakes catalogue (``tests/mistakes/u*.py``, format in ``tests/mistakes/README.md``):
each typical learner mistake, planted in its solution cell, must fail the graded test aimed at
it, with a message naming the fix, within ``WITHIN_S`` seconds, while no earlier graded test
fails.

Speed: one kernel and one cluster for the whole catalogue (mistakes are sorted by notebook).
Cells before a mistake's solution cell run once per notebook in their original form; for each
mistake only the mutated solution cell and the cells up to its failing test run. A mistake can
leave the process group with unfinished messages (that is what the learner meets too): before
the next mistake a probe checks the group, and if it is unusable the engines are restarted and
the notebook's cells re-run from the top.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import importlib.util
import os
import time
from pathlib import Path
from types import ModuleType

import pytest

from course_utils.assignments.lessons import NOTEBOOK_DIR, read
from course_utils.instructor.graded_tests import solution_region, with_solution
from course_utils.notebook_cells import is_test_cell, nbgrader_meta

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
        from nbclient import NotebookClient

        self.client = NotebookClient(read(NOTEBOOK_DIR / MISTAKES_NOTEBOOKS[0]), timeout=300,
                                     allow_errors=True, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
        self.stack = contextlib.ExitStack()
        env = {**os.environ, "COURSE_CLUSTER_ID": f"mistakes-{os.getpid()}"}
        self.stack.enter_context(self.client.setup_kernel(env=env))
        self.notebook, self.nb, self.done = "", None, 0
        self.used = False
        self.failed_tests: list[str] = []
        self.errors: list[str] = []

    def open(self, name: str) -> None:
        if name != self.notebook:
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

    def close(self) -> None:
        with contextlib.suppress(Exception):
            for i, cell in enumerate(self.nb.cells if self.nb else []):
                if "teardown" in nbgrader_meta(cell).get("grade_id", ""):
                    self.execute(cell, i)
        self.stack.close()


@pytest.fixture(scope="module")
def kernel():
    k = Kernel()
    yield k
    k.close()


def test_catalogue_files_are_well_formed():
    assert MISTAKES, "no mistakes in tests/mistakes/"
    for path in MISTAKES:
        mod = load(path)
        nb = read(NOTEBOOK_DIR / mod.NOTEBOOK)
        s, f = index_of(nb, mod.GRADE_ID), index_of(nb, mod.FAILS)
        assert s < f and is_test_cell(nb.cells[f]), f"{path.name}: FAILS must be a later test"
        with_solution(copy.deepcopy(nb), mod.GRADE_ID, mod.BODY,
                      getattr(mod, "REGION", 0))  # the region exists


@pytest.mark.parametrize("path", MISTAKES, ids=[p.stem for p in MISTAKES])
def test_mistake_fails_its_own_test_with_the_fix(path, kernel):
    mod = load(path)
    session = kernel
    if session.used:
        session.make_clean()
    session.used = True
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
