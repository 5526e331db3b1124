"""Re-running a whole notebook in the same kernel works (idempotent set-up and teardown)."""

from __future__ import annotations

import pytest
from nbclient import NotebookClient

from course_utils.grading import NOTEBOOK_DIR, read

RERUN = ["00_cluster_tour.ipynb"]


@pytest.mark.cluster
@pytest.mark.parametrize("name", RERUN)
def test_notebook_runs_twice_in_one_kernel(name):
    nb = read(NOTEBOOK_DIR / name)
    client = NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
    errors = []
    with client.setup_kernel():
        for attempt in (1, 2):
            for i, cell in enumerate(nb.cells):
                if cell.cell_type != "code":
                    continue
                client.execute_cell(cell, i)
                errors += [(attempt, i, o.get("ename"), o.get("evalue"))
                           for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors
