"""Unit 10's helpers without a cluster: the formulas, the figure, the byte counts of real
tensors, and the graded probes on a world of their own gloo processes (``checks.spawn``)
with the notebook's own solution cells, and with a planted mistake, which must fail."""

from __future__ import annotations

import tempfile

import pytest

from course_utils.assignments.lessons import NOTEBOOK_DIR, read
from course_utils.checks import spawn
from course_utils.errors import CourseError
from course_utils.notebook_cells import nbgrader_meta
from course_utils.procs import pids_running
from course_utils.torch_dist import sharding
from course_utils.viz import memory

NB = NOTEBOOK_DIR / "10_sharding_and_memory.ipynb"


def _cell(grade_id: str) -> str:
    cell = next(c for c in read(NB).cells if nbgrader_meta(c).get("grade_id") == grade_id)
    return "\n".join(ln for ln in cell.source.splitlines() if not ln.startswith("%%"))


def test_formulas():
    f = sharding.formula_bytes(1000, 4)
    assert f["DDP"] == {"params": 4000, "grads": 4000, "optimizer": 8000}
    assert f["ZeRO-1"]["optimizer"] == 2000 and f["FSDP"]["params"] == 1000
    assert sharding.padded_chunk(10, 4) == 3 and sharding.padded_chunk(8, 4) == 2
    # 195 elements on 2 ranks: padded to 196; 3 collectives of (p-1)/p of it, 4 bytes each
    assert sharding.fsdp_sent_bytes([195], 2) == 3 * 0.5 * 196 * 4
    assert sharding.ddp_sent_bytes(1000, 4) == 2 * 3 / 4 * 4000


def test_bytes_of_real_tensors_and_adam_state():
    import torch

    model = sharding.mlp(8, 3, n_in=4, n_out=2)
    n = sum(q.numel() for q in model.parameters())
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    held = sharding.memory_of(model, sharding.optimizer_state_bytes(opt))
    steps = len(list(model.parameters())) * 4          # Adam's `step`: a 4-byte scalar each
    assert held == {"params": 4 * n, "grads": 4 * n, "optimizer": 8 * n + steps}
    view = model[0].weight.view(-1)                        # a view shares storage: once
    assert sharding.tensor_bytes([model[0].weight, view]) == 4 * model[0].weight.numel()


def test_memory_bars_is_a_figure_of_every_rank_and_strategy():
    rows = [{"rank": r, "strategy": s, "params": 400, "grads": 400, "optimizer": o}
            for s, o in (("ddp", 800), ("zero1", 400)) for r in range(2)]
    fig = memory.memory_bars(rows, sharding.LABELS)
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert len(fig.axes[0].patches) == 12 and "rank 1" in labels[1]
    assert memory.totals(rows) == {"ddp": 1600.0, "zero1": 1200.0}


def test_step_time_line_compares_the_slowest_ranks():
    rows = {name: [{"step_s": a}, {"step_s": b}] for name, a, b in (
        ("ddp", 0.001, 0.001), ("zero1", 0.002, 0.003), ("zero_torch", 0.0015, 0.001),
        ("fsdp_hand", 0.004, 0.002), ("fsdp2", 0.002, 0.002))}
    assert sharding.step_time_line(rows) == (
        "step time (slowest rank's median): yours 3.0 ms vs ZeroRedundancyOptimizer 1.5 ms "
        "(2.00x); HandFSDP 4.0 ms vs fully_shard 2.0 ms (2.00x)")


@pytest.mark.timeout(400)
def test_zero1_solution_passes_on_4_ranks_and_a_mistake_fails():
    sources = [_cell("ex1a-solution"), _cell("ex1-solution")]
    res = spawn("engine_check_zero1", 4, timeout=300,
                       sources=sources)
    assert [r["rank"] for r in res] == [0, 1, 2, 3]
    for r in res:
        assert r["max_weight_diff"] < 1e-6 and r["tied"] and r["frozen_changed"] == 0
        assert r["held_bytes"] <= 1.6 * r["adam_state_bytes"] / 4 + 256
    # the same cell without the de-duplication keeps a tied weight twice: too many bytes
    twice = sources[1].replace("id(prm) not in seen", "True")
    res = spawn("engine_check_zero1", 2, timeout=300,
                       sources=[sources[0], twice])
    assert res[0]["held_bytes"] > 1.6 * res[0]["adam_state_bytes"] / 2 + 256


@pytest.mark.timeout(400)
def test_fsdp_solution_passes_on_4_ranks():
    res = spawn("engine_check_fsdp", 4, timeout=300,
                       sources=[_cell("ex2-solution")])
    want = sharding.fsdp_sent_bytes(res[0]["layer_numels"], 4)
    for r in res:
        assert r["weight_diff"] is not None and r["weight_diff"] < 1e-5
        for s in r["steps"]:
            assert s["calls"] == {"all_gather_into_tensor": 12, "reduce_scatter_tensor": 6}
            assert abs(s["sent"] - want) < 0.01 * want
            assert s["peak_live"] <= 2 * r["layer_bytes"] < r["model_bytes"]


@pytest.mark.timeout(200)
def test_a_rank_that_fails_is_reported_at_once_and_nothing_is_left(monkeypatch, tmp_path):
    # rank 1 fails; rank 0 waits in a barrier it will never leave: the runner must not wait
    broken = "if rank == 1:\n    raise RuntimeError('rank one broke')\ndist.barrier()\n"
    # this world's spec lies under tmp_path, so its processes' command lines name it (other
    # files' checks run worlds of their own at the same time on other workers)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(CourseError, match=r"rank 1 of the 2-rank check failed.*rank one broke"):
        spawn("engine_check_bounds", 2, timeout=150,
                     sources=[broken])
    assert not list(pids_running(str(tmp_path)))
