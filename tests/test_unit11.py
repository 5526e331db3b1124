"""Unit 11's helpers without a cluster: the formulas, the timed stage, the schedule figure, the
comparison table, and the graded probes on worlds of their own gloo processes
(``checks.spawn``) with the notebook's own solution cells, and with planted mistakes, which
must fail as the text says."""

from __future__ import annotations

import pytest

from course_utils.assignments.lessons import NOTEBOOK_DIR, read
from course_utils.checks import first_failure, spawn
from course_utils.notebook_cells import nbgrader_meta
from course_utils.torch_dist import parallelism as par
from course_utils.torch_dist import strategies
from course_utils.viz import pipeline
from tests.several import spawn_several

NB = NOTEBOOK_DIR / "11_tensor_and_pipeline.ipynb"


def _cell(grade_id: str) -> str:
    cell = next(c for c in read(NB).cells if nbgrader_meta(c).get("grade_id") == grade_id)
    return "\n".join(ln for ln in cell.source.splitlines() if not ln.startswith("%%"))


def _sources(*grade_ids: str) -> list[str]:
    return [_cell("engine-imports"), *(_cell(g) for g in grade_ids)]


def test_formulas():
    assert par.bubble_formula(4, 8) == 3 / 11 and par.bubble_formula(1, 3) == 0
    # two all_reduces of (8, 16) fp32 activations on 4 ranks, 2·3/4 of 512 B each
    assert par.tp_sent_bytes(8, 16, 4) == 2 * 1.5 * 512
    assert par.pp_sent_bytes(4, 8, 16) == 2 * 4 * 512
    block = par.mlp_block()
    assert [type(m).__name__ for m in block] == ["Linear", "GELU", "Linear"]
    assert sum(q.numel() for q in strategies.model().parameters()) == 4 * 2128


def _events(spans):
    return [(k, i, a, b) for k, i, a, b in spans]


def test_bubble_measured_is_the_idle_share_of_all_ranks():
    # rank 0 busy 0-1 and 3-4, rank 1 busy 1-3: span 4 on 2 ranks, busy 4 of 8
    lanes = [_events([("F", 0, 0.0, 1.0), ("B", 0, 3.0, 4.0)]),
             _events([("F", 0, 1.0, 2.0), ("B", 0, 2.0, 3.0)])]
    assert par.bubble_measured(lanes) == 0.5


def test_timed_stage_records_each_microbatch_and_the_activations_alive():
    import torch

    from course_utils.torch_dist.pipeline_stage import TimedStage

    stage = TimedStage(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh()))
    ys = [stage(torch.randn(2, 4)) for _ in range(3)]
    assert stage.most_in_flight() == 3 and stage.live == stage.peak_live > 0
    for y in ys:
        y.sum().backward()
    assert [e[:2] for e in stage.events] == [("F", 0), ("F", 1), ("F", 2),
                                             ("B", 0), ("B", 1), ("B", 2)]
    assert stage.live == 0 and all(e[2] <= e[3] for e in stage.events)
    with torch.no_grad():  # a look at shapes, as torch's PipelineStage may take: not a step
        stage(torch.randn(2, 4))
    assert len(stage.events) == 6


def test_pipeline_figure_draws_a_lane_per_rank_and_says_the_idle_share():
    res = [{"events": [("F", 0, 0.0, 0.001), ("B", 0, 0.003, 0.004)]},
           {"events": [("F", 0, 0.001, 0.002), ("B", 0, 0.002, 0.003)]}]
    fig = pipeline.pipeline_schedule({"GPipe": res, "1F1B": res}, formula={"GPipe": 0.25})
    axes = fig.axes
    assert len(axes) == 2 and [t.get_text() for t in axes[0].get_yticklabels()] == [
        "rank 0", "rank 1"]
    assert "idle 50%" in axes[0].get_title() and "25%" in axes[0].get_title()
    assert "25%" not in axes[1].get_title()


def test_comparison_table_takes_the_most_any_rank_holds_and_sends():
    rows = [{"strategy": s, "rank": r, "weights": 100 * (r + 1), "grads": 0, "adam": 0,
             "sent": 10.0 * r, "calls": {"all_reduce": 1}}
            for s in strategies.ORDER for r in range(2)]
    text = strategies.table(rows, n_params=25)
    assert text.count("\n") == len(strategies.ORDER)
    assert "200 B" in text and "50%" in text and "all_reduce ×1" in text


@pytest.mark.timeout(240)
def test_solutions_pass_on_2_ranks_and_each_send_is_counted_once():
    sources = _sources("ex1a-solution", "ex1-solution", "ex2-solution", "ex2b-solution")
    # batch_isend_irecv's P2POp looks isend up in distributed_c10d: the spy is there too
    batched = sources[3].replace("def gpipe_step(", "def gpipe_batched(").replace(
        "dist.send(y.detach(), rank + 1)", "dist.batch_isend_irecv("
        "[dist.P2POp(dist.isend, y.detach(), rank + 1)])[0].wait()")
    pp = {"m": 3, "rows": 4, "width": 16}
    tp, conj, gpipe, ofob, batch = spawn_several(
        2, [("engine_check_tp", {}), ("engine_check_conjugates", {}),
            *[("engine_check_pipeline", {"fn_name": fn, **pp})
              for fn in ("gpipe_step", "one_f_one_b_step", "gpipe_batched")]],
        sources=[*sources, batched], timeout=150, collective_timeout=20)
    for r in tp:
        assert r["out_diff"] < 1e-5 and r["x_grad_diff"] < 1e-5, r
        assert max(r["grad_diff"].values()) < 1e-5 and r["shapes"] == r["want_shapes"]
        assert (r["forward_calls"], r["backward_calls"]) == ({"all_reduce": 1},) * 2
        assert r["sent"] == par.tp_sent_bytes(8, par.D_MODEL, 2)
        assert all(d["out_diff"] < 1e-5 for d in r["more"].values())
    for r in conj:
        for dtype, case in r["cases"].items():
            for c in case.values():
                assert c["y_diff"] == c["grad_diff"] == c["input_changed"] == 0
                assert c["dtypes"] == [f"torch.{dtype}"] * 2
    assert [r["calls"] for r in gpipe] == [{"send": 3}] * 2  # send calls isend: counted once
    assert [r["in_flight"] for r in gpipe] == [3, 3] and gpipe[1]["loss"] is not None
    assert [r["in_flight"] for r in ofob] == [2, 1] and all(r["grad_diff"] < 1e-6 for r in ofob)
    assert [r["tensor_sends"] for r in ofob] == [3, 3]
    assert batch[0]["calls"] == {"isend": 3} and batch[0]["grad_diff"] < 1e-6


@pytest.mark.timeout(120)
def test_a_rank_that_fails_before_its_collective_is_named_and_its_peer_freed_at_once():
    uneven = [s.replace("rows = slice(rank * c, (rank + 1) * c)",
                        "rows = slice(rank * c, (rank + 2) * c)")
              for s in _sources("ex1a-solution", "ex1-solution")]
    failed = spawn("engine_check_tp", 2, timeout=60, collective_timeout=30, sources=uneven)
    first = first_failure(failed)
    assert first["rank"] == 0 and "shapes cannot be multiplied" in first["error"]
    assert "line" in first["line"] and "by peer" in failed[1]["error"]  # closed, or reset
    # (the catalogue plants the other mistakes in the notebook: tests/mistakes/u11_*.py)


@pytest.mark.timeout(240)
def test_torchs_own_on_a_2_by_2_mesh_and_its_1f1b_match_one_process():
    two_d, pipe = spawn_several(
        4, [("engine_check_torch_2d", {}),
            ("engine_check_pipeline", {"fn_name": "torch_1f1b", "m": 4, "rows": 4, "width": 16})],
        sources=_sources("ex3-solution", "ex3b-solution"), timeout=150, collective_timeout=20)
    for r in two_d:
        assert r["out_diff"] < 1e-5 and r["weight_diff"] < 1e-5 and not r["missing"], r
        assert all(d == ["dp", "tp"] for d in r["mesh_dims"].values())
    assert [r["in_flight"] for r in pipe] == [4, 3, 2, 1]
    assert all(r["grad_diff"] < 1e-6 for r in pipe) and pipe[-1]["loss"] is not None
