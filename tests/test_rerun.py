"""What makes re-running safe. The re-runs themselves happen inside nbval's run
(:mod:`tests.notebook_items.rerun`): units 1 and 4 whole again in the same kernel after their
teardown, unit 3's cells again against the live cluster before it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from course_utils.notebook_cells import is_teardown
from tests.notebook_items.rerun import PLANS

NOTEBOOK_DIR = Path(__file__).resolve().parents[1] / "notebooks"


@pytest.mark.parametrize("name", sorted(p.name for p in NOTEBOOK_DIR.glob("[0-9]*.ipynb")))
def test_every_notebook_ends_with_its_teardown(name):
    # A plan's "B" is every cell before the teardown, and the re-run items sit just before or
    # after nbval's item for it: the teardown cell must be the last code cell, and the only one.
    cells = [c for c in nbformat.read(NOTEBOOK_DIR / name, as_version=4).cells
             if c.cell_type == "code"]
    assert is_teardown(cells[-1]) and not any(is_teardown(c) for c in cells[:-1])


def test_the_re_runs_sit_after_or_before_each_notebooks_teardown_item():
    """Collected as pytest would (no kernel): each plan's item beside nbval's teardown item."""
    names = [f"notebooks/{n}" for n in PLANS]
    out = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:randomly",
                          *names], capture_output=True, text=True, timeout=300,
                         cwd=NOTEBOOK_DIR.parent, check=False,
                         env={k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}).stdout
    ids = [line.strip() for line in out.splitlines() if "::" in line]
    for name, (plan, where) in PLANS.items():
        mine = [i.split("::", 1)[1] for i in ids if i.startswith(f"notebooks/{name}::")]
        cells = [i for i in mine if i.startswith("Cell ")]
        assert cells, f"nothing collected from {name}: {out[-800:]}"
        teardown = mine.index(cells[-1])
        assert mine[teardown + (1 if where == "after" else -1)] == f"run_again_{plan}", mine[-4:]
