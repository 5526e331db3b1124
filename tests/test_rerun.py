"""Re-running in the same kernel works, as a learner does it: a whole notebook twice (set-up
and teardown are idempotent), or every cell again against the live cluster and process group
before the teardown. nbval runs each notebook once; these tests run one notebook of each kind
again with nbclient, in one kernel from the first cell to the last."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from jupyter_client import KernelManager
from nbclient import NotebookClient
from nbval.kernel import CURRENT_ENV_KERNEL_NAME, NbvalKernelspecManager

from course_utils.notebook_cells import grade_id
from tests.workdir import private_notebook_dir

NOTEBOOK_DIR = Path(__file__).resolve().parents[1] / "notebooks"
CELL_TIMEOUT = 600  # as nbval's --nbval-cell-timeout in pyproject.toml


def _is_teardown(cell) -> bool:
    return "teardown" in grade_id(cell)


def run_in_one_kernel(name: str, plan: str, workdir: Path) -> list[str]:
    """Run notebook ``name`` in one kernel by ``plan``: ``B`` every code cell but the
    teardown, ``T`` the teardown. Returns what ran, one letter per step (a failing cell
    raises nbclient's CellExecutionError naming it). A failed pass still runs the teardown,
    so no engines outlive the test. It runs in ``workdir`` (:mod:`tests.workdir`): nbval may
    run the same notebook in ``notebooks/`` at the same time."""
    cwd = str(private_notebook_dir(workdir))
    nb = nbformat.read(NOTEBOOK_DIR / name, as_version=4)
    code = [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    steps = {"B": [ic for ic in code if not _is_teardown(ic[1])],
             "T": [ic for ic in code if _is_teardown(ic[1])]}
    assert steps["T"], f"{name} has no teardown cell"
    # The kernel of this interpreter, as nbval's --nbval-current-env starts it.
    km = KernelManager(kernel_name=CURRENT_ENV_KERNEL_NAME,
                       kernel_spec_manager=NbvalKernelspecManager())
    client = NotebookClient(nb, km=km, timeout=CELL_TIMEOUT, kernel_name=CURRENT_ENV_KERNEL_NAME,
                            resources={"metadata": {"path": cwd}})
    ran: list[str] = []
    try:
        with client.setup_kernel(cwd=cwd):
            try:
                for step in plan:
                    for index, cell in steps[step]:
                        client.execute_cell(cell, index)
                    ran.append(step)
            finally:
                if not ran or ran[-1] != "T":
                    for index, cell in steps["T"]:
                        client.execute_cell(cell, index)
    finally:  # nbclient leaves a kernel manager it was handed running
        if km.has_kernel:
            km.shutdown_kernel(now=True)
    return ran


def test_a_torch_notebook_runs_twice_whole_in_one_kernel(tmp_path):
    # Unit 1: the cluster and the gloo group are started, stopped, and started again.
    assert run_in_one_kernel("01_collectives.ipynb", "BTBT", tmp_path) == list("BTBT")


def test_a_tf_notebook_runs_twice_whole_in_one_kernel(tmp_path):
    # Unit 4: the TF servers are started, stopped, and started again on fresh engines.
    assert run_in_one_kernel("04_tf_classic_ps.ipynb", "BTBT", tmp_path) == list("BTBT")


def test_every_cell_again_against_the_live_cluster(tmp_path):
    # Unit 3: each set-up cell meets what its first run started (cluster, process group,
    # DDP model) and reuses it; then the teardown.
    assert run_in_one_kernel("03_pytorch_ddp.ipynb", "BBT", tmp_path) == list("BBT")


@pytest.mark.parametrize("name", sorted(p.name for p in NOTEBOOK_DIR.glob("[0-9]*.ipynb")))
def test_every_notebook_ends_with_its_teardown(name):
    # What makes re-running safe: the teardown cell is the last code cell, so a plan's "B"
    # is every cell before it.
    cells = [c for c in nbformat.read(NOTEBOOK_DIR / name, as_version=4).cells
             if c.cell_type == "code"]
    assert _is_teardown(cells[-1]) and not any(_is_teardown(c) for c in cells[:-1])
