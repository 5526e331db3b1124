"""The figures' data and drawing, without a cluster: every function of ``course_utils.viz``
(and the pure parts of the recorders) on hand-made or simulated records, rendered headless."""

from __future__ import annotations

import logging

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from course_utils import viz  # noqa: E402
from course_utils.instructor import gallery  # noqa: E402
from course_utils.tf_dist import record as trec  # noqa: E402
from course_utils.torch_dist import p2p  # noqa: E402
from course_utils.viz import cheatsheet, live, ring, style, timeline
from course_utils.viz import ps as ps_traffic  # noqa: E402


def _texts(fig) -> str:
    """Every title, suptitle and axis label of a figure, joined (to check they exist)."""
    parts = [fig._suptitle.get_text() if fig._suptitle else ""]
    for ax in fig.axes:
        parts += [ax.get_title(), ax.get_title(loc="left"), ax.get_xlabel(), ax.get_ylabel()]
    return " ".join(p for p in parts if p)


def _renders(fig) -> None:
    fig.canvas.draw()  # headless (Agg): raises if anything cannot be drawn
    assert _texts(fig), "a figure needs a title"
    plt.close(fig)


# ---- cost model ----------------------------------------------------------------------------
def test_alpha_beta_fit_recovers_known_parameters_from_noisy_ring_timings():
    rng = np.random.default_rng(0)
    alpha, beta, p = 40e-6, 1 / 2.5e9, 4
    sizes = [4 * 4**k for k in range(12)]
    times = viz.predict("ring", sizes, p, alpha, beta) * rng.uniform(0.97, 1.03, len(sizes))
    fit = viz.fit_alpha_beta(sizes, times, p)
    assert fit["alpha"] == pytest.approx(alpha, rel=0.05)
    assert fit["beta"] == pytest.approx(beta, rel=0.05)
    assert fit["bandwidth"] == pytest.approx(2.5e9, rel=0.05)
    assert fit["median_rel_error"] < 0.03
    line = viz.describe_fit(fit)
    assert "us per message" in line and "GB/s" in line


def test_predicted_costs_follow_the_models():
    a, b, n = 1e-5, 1e-9, 1e6
    assert viz.predict("ring", n, 4, a, b) == pytest.approx(6 * a + 1.5 * n * b)
    assert viz.predict("tree", n, 8, a, b) == pytest.approx(6 * (a + n * b))
    assert viz.predict("ps", n, 8, a, b) == pytest.approx(2 * (a + 8 * n * b))
    # The ring's bandwidth term stays below 2 n beta however many ranks: why it scales.
    assert viz.predict("ring", n, 1024, 0, b) < 2 * n * b < viz.predict("tree", n, 4, 0, b)
    assert float(viz.predict("ring", n, 1, a, b)) == 0.0
    with pytest.raises(ValueError):
        viz.predict("star", n, 4, a, b)
    with pytest.raises(ValueError):
        viz.fit_alpha_beta([1, 2], [1.0], 2)


def test_cost_model_figure_renders():
    sizes = [4 * 4**k for k in range(10)]
    times = viz.predict("ring", sizes, 2, 1e-4, 1e-9) * 1.1
    fig = viz.cost_model(sizes, times, 2)
    assert fig.axes[0].get_xscale() == "log" and fig.axes[0].get_yscale() == "log"
    assert fig.axes[0].get_legend() is not None
    _renders(fig)


# ---- DDP timeline --------------------------------------------------------------------------
def _ddp_record(rank: int, overlap: bool) -> dict:
    ev = [{"kind": "forward", "start": 0.0, "end": 0.01, "step": 0},
          {"kind": "backward", "start": 0.01, "end": 0.03, "step": 0},
          {"kind": "optimizer", "start": 0.045, "end": 0.05, "step": 0}]
    if overlap:
        ev += [{"kind": "all_reduce", "start": 0.02, "end": 0.03, "step": 0, "bucket": 0},
               {"kind": "all_reduce", "start": 0.025, "end": 0.04, "step": 0, "bucket": 1}]
    else:
        ev += [{"kind": "all_reduce", "start": 0.03, "end": 0.044, "step": 0, "bucket": 0}]
    return {"rank": rank, "events": ev, "steps": [(0.0, 0.05)], "bucket_cap_mb": 1.0,
            "bucket_bytes": [1 << 20] * (2 if overlap else 1), "grad_bytes": 2 << 20,
            "backend": "gloo"}


def test_overlap_and_exposed_communication():
    hidden = _ddp_record(0, True)
    # bucket 0 fully inside backward (10 ms), bucket 1 half (5 of 15 ms): 15 of 25 ms hidden
    assert timeline.overlap_fraction(hidden) == pytest.approx(15 / 25)
    assert timeline.comm_after_backward(hidden) == pytest.approx(0.01)
    late = _ddp_record(0, False)
    assert timeline.overlap_fraction(late) == 0.0
    assert timeline.comm_after_backward(late) == pytest.approx(0.014)
    assert timeline.sub_lanes([{"start": 0, "end": 2}, {"start": 1, "end": 3},
                               {"start": 2, "end": 4}]) == [0, 1, 0]


def test_ddp_timeline_renders_buckets():
    fig = viz.ddp_timeline({"bucket_cap_mb=25": [_ddp_record(0, False), _ddp_record(1, False)],
                            "bucket_cap_mb=1": [_ddp_record(0, True), _ddp_record(1, True)]})
    titles = _texts(fig)
    assert "1 bucket of 1 MiB" in titles and "2 buckets of 1 MiB" in titles
    assert "60% of all_reduce time overlaps backward" in titles
    _renders(fig)


# ---- live view -----------------------------------------------------------------------------
def _rows(n: int, rank: int) -> list[dict]:
    return [{"step": s, "loss": 2.0 / (s + 1) + rank, "step_time": 0.01,
             "samples_per_s": 100.0} for s in range(n)]


def test_live_view_is_static_under_nbval_and_keeps_every_row(monkeypatch):
    monkeypatch.setenv("IPP_NONINTERACTIVE", "1")
    assert live.live_possible() is False
    fig_view = live.LiveFigure(2)
    assert fig_view.live is False
    fig_view.update([_rows(5, 0), _rows(3, 1)])
    assert fig_view.log(1, step=3, loss=0.5, step_time=0.01, samples_per_s=100) is False
    assert fig_view.redraws == 0 and len(fig_view.rows[1]) == 4
    fig = fig_view.close()
    assert fig.axes[0].lines[0].get_xdata().tolist() == [0, 1, 2, 3, 4]
    assert "(step 4)" in fig._suptitle.get_text()  # both ranks finished 4 steps
    steps, total = live._throughput([_rows(3, 0), _rows(2, 1)])
    assert steps.tolist() == [0, 1] and total.tolist() == [200.0, 200.0]


def test_live_view_redraws_at_most_max_hz():
    view = live.LiveFigure(1, max_hz=2.0, live=True)
    drawn = [view.update([_rows(k, 0)]) for k in range(1, 6)]  # five updates at once
    assert drawn[0] is True and drawn[1:] == [False] * 4
    plt.close(view.fig)


class _Running:
    """The two things ``watch`` reads from an ipyparallel AsyncResult: ready/get and data."""

    def __init__(self, polls: int, rows: list[list[dict]]) -> None:
        self.polls, self.rows, self.msg_ids = polls, rows, [0, 1]

    def ready(self) -> bool:
        self.polls -= 1
        return self.polls < 0

    @property
    def data(self) -> list[dict]:
        return [{"course_live": r[: max(1, len(r) - self.polls)]} for r in self.rows]

    def get(self) -> list[None]:
        return [None, None]  # a %%px cell returns nothing: rows come from the publications


def test_watch_returns_the_published_rows_when_the_task_returns_none():
    rows = [_rows(6, 0), _rows(6, 1)]
    got = live.watch(_Running(3, rows), live=False, timeout=10)
    assert [len(r) for r in got] == [6, 6] and got[1][-1]["loss"] == rows[1][-1]["loss"]
    assert live.published_rows(object()) == []


def test_live_training_figure_renders():
    _renders(live.live_training([_rows(10, 0), _rows(10, 1)]))


# ---- ring replay ---------------------------------------------------------------------------
def simulate_ring(p: int, n: int) -> list[dict]:
    """What ``engine_record_ring_frames`` records for a textbook chunked ring, computed in plain
    Python (the learner's ring itself runs on engines in test_viz_torch)."""
    bounds = p2p.chunk_bounds(n, p)
    bufs = [[float(2**r * (i + 1)) for i in range(n)] for r in range(p)]
    recs = [{"rank": r, "world_size": p, "n": n, "frames": [], "sends": []} for r in range(p)]
    for phase in (0, 1):
        for s in range(p - 1):
            moves = []
            for r in range(p):
                a, b = bounds[(r - s + phase) % p]
                recs[r]["frames"].append(list(bufs[r]))
                recs[r]["sends"].append({"dst": (r + 1) % p, "start": a, "size": b - a})
                moves.append(((r + 1) % p, a, bufs[r][a:b]))
            for dst, a, vals in moves:
                for i, v in enumerate(vals):
                    bufs[dst][a + i] = bufs[dst][a + i] + v if phase == 0 else v
    for r in range(p):
        recs[r]["frames"].append(list(bufs[r]))
    return recs


@pytest.mark.parametrize("p,n", [(4, 8), (3, 7), (2, 4)])
def test_replay_decodes_who_contributed_to_every_chunk(p, n):
    rp = ring.replay_frames(simulate_ring(p, n))
    assert rp["steps"] == 2 * (p - 1)
    assert rp["phases"] == ["reduce-scatter"] * (p - 1) + ["all-gather"] * (p - 1) + ["done"]
    full = 2**p - 1
    assert rp["masks"][0] == [[2**r] * n for r in range(p)]  # before: only its own
    assert all(m == full for row in rp["masks"][-1] for m in row)  # after: everyone's
    bounds = p2p.chunk_bounds(n, p)
    after_rs = rp["masks"][p - 1]
    for r in range(p):  # after reduce-scatter rank r holds the full sum of chunk r+1
        a, b = bounds[(r + 1) % p]
        assert all(m == full for m in after_rs[r][a:b])
        assert sum(1 for c, (x, y) in enumerate(bounds)
                   if all(m == full for m in after_rs[r][x:y])) == 1
    assert all(len(rp["sends"][k]) == p for k in range(rp["steps"]))
    assert ring.contributors(0b1011) == [0, 1, 3] and ring._label(full, p) == "Σ all"


def test_ring_figures_and_animation_render():
    rp = ring.replay_frames(simulate_ring(4, 8))
    _renders(ring.ring_frame(rp, 1))
    _renders(ring.ring_replay(rp))
    rp = ring.replay_frames(simulate_ring(2, 4))  # 3 frames: enough to check the animation
    html = ring.animation_html(rp)
    assert "<script" in html and html.count("data:image/png;base64") >= rp["steps"] + 1


def test_ring_slider_steps_through_every_frame():
    rp = ring.replay_frames(simulate_ring(2, 4))
    box = ring.slider(rp)
    step = box.children[0]
    assert (step.min, step.max) == (0, rp["steps"])
    step.value = rp["steps"]  # redraws without error
    plt.close("all")


def test_show_displays_once_and_closes(monkeypatch):
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda obj: shown.append(obj))
    fig = viz.cheatsheet.collectives_cheatsheet(
        [{"rank": r, "trace": {"all_reduce": ([float(r + 1)], [3.0])}} for r in range(2)])
    assert viz.show(fig) is None and shown == [fig], "nothing returned: a cell's last line " \
        "would draw a returned figure again"
    assert not plt.fignum_exists(fig.number), "a shown figure is closed (no second drawing)"
    ring.show(ring.replay_frames(simulate_ring(2, 4)))
    assert "<script" in shown[1].data and shown[1].data.count("data:image/png") >= 3


# ---- cheat sheet ---------------------------------------------------------------------------
def test_cheatsheet_tells_inputs_from_sums_and_renders():
    p, w = 3, 2
    recs = []
    for r in range(p):
        mine = [10.0 * (r + 1) + j for j in range(w)]
        total = [sum(10.0 * (q + 1) + j for q in range(p)) for j in range(w)]
        recs.append({"rank": r, "trace": {"broadcast": (mine, [10.0, 11.0]),
                                          "all_reduce": (mine, total)}})
    owner = cheatsheet.origins(recs)
    assert owner[20.0] == 1 and 60.0 not in owner  # 60 = 10+20+30 is a sum, no one's input
    _renders(cheatsheet.collectives_cheatsheet(recs))


# ---- parameter servers ---------------------------------------------------------------------
def _ps_record(worker: int, sync: bool, staleness: list[float]) -> dict:
    traffic = [
        {"tensor": "MatMul/ReadVariableOp:0", "from": "/job:ps/task:0",
         "to": f"/job:worker/task:{worker}", "bytes": 2560, "per_example": False},
        {"tensor": "logits/ReadVariableOp:0", "from": "/job:ps/task:1",
         "to": f"/job:worker/task:{worker}", "bytes": 40, "per_example": False},
        {"tensor": "grad_W:0", "from": f"/job:worker/task:{worker}", "to": "/job:ps/task:0",
         "bytes": 2560, "per_example": False},
        {"tensor": "grad_b:0", "from": f"/job:worker/task:{worker}", "to": "/job:ps/task:1",
         "bytes": 40, "per_example": False}]
    steps = []
    for i, s in enumerate(staleness):
        row = {"start": 100.0 + i * 0.01 + worker * 0.003, "end": 100.008 + i * 0.01,
               "gs_before": float(i), "gs_after": float(i) + 1 + max(s, 0), "first": i == 0}
        if sync:
            row["tag"] = row["gs_before"] + min(s, 0)
        row.update(trec.step_staleness(row))
        steps.append(row)
    return {"worker": worker, "sync": sync, "steps": steps, "traffic": traffic, "batch": 64,
            "variables": []}


def test_ps_bytes_are_the_variables_sizes_times_the_steps():
    rec = _ps_record(1, False, [0, 1, 0, 2])
    per = ps_traffic.traffic_per_step(rec)
    assert per == {("pull", "ps:0"): 2560, ("pull", "ps:1"): 40, ("push", "ps:0"): 2560,
                   ("push", "ps:1"): 40}
    assert ps_traffic.total_traffic(rec)[("push", "ps:0")] == 4 * 2560
    assert ps_traffic.short_task("/job:ps/replica:0/task:1/device:CPU:0") == "ps:1"


def test_staleness_counts_sync_drops_never_count_as_stale_updates():
    async_st = ps_traffic.staleness_counts([_ps_record(0, False, [0, 1, 2, 1]), None])
    assert async_st["hist"] == {0: 1, 1: 2, 2: 1} and async_st["dropped"] == 0
    sync_st = ps_traffic.staleness_counts([_ps_record(0, True, [0, 0, -1, 0])])
    assert sync_st["hist"] == {0: 3} and sync_st["dropped"] == 1 and sync_st["mean"] == 0.0
    assert trec.step_staleness({"gs_before": 5, "gs_after": 9}) == {"staleness": 3,
                                                                    "dropped": False}
    assert trec.step_staleness({"gs_before": 5, "gs_after": 6, "tag": 4})["dropped"] is True


def test_ps_figures_render():
    runs = {"async": [_ps_record(0, False, [0, 1, 0]), _ps_record(1, False, [1, 0, 2])],
            "sync": [_ps_record(0, True, [0, 0, -1]), _ps_record(1, True, [0, 0, 0])]}
    for fig in (ps_traffic.ps_traffic(runs), ps_traffic.staleness(runs),
                ps_traffic.ps_step_timeline(runs)):
        _renders(fig)
    placement = {"worker": 1, "batch": 64, "order": ["the seed", "repaired"], "graphs": {
        "repaired": {"ops": {"/job:worker/task:1": {"forward": 2, "loss": 1},
                             "/job:ps/task:0": {"variables": 2, "update": 1}},
                     "traffic": _ps_record(1, False, [0])["traffic"][::2]},
        "the seed": {"ops": {"/job:worker/task:0": {"forward": 3}, "/job:ps/task:0": {"loss": 4}},
                     "traffic": [{"tensor": "Softmax:0", "from": "/job:worker/task:0",
                                  "to": "/job:ps/task:0", "bytes": 2560,
                                  "per_example": True}]}}}
    fig = ps_traffic.placement_diagram(placement)
    assert [ax.get_title() for ax in fig.axes[:2]] == [
        "the seed: 2.5 KiB cross tasks per step", "repaired: 5 KiB cross tasks per step"]
    _renders(fig)


def test_closure_timeline_infers_the_retried_closure_and_renders():
    rows = [{"closure": i, "worker": i % 2, "scheduled": 0.0, "start": 1.0 + 0.1 * i,
             "end": 1.05 + 0.1 * i} for i in range(10)]
    rows[3].update(worker=0, start=3.0, end=3.05)  # put back to the end of the queue
    assert ps_traffic.retried_closures(rows, 1) == [3]
    events = [{"time": 2.0, "event": "failed", "worker": 1},
              {"time": 2.01, "event": "put_back", "worker": 1}]
    _renders(ps_traffic.closure_timeline(rows, events, killed_at=1.9))


def test_record_coordinator_timestamps_the_coordinator_log():
    from course_utils import tf_dist

    log = logging.getLogger("tensorflow")
    with tf_dist.watch_coordinator() as seen, trec.record_coordinator() as events:
        log.error("Worker %s failed with %r:%s", "/job:worker/replica:0/task:1", "x", "y")
        log.info("[Worker %d] Putting back a closure after it failed.", 1)
        log.info("something else")
    assert [(e["event"], e["worker"]) for e in events] == [("failed", 1), ("put_back", 1)]
    assert seen["worker_failures"] == 1 and seen["retried"] == 1  # both see the same log
    assert log.level == logging.CRITICAL


# ---- style and gallery ---------------------------------------------------------------------
def test_palette_and_helpers():
    assert len(set(style.CYCLE)) == len(style.CYCLE) == 8
    assert style.rank_color(9) == style.CYCLE[1]
    assert style.text_color("#000000") == "white" and style.text_color("#F0E442") == "black"
    assert style.human_bytes(1536) == "1.5 KiB" and style.human_bytes(2 << 20) == "2 MiB"
    assert style.human_bytes(40) == "40 B"


def test_gallery_takes_the_notebooks_px_cells_up_to_a_definition():
    code = gallery.px_cells(gallery.NOTEBOOKS / "01_collectives.ipynb", "ring_all_reduce")
    assert "def ring_all_reduce(" in code and "%%px" not in code
    assert code.index("import torch") < code.index("def ring_all_reduce(")
    with pytest.raises(LookupError):
        gallery.px_cells(gallery.NOTEBOOKS / "01_collectives.ipynb", "no_such_function")
    assert len({name for name, _ in gallery.FIGURES}) == len(gallery.FIGURES) == 18
