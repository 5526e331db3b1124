"""Re-running cells, or a whole notebook, in the same kernel works (idempotent set-up and
teardown). ``BTBT`` = the whole notebook twice; ``BBT`` = every cell twice against the live
cluster and process group, then the teardown."""

from __future__ import annotations

import pytest

from course_utils.instructor.grading import NOTEBOOK_DIR, read, run_in_one_kernel, source_notebooks

PLANS = {
    "00_cluster_tour.ipynb": "BTBT",
    "01_collectives.ipynb": "BBT",
    "02_data_parallel_from_scratch.ipynb": "BBT",
    "03_pytorch_ddp.ipynb": "BBT",
    "04_tf_classic_ps.ipynb": "BTBT",
    "05_tf2_parameter_server_strategy.ipynb": "BTBT",
    "06_two_hosts.ipynb": "BTBT",
    "07_performance.ipynb": "BTBT",
    # Its body (a torchrun job, a dead rank and a restart, TF drills) costs 40-70 s on the
    # shared 2-core machine and runs in nbval already; "BBT" passes too (105 s measured), but
    # the suite is over budget: here set-up and teardown are re-run around one another.
    "08_hangs_and_faults.ipynb": "STST",
    # The capstone again in the same kernel: the checkpoint of the first pass is deleted by the
    # test cell, the second training starts from scratch, resumes, and meets the bar again.
    "09_capstone.ipynb": "BBT",
}


def test_every_notebook_has_a_rerun_plan():
    assert sorted(PLANS) == [p.name for p in source_notebooks()]


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PLANS))
def test_notebook_reruns_in_one_kernel(name):
    errors = run_in_one_kernel(read(NOTEBOOK_DIR / name), PLANS[name])
    assert not errors, "\n".join(f"pass {n} cell {i}: {ename}: {evalue}"  # whole, not cut
                                  for n, i, ename, evalue in errors)
