"""Unit 4's recorders on real TensorFlow servers (2 engines: ps:0, ps:1, worker:0 on rank 0,
worker:1 on rank 1): bytes per step match the variables' sizes, staleness is 0 in sync mode,
the measured steps/s tell async from sync, and the original program's placement moves
per-example tensors while the repaired one does not.

One cluster for the module: ``gallery.load_unit4`` starts the servers and runs the instructor
notebook's own ``build_graph``, ``original_graph`` and ``train`` (solution cells, picked by
their nbgrader ids), as ``course viz-gallery`` does; then one async and one sync recording
(``tf_dist.record.record_ps``) and one placement serve every test. Unit 5's lost worker is
drawn by the gallery test (its coordinator must run in a process that may exit without joining
TF's threads).
"""

from __future__ import annotations

import logging
import os

import matplotlib
import pytest

matplotlib.use("Agg")

from course_utils.instructor.gallery import UNIT4_PLACEMENT, load_unit4  # noqa: E402
from course_utils.tf_dist import coordinator as tcoord  # noqa: E402
from course_utils.tf_dist import record as trec  # noqa: E402
from course_utils.viz import ps as ps_traffic  # noqa: E402

CID = f"pytest-viztf-{os.getpid()}"
STEPS = 24
W_BYTES, B_BYTES = 64 * 10 * 4, 10 * 4  # unit 4's softmax regression, float32


@pytest.fixture(scope="module")
def runs():
    import course_utils as cu
    from course_utils import tf_dist

    cc = cu.start(n=2, cluster_id=CID, preload=["tensorflow"])
    try:
        load_unit4(cc, num_ps=2)
        out = dict(trec.record_ps(cc, STEPS, timeout=180))
        out["placement"] = trec.placement(cc, UNIT4_PLACEMENT)
        yield out
    finally:
        tf_dist.stop_servers(cc)
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


def test_measured_steps_per_second_tell_async_from_sync(runs):
    fast, slow = (ps_traffic.throughput(runs[m]) for m in ("async", "sync"))
    for got in (fast, slow):
        assert got["seconds"] > 0 and got["updates_per_s"] > 0
        assert got["updates_per_s"] == pytest.approx(got["updates"] / got["seconds"])
    # async: one update per gradient; sync: one update per 2 gradients (one per worker)
    assert fast["updates"] == pytest.approx(fast["gradients"], abs=1)
    assert slow["gradients"] == pytest.approx(2 * slow["updates"], abs=3)


def test_the_original_ships_activations_to_the_ps_and_the_repair_does_not(runs):
    place = runs["placement"]
    assert place["worker"] == 1
    assert place["order"] == [label for label, _ in UNIT4_PLACEMENT]  # drawn in this order
    original, fixed = (place["graphs"][label] for label, _ in UNIT4_PLACEMENT)
    assert original["ops"]["/job:ps/task:0"].get("loss", 0) > 0  # its loss runs on the ps
    assert any(m["per_example"] for m in original["traffic"])
    assert not any(m["per_example"] for m in fixed["traffic"])
    assert not any("loss" in roles for t, roles in fixed["ops"].items() if "/job:ps" in t)
    assert fixed["ops"]["/job:worker/task:1"].get("loss", 0) > 0


def test_ps_figures_render_from_the_run(runs):
    modes = {k: runs[k] for k in ("async", "sync")}
    figs = [ps_traffic.ps_traffic(modes), ps_traffic.staleness(modes),
            ps_traffic.ps_step_timeline(modes), ps_traffic.placement_diagram(runs["placement"])]
    for fig in figs:
        fig.canvas.draw()
        drawn = [ax for ax in fig.axes if ax.lines or ax.patches or ax.collections or ax.texts]
        assert drawn, f"{fig.axes[0].get_title() if fig.axes else fig}: nothing drawn"


def test_ps_figures_say_when_there_is_nothing_to_draw():
    # The gallery once failed deep in matplotlib's add_gridspec ("0 columns") after the
    # recording failed: the figures now name the missing input.
    for fig in (ps_traffic.ps_traffic, ps_traffic.staleness, ps_traffic.ps_step_timeline):
        with pytest.raises(ValueError, match="no recorded runs"):
            fig({})
        with pytest.raises(ValueError, match=r"no worker's record for \['sync'\]"):
            fig({"sync": [None]})


def test_one_reader_of_the_coordinator_log_counts_and_timestamps():
    assert tcoord.coordinator_event("[Worker 1] Putting back a closure after it failed.") == (
        "put_back", "retried", 1)
    assert tcoord.coordinator_event(
        "Worker /job:worker/replica:0/task:1 failed with 'x':y") == ("failed", "worker_failures", 1)
    assert tcoord.coordinator_event("Cluster now being recovered.") == (
        "recovering", "recovering", -1)
    assert tcoord.coordinator_event("Remote function on worker w failed with e") is None
    log = logging.getLogger("tensorflow")
    with tcoord.watch_coordinator() as outer:
        with trec.record_coordinator() as events:
            log.info("[Worker %d] Putting back a closure after it failed.", 0)
        assert log.level == logging.INFO  # the outer block still listens
        log.info("Worker %s has been recovered.", "/job:worker/replica:0/task:1")
    assert [e["event"] for e in events] == ["put_back"]
    assert [(e["event"], e["worker"]) for e in outer.events] == [("put_back", 0),
                                                                 ("recovered", 1)]
    assert outer["retried"] == 1 and outer["recovered"] == 1
    assert log.level == logging.CRITICAL
