"""Unit 4's recorders on real TensorFlow servers (2 engines: ps:0, ps:1, worker:0 on rank 0,
worker:1 on rank 1): bytes per step match the variables' sizes, staleness is 0 in sync mode,
and the seed's placement moves per-example tensors while the repaired one does not.

The graph and the training loop are the instructor notebook's own ``%%px`` cells (solutions
included), as ``course viz-gallery`` runs them; unit 5's lost worker is drawn by the gallery
test (its coordinator must run in a process that may exit without joining TF's threads).
"""

from __future__ import annotations

import os

import matplotlib
import pytest

matplotlib.use("Agg")

from course_utils import tf_dist  # noqa: E402
from course_utils.instructor.gallery import NOTEBOOKS, px_cells  # noqa: E402
from course_utils.tf_dist import record as trec  # noqa: E402
from course_utils.viz import ps as ps_traffic  # noqa: E402

pytestmark = [pytest.mark.cluster, pytest.mark.skip(reason=(
    "unit 4 was rewritten (the learner now starts the servers) after these recordings were "
    "written; its %%px cells no longer run on servers started first: to be rewired, see the "
    "closing note of this stop"))]

CID = f"pytest-viztf-{os.getpid()}"
STEPS = 24
W_BYTES, B_BYTES = 64 * 10 * 4, 10 * 4  # the seed's softmax regression, float32


@pytest.fixture(scope="module")
def runs():
    import course_utils as cu

    cc = cu.start(n=2, cluster_id=CID)
    try:
        cc.view.execute("import torch", block=True)  # torch before TF, as unit 4 does
        tf_dist.start_servers(cc, num_ps=2)
        cc.view.execute(px_cells(NOTEBOOKS / "04_tf_classic_ps.ipynb", "train"), block=False
                        ).get(timeout=180)
        out = {}
        for mode, sync in (("async", False), ("sync", True)):
            tf_dist.reset_ps(cc)
            out[mode] = [r for r in cc.run(trec.engine_record_ps, STEPS, sync, timeout=180) if r]
        out["placement"] = cc.run(trec.engine_placement,
                                  [("the seed", "seed_graph"), ("repaired", "build_graph")],
                                  timeout=60)
        yield out
    finally:
        tf_dist.teardown(cc)
        cc.stop(force=True)


def test_bytes_per_step_are_the_variables_sizes(runs):
    for mode in ("async", "sync"):
        assert [r["worker"] for r in runs[mode]] == [0, 1]
        for rec in runs[mode]:
            assert {(v["name"], v["task"], v["bytes"]) for v in rec["variables"]} >= {
                ("W", "/job:ps/task:0", W_BYTES), ("b", "/job:ps/task:1", B_BYTES)}
            per = ps_traffic.traffic_per_step(rec)
            # pulled: exactly the values of W (ps:0) and b (ps:1) a forward pass reads
            assert per[("pull", "ps:0")] == W_BYTES and per[("pull", "ps:1")] == B_BYTES
            # pushed: a gradient the size of each variable (+ the learning rate's 4 bytes,
            # + an 8-byte step tag in sync mode)
            assert W_BYTES <= per[("push", "ps:0")] <= W_BYTES + 16
            assert B_BYTES <= per[("push", "ps:1")] <= B_BYTES + 16
            total = ps_traffic.total_traffic(rec)
            assert total[("pull", "ps:0")] == W_BYTES * len(rec["steps"])
            assert not any(m["per_example"] for m in rec["traffic"])


def test_staleness_is_zero_in_sync_mode_and_counts_updates_in_async(runs):
    sync_steps = [s for r in runs["sync"] for s in r["steps"]]
    applied = [s for s in sync_steps if not s["dropped"]]
    assert applied and all(s["staleness"] == 0 for s in applied)
    assert len(applied) >= 2 * STEPS - 2  # every update averaged one gradient per worker
    async_steps = [s for r in runs["async"] for s in r["steps"]]
    assert all(s["staleness"] >= 0 and not s["dropped"] for s in async_steps)
    # async: global_step counts every worker's update, so the steps add up to it
    assert len(async_steps) == max(s["gs_after"] for s in async_steps)
    assert all(len(r["steps"]) >= 2 for r in runs["async"]), "both workers must train"
    for r in runs["async"] + runs["sync"]:
        assert all(s["end"] >= s["start"] for s in r["steps"]) and r["steps"][0]["first"]


def test_the_seed_ships_activations_to_the_ps_and_the_repair_does_not(runs):
    place = next(p for p in runs["placement"] if p and p["worker"] == 1)
    assert place["order"] == ["the seed", "repaired"]  # the figure draws them in this order
    seed, fixed = place["graphs"]["the seed"], place["graphs"]["repaired"]
    assert seed["ops"]["/job:ps/task:0"].get("loss", 0) > 0  # the seed's loss runs on the ps
    assert any(m["per_example"] for m in seed["traffic"])
    assert not any(m["per_example"] for m in fixed["traffic"])
    assert not any("loss" in roles for t, roles in fixed["ops"].items() if "/job:ps" in t)
    assert fixed["ops"]["/job:worker/task:1"].get("loss", 0) > 0


def test_ps_figures_render_from_the_run(runs):
    figs = [ps_traffic.ps_traffic({k: runs[k] for k in ("async", "sync")}),
            ps_traffic.staleness({k: runs[k] for k in ("async", "sync")}),
            ps_traffic.ps_step_timeline({k: runs[k] for k in ("async", "sync")}),
            ps_traffic.placement_diagram(next(p for p in runs["placement"] if p))]
    for fig in figs:
        fig.canvas.draw()
