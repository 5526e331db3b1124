"""Re-running cells, or a whole notebook, in the same kernel works (idempotent set-up and
teardown). The re-runs are nbval items (conftest's ``RERUN_PLANS``): after a notebook's cells
ran once as written, its plan runs them again in the same kernel."""

from __future__ import annotations

import re
import subprocess
import sys

from conftest import RERUN_PLANS
from course_utils.assignments.lessons import NOTEBOOK_DIR, read, source_notebooks
from course_utils.notebook_cells import nbgrader_meta


def test_every_notebook_has_a_rerun_plan_that_runs_it_whole_first():
    assert sorted(RERUN_PLANS) == [p.name for p in source_notebooks()]
    for plan in RERUN_PLANS.values():
        assert plan.startswith("B") and plan.endswith("T") and set(plan) <= set("BTS")


def _collected(name: str) -> list[str]:
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                          f"notebooks/{name}", "-p", "no:cacheprovider"],
                         cwd=NOTEBOOK_DIR.parent, capture_output=True, text=True, timeout=120)
    return [ln.split("::", 1)[1] for ln in out.stdout.splitlines() if "::" in ln]


def test_nbval_runs_the_notebook_then_its_plan_in_the_same_kernel():
    nb = read(NOTEBOOK_DIR / "00_cluster_tour.ipynb")  # "BTBT": the whole notebook twice
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "teardown" in nbgrader_meta(code[-1]).get("grade_id", "")
    ids = _collected("00_cluster_tour.ipynb")
    first = [f"Cell {n}" for n in range(len(code))]
    assert ids == first + [f"{c} (pass {3 if n < len(code) - 1 else 4})"
                           for n, c in enumerate(first)], ids
    ids = _collected("01_collectives.ipynb")  # "BBT": every cell again, then the teardown
    n = sum(c.cell_type == "code" for c in read(NOTEBOOK_DIR / "01_collectives.ipynb").cells)
    assert len(ids) == 2 * n - 1 and ids[-1] == f"Cell {n - 1}"
    assert all(re.fullmatch(r"Cell \d+ \(pass 2\)", i) for i in ids[n - 1:-1])
