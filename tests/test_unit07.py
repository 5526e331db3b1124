"""Unit 7 (``07_performance``): the graded checks' verdicts, the sentences chosen by the
measurement, the figures of DDP's and the learner's buckets, and Exercise 2's check on a real
gloo group of its own (frozen and tied parameters, the student stub)."""

from __future__ import annotations

import numpy as np
import pytest

from course_utils import checks, viz
from course_utils.assignments.lessons import NOTEBOOK_DIR, read
from course_utils.instructor.graded_tests import with_solution
from course_utils.torch_dist import perf


# ---- Exercise 1, graded at p = 2, 3, 4 ------------------------------------------------------
def _fit(sizes, seconds, p):
    n, t = np.asarray(sizes, float), np.asarray(seconds, float)
    b, a = np.polyfit(n, t, 1, w=1.0 / t)
    return max(float(a), 0.0) / (2 * (p - 1)), float(b) * p / (2 * (p - 1))


def _predict(alpha, beta, nbytes, p):
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes * beta


def test_alpha_beta_problem_passes_the_ring_reading_and_names_each_fix():
    assert checks.alpha_beta_problem(_fit, _predict) == ""
    two = checks.alpha_beta_problem(lambda s, t, p: (_fit(s, t, 2)[0], _fit(s, t, 2)[1]),
                                    _predict)
    assert "with p=3 ranks" in two and "with the p passed in" in two

    def swapped(sizes, seconds, p):
        a, b = np.polyfit(np.asarray(sizes, float), np.asarray(seconds, float), 1)
        return max(float(a), 0.0) / (2 * (p - 1)), float(b) * p / (2 * (p - 1))

    assert "returns (slope, intercept)" in checks.alpha_beta_problem(swapped, _predict)
    wrong = checks.alpha_beta_problem(_fit, lambda a, b, n, p: 2 * a + n * b)
    assert wrong.startswith("predict_seconds(") and ", 3)" in wrong
    # beta read 1.5x off (3(p-1) for 2(p-1)): beta is about 1e-9 s/B, below numpy's atol
    off = checks.alpha_beta_problem(lambda s, t, p: (_fit(s, t, p)[0], _fit(s, t, p)[1] / 1.5),
                                    _predict)
    assert "with p=2 ranks" in off and "beta = b·p / (2(p-1))" in off


# ---- Exercise 2's verdict, most telling message first ---------------------------------------
def _result(**step: object) -> dict:
    s = {"launches": 4, "async": 4, "values": 1000, "lead_s": 0.01, "waited_in_backward": 0,
         "never_waited": 0, "pending_after": 0, "sizes": [250] * 4, "want_sizes": [250] * 4,
         **step}
    return {"rank": 0, "world_size": 2, "grad_values": 1000, "steps": [s],
            "frozen_equal": True, "grad_ratio": 1.0, "max_weight_diff": 0.0}


@pytest.mark.parametrize(("step", "fix"), [
    ({}, ""),
    ({"waited_in_backward": 4, "lead_s": 0.01}, "wait only in sync()"),
    # launched only in sync(): one bucket, after backward; the fix comes before "several"
    ({"launches": 1, "async": 1, "lead_s": -0.002}, "launch full buckets from the hook"),
    ({"launches": 1, "async": 1}, "expected several buckets per step, found 1"),
    ({"async": 0}, "async_op=True"),
    ({"values": 700}, "launch the last, partial bucket first"),
    ({"values": 1300}, "register one hook per parameter"),
    # a full bucket kept until one more gradient came (> for >=): same values, other buckets
    ({"sizes": [500, 500]}, "as soon as the bucket holds at least self.cap bytes (>=)"),
    ({"never_waited": 2}, "call work.wait() on every pending bucket"),
    ({"pending_after": 1}, "leave no pending work behind"),
])
def test_overlap_dp_problem_order(step, fix):
    got = checks.overlap_dp_problem(_result(**step))
    assert (fix in got) if fix else got == ""


def test_buckets_by_rule_launches_at_the_cap_and_sync_sends_the_rest():
    from course_utils.checks.performance import buckets_by_rule

    # 4-byte values, cap 1000 bytes: 250 values fill a bucket exactly (>= launches it)
    assert buckets_by_rule([250, 10, 240, 100], 1000, 4) == [250, 250, 100]
    assert buckets_by_rule([100, 100], 1000, 4) == [200]
    assert buckets_by_rule([], 1000, 4) == []


def test_the_checks_cap_is_met_exactly_so_launching_only_above_it_shows():
    """The graded check's cap equals a bucket's bytes in the real backward order, so a hook
    written with > instead of >= launches different buckets (and the check names it)."""
    import torch
    import torch.nn.functional as F

    from course_utils.checks.performance import CHECK_CAP_MB, buckets_by_rule, frozen_tied_mlp

    model, order = frozen_tied_mlp(seed=0), []
    for q in model.parameters():
        if q.requires_grad:
            q.register_post_accumulate_grad_hook(lambda g: order.append(g.numel()))
    F.cross_entropy(model(torch.randn(4, 256)), torch.randint(0, 10, (4,))).backward()
    cap = int(CHECK_CAP_MB * 2**20)
    at_or_above = buckets_by_rule(order, cap, 4)
    assert cap // 4 in at_or_above  # one bucket holds exactly the cap
    above = buckets_by_rule(order, cap + 1, 4)  # what "launch when > cap" makes
    assert above != at_or_above and sum(above) == sum(at_or_above)


def test_overlap_dp_problem_divide_frozen_and_weights():
    r = _result()
    assert "divide the summed gradients by world_size (2 here)" in checks.overlap_dp_problem(
        {**r, "grad_ratio": 2.0})
    assert "1.5x" in checks.overlap_dp_problem({**r, "world_size": 3, "grad_ratio": 1.5})
    assert "frozen ones too" in checks.overlap_dp_problem({**r, "frozen_equal": False,
                                                          "grad_ratio": 1.3})
    assert "copy every slice" in checks.overlap_dp_problem({**r, "max_weight_diff": 1e-2})


# ---- statements chosen by the measurement ---------------------------------------------------
def test_ring_sentence_follows_the_numbers():
    sizes, gloo = [4.0, 4 * 2**20], [100e-6, 10e-3]
    faster = perf.ring_vs_gloo(sizes, gloo, [62e-6, 10.5e-3], 2)
    assert "0.62x gloo's time: yours was faster" in faster
    assert "1.05x: about the same" in faster and "4 MiB" in faster
    assert "gloo's was faster" in perf.ring_vs_gloo(sizes, gloo, [300e-6, 30e-3], 2)


def _ddp_record(launch_early: bool) -> dict:
    red = {"kind": "all_reduce", "start": 0.03, "end": 0.04, "step": 0, "bucket": 0,
           "launch": 0.015, "launched_early": launch_early}
    return {"rank": 0, "steps": [(0.0, 0.05)], "bucket_bytes": [1 << 20], "grad_bytes": 1 << 20,
            "backend": "gloo", "events": [
                {"kind": "forward", "start": 0.0, "end": 0.01, "step": 0},
                {"kind": "backward", "start": 0.01, "end": 0.025, "step": 0}, red]}


def test_launched_during_backward_and_the_launch_marks():
    assert viz.launched_during_backward(_ddp_record(True)) == 1.0
    assert viz.launched_during_backward(_ddp_record(False)) == 0.0
    old = _ddp_record(True)
    for e in old["events"]:
        e.pop("launch", None)
        e.pop("launched_early", None)
    assert np.isnan(viz.launched_during_backward(old))
    fig = viz.ddp_timeline({"a": [_ddp_record(True)], "b": [old]})
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any("launched by DDP" in s for s in labels)
    fig.canvas.draw()


def test_overlap_dp_timeline_draws_hooks_and_buckets():
    res = {"rank": 1, "world_size": 2, "timeline": {
        "backward": [0.0, 0.004], "sync_end": 0.006, "bucket_of": {"0": 0, "1": 0, "2": 1},
        "hooks": [(0.001, 0, 100), (0.0015, 1, 65536), (0.003, 2, 65536)],
        "launches": [{"t": 0.0016, "numel": 65636, "done": 0.0035},
                     {"t": 0.0045, "numel": 65536, "done": None}]}}
    fig = viz.overlap_dp_timeline(res)
    text = " ".join(t.get_text() for ax in fig.axes for t in ax.texts)
    assert "b0 (" in text and "b1 (" in text
    assert "2 buckets, 3 hooks" in fig.axes[0].get_title(loc="left")
    fig.canvas.draw()


# ---- Exercise 2's check on a real gloo group of its own -------------------------------------
def _cell(**regions: str) -> str:
    note = read(NOTEBOOK_DIR / "07_performance.ipynb")
    for i, body in sorted(regions.items()):
        note = with_solution(note, "ex2-solution", body, region=int(i[1:]))
    cell = next(c for c in note.cells
                if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "ex2-solution")
    return "import torch\nimport torch.distributed as dist\n" + cell.source.replace("%%px\n", "")


def test_solution_equals_ddp_with_frozen_and_tied_and_the_stub_fails():
    """One real run per case, on 2 forked ranks (plain gloo): the solution matches torch DDP
    on the model with a frozen bias and a tied weight; the stub and a hook on the frozen bias
    fail, naming the fix; a tied weight hooked twice is caught."""
    got = checks.overlap_dp_at(2, source=_cell(), steps=2)
    assert [checks.overlap_dp_problem(r) for r in got] == ["", ""]
    assert all(r["max_weight_diff"] < 1e-5 and r["n_params"] == 7 for r in got)
    with pytest.raises(RuntimeError, match="NotImplementedError"):
        checks.overlap_dp_at(2, source=_cell(r0="raise NotImplementedError()"), steps=1)
    every = ("for prm in model.parameters():\n    dist.broadcast(prm.data, src=0)\n"
             "    prm.register_post_accumulate_grad_hook(self._hook)")
    with pytest.raises(RuntimeError, match="register hooks only on parameters that require"):
        checks.overlap_dp_at(2, source=_cell(r0=every), steps=1)
    twice = ("for m in model.modules():\n    for prm in m.parameters(recurse=False):\n"
             "        dist.broadcast(prm.data, src=0)\n        if prm.requires_grad:\n"
             "            prm.register_post_accumulate_grad_hook(self._hook)")
    tied = checks.overlap_dp_at(2, source=_cell(r0=twice), steps=1)
    assert "register one hook per parameter" in checks.overlap_dp_problem(tied[0])
