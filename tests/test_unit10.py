"""Unit 10's helpers without a cluster: the formulas, the figure, the byte counts of real
tensors, and the graded probes on a world of their own gloo processes (``checks.spawn``)
with the notebook's own solution cells, and with a planted mistake, which must fail."""

from __future__ import annotations

import tempfile

import pytest

from course_utils.assignments.lessons import NOTEBOOK_DIR, read
from course_utils.checks import function_problem, spawn
from course_utils.errors import CourseError
from course_utils.notebook_cells import nbgrader_meta
from course_utils.procs import pids_running
from course_utils.torch_dist import dcp_resume, fsdp_lifecycle, sharding
from course_utils.viz import memory
from tests.several import spawn_several

NB = NOTEBOOK_DIR / "10_sharding_and_memory.ipynb"


def _cell(grade_id: str) -> str:
    cell = next(c for c in read(NB).cells if nbgrader_meta(c).get("grade_id") == grade_id)
    return "\n".join(ln for ln in cell.source.splitlines() if not ln.startswith("%%"))


def test_formulas():
    f = sharding.formula_bytes(1000, 4)
    # DDP's default buckets are a second copy of the gradients: 20 B per parameter with Adam
    assert f["DDP"] == {"params": 4000, "grads": 4000, "buckets": 4000, "optimizer": 8000}
    assert sum(f["DDP, bucket views"].values()) == 16000
    assert f["ZeRO-1"]["optimizer"] == 2000 and f["ZeRO-1"]["buckets"] == 0  # no DDP
    assert f["ZeRO-1 under DDP"]["buckets"] == 4000  # ZeroRedundancyOptimizer + DDP
    assert f["FSDP"]["params"] == 1000 and f["FSDP"]["buckets"] == 0
    assert sharding.padded_chunk(10, 4) == 3 and sharding.padded_chunk(8, 4) == 2
    # 195 elements on 2 ranks: padded to 196; 3 collectives of (p-1)/p of it, 4 bytes each
    assert sharding.fsdp_sent_bytes([[195]], 2) == 3 * 0.5 * 196 * 4
    # a 5 x 16 weight on 4 ranks: its rows padded to 8; bf16 gathers, fp32 reduce-scatter
    assert sharding.fsdp_sent_bytes([[5, 16]], 4) == 3 * 0.75 * 8 * 16 * 4
    assert sharding.fsdp_sent_bytes([[5, 16]], 4, 2, 4) == 0.75 * 8 * 16 * (2 * 2 + 4)
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
    assert held == {"params": 4 * n, "grads": 4 * n, "buckets": 0, "optimizer": 8 * n + steps}
    view = model[0].weight.view(-1)                        # a view shares storage: once
    assert sharding.tensor_bytes([model[0].weight, view]) == 4 * model[0].weight.numel()
    # views of distinct pieces of one buffer (DDP's gradients as bucket views) each count
    flat = torch.zeros(10)
    assert sharding.tensor_bytes([flat[:4], flat[4:], flat[4:]]) == 40
    # a bucket that is not the gradients counts; one the gradients are views of does not
    assert sharding.memory_of(model, 0, [torch.zeros(n)])["buckets"] == 4 * n
    bucket = torch.zeros(n)
    model[0].weight.grad = bucket[:model[0].weight.numel()].view_as(model[0].weight)
    assert sharding.memory_of(model, 0, [bucket])["buckets"] == 0


def test_memory_bars_is_a_figure_of_every_rank_and_strategy():
    rows = [{"rank": r, "strategy": s, "params": 400, "grads": 400, "buckets": 400,
             "optimizer": o} for s, o in (("ddp", 800), ("zero1", 400)) for r in range(2)]
    rows += [{"rank": r, "strategy": "fsdp2", "params": 200, "grads": 200, "optimizer": 400}
             for r in range(2)]                           # no buckets: drawn as 0
    fig = memory.memory_bars(rows, sharding.LABELS)
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert len(fig.axes[0].patches) == 4 * 6 and "rank 1" in labels[1]
    assert memory.totals(rows) == {"ddp": 2000.0, "zero1": 1600.0, "fsdp2": 800.0}


def test_step_time_line_compares_the_slowest_ranks():
    rows = {name: [{"step_s": a}, {"step_s": b}] for name, a, b in (
        ("ddp", 0.001, 0.001), ("zero1", 0.002, 0.003), ("zero_torch", 0.0015, 0.001),
        ("fsdp_hand", 0.004, 0.002), ("fsdp2", 0.002, 0.002))}
    assert sharding.step_time_line(rows) == (
        "step time (slowest rank's median): yours 3.0 ms vs ZeroRedundancyOptimizer 1.5 ms "
        "(2.00x); HandFSDP 4.0 ms vs fully_shard 2.0 ms (2.00x)")


@pytest.mark.timeout(400)
def test_zero1_and_zero2_solutions_pass():
    sources = [_cell("ex1a-solution"), _cell("ex1-solution")]
    res = spawn("engine_check_zero1", 4, timeout=300, sources=sources)
    assert [r["rank"] for r in res] == [0, 1, 2, 3]
    for r in res:
        assert set(r["cases"]) == {"AdamW", "SGD"}
        for c in r["cases"].values():
            assert c["max_weight_diff"] < 1e-6 and c["tied"] and c["frozen_changed"] == 0
            assert c["held_bytes"] <= 1.1 * (c["ref_state_bytes"] + 4 * c["n_params"]) / 4
            # one reduce-scatter and one all_gather: DDP's bytes, padded to 4 * 450 elements
            assert c["calls"] == {"reduce_scatter_single": 1, "all_gather_single": 1}
            assert c["sent"] == 2 * 3 / 4 * 4 * 450 * 4 > c["ddp_sent"] == 2 * 3 / 4 * 1797 * 4
    # ZeRO-2 (on 2 ranks; the notebook's test runs 4): no full gradient left alive by backward
    res = spawn("engine_check_zero1", 2, timeout=300, cls_name="ZeRO2Optimizer",
                sources=[sources[0], _cell("ex1b-solution")])
    for r in res:
        for c in r["cases"].values():
            assert c["max_weight_diff"] < 1e-6 and c["peak_grad_bytes"] == 0
            assert c["calls"] == {"reduce_scatter_single": c["n_tensors"], "all_gather_single": 1}


@pytest.mark.timeout(400)
def test_autocast_leaves_the_learners_zero_sending_and_holding_what_fp32_does():
    memory = "course_utils.torch_dist.sharding:engine_memory"
    full, half = spawn_several(2, [(memory, {"strategy": "zero1"}),
                                   (memory, {"strategy": "zero1_bf16"})],
                               sources=[_cell("ex1a-solution"), _cell("ex1-solution")],
                               timeout=300)
    for f, h in zip(full, half, strict=True):
        assert h["sent"] == f["sent"] > 0  # fp32 gradients: 4-byte reduce-scatter and gather
        assert (h["params"], h["optimizer"]) == (f["params"], f["optimizer"])
    table = sharding.memory_table([full[0], half[0]], 2)
    assert "ZeRO-1 (yours), bf16 autocast" in table


#: A peer's program, as the adapters of another course's tests would run the classes: no
#: ``rank``, ``world_size`` or ``local_rank`` globals, only a process group; an Embedding, a
#: LayerNorm and a Linear; each rank trains on its quarter of a batch that one process trains
#: on whole.
PEER = """
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


def peer_check():
    g = globals()
    for name in ("rank", "world_size", "local_rank"):
        g.pop(name, None)
    me, p = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1)
    x, y = torch.randint(0, 20, (4 * p,)), torch.randn(4 * p, 3)
    mine = slice(4 * me, 4 * me + 4)

    def net():
        torch.manual_seed(0)
        return nn.Sequential(nn.Embedding(20, 8), nn.LayerNorm(8), nn.Linear(8, 3))

    def train(model, opt, xs, ys, after_backward=lambda: None):
        for _ in range(3):
            opt.zero_grad()
            F.mse_loss(model(xs), ys).backward()
            after_backward()
            opt.step()

    out = {}
    for cls in (ShardedOptimizer, ZeRO2Optimizer):
        model, ref = net(), net()
        train(model, cls(model.parameters(), torch.optim.AdamW, lr=1e-2, weight_decay=0.1),
              x[mine], y[mine])
        train(ref, torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1), x, y)
        out[cls.__name__] = max((a - b).abs().max().item()
                                for a, b in zip(model.parameters(), ref.parameters()))
    FSDP = HandFSDP
    model, ref = FSDP(net(), compute_dtype=None), net()
    train(model, torch.optim.AdamW(model.parameters(), lr=1e-2), x[mine], y[mine],
          model.finish_gradient_sync)
    train(ref, torch.optim.AdamW(ref.parameters(), lr=1e-2), x, y)
    full = model.gather_full_params()
    out["FSDP"] = max((full[n] - t).abs().max().item() for n, t in ref.named_parameters())
    return out
"""


@pytest.mark.timeout(400)
def test_the_solutions_run_in_a_peers_program_through_thin_adapters():
    cells = [_cell(g) for g in ("ex1a-solution", "ex1-solution", "ex1b-solution",
                                "ex2-solution")]
    res = spawn("__main__:peer_check", 4, timeout=300, sources=[*cells, PEER])
    for r in res:
        assert set(r) == {"ShardedOptimizer", "ZeRO2Optimizer", "FSDP"}
        assert max(r.values()) < 1e-5, r


@pytest.mark.timeout(400)
def test_fsdp_solution_passes_on_every_kind_of_layer():
    # 2 ranks (the notebook's test runs 4): the last weight's 5 rows are padded to 6
    res = spawn("engine_check_fsdp", 2, timeout=300, sources=[_cell("ex2-solution")])
    want = sharding.fsdp_sent_bytes(res[0]["param_shapes"], 2)
    tensors = len(res[0]["param_shapes"])
    assert tensors == 11  # Embedding, 2 LayerNorms and 3 Linears: weights and biases
    for r in res:
        assert r["names_ok"] and r["weight_diff"] < 1e-5 and r["output_diff"] < 1e-4
        for s in r["steps"]:
            assert s["calls"] == {"all_gather_single": 2 * tensors,
                                  "reduce_scatter_single": tensors}
            assert abs(s["sent"] - want) < 0.01 * want
            assert s["peak_live"] <= r["two_units_bytes"] < r["model_bytes"]


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


def _scaled_mul(change: tuple[str, str] | None = None):
    """The notebook's ScaledMul (exercise 2a's solution cell), with ``change`` made."""
    import torch

    src = _cell("ex2a-solution")
    if change:
        assert src.count(change[0]) == 1
        src = src.replace(change[0], change[1])
    ns = {"torch": torch}
    exec(src, ns)
    return ns["ScaledMul"]


@pytest.mark.parametrize("change, says", [
    (None, None),
    (("grad_y * x, None", "grad_y * x"), "one gradient per input of forward"),
    (("ctx.scale * grad_y * w, ctx.scale * grad_y * x", "grad_y * w, grad_y * x"),
     "lacks the factor scale"),
    (("ctx.scale * grad_y * w, ctx.scale * grad_y * x", "ctx.scale * w, ctx.scale * x"),
     "multiply by grad_y"),
    (("x, w = ctx.saved_tensors", "w, x = ctx.saved_tensors"), "in the order you passed them"),
    (("ctx.scale * grad_y * x, None", "None, None"), "None is only for an input"),
    (("grad_y * x, None", "grad_y * x, torch.ones(())"), "return None for scale"),
    (("ctx.save_for_backward(x, w)", "ctx.x = x"), "ctx.save_for_backward(x, w) in forward"),
    (("ctx.scale = scale", "pass"), "keep scale on ctx"),
    (("return scale * x * w", "return x * w"), "return scale * x * w from forward"),
    (("return ctx.scale * grad_y * w, ctx.scale * grad_y * x, None",
      "return -ctx.scale * grad_y * w, -ctx.scale * grad_y * x, None"), "sign"),
])
def test_function_problem_names_the_fix_of_each_kind_of_mistake(change, says):
    problem = function_problem(_scaled_mul(change))
    if says is None:
        assert problem is None, problem
    else:
        assert problem and says in problem, problem
        assert problem.startswith("checked:") and "try:" in problem


def _lifecycle_record(rank: int = 0) -> dict:
    events, alive, held = [], [], 0
    order = [(k, i, "forward") for i in range(2) for k in ("all_gather", "full", "compute",
                                                          "free")]
    order += [(k, i, "backward") for i in (1, 0) for k in ("all_gather", "full", "compute",
                                                           "free", "reduce_scatter")]
    for kind, layer, phase in order:
        held += {"full": 100, "free": -100}.get(kind, 0)
        events.append({"kind": kind, "layer": layer, "phase": phase, "bytes": 100})
        alive.append(held)
    return {"rank": rank, "world_size": 2, "events": events, "alive": alive,
            "layer_bytes": [100, 100], "model_bytes": 200}


def test_fsdp_lifecycle_figure_draws_every_rank_and_its_events():
    fig = memory.fsdp_lifecycle([_lifecycle_record(0), _lifecycle_record(1)])
    assert len(fig.axes) == 3                       # one per rank, then the bytes held
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts.count("gather") == 4 and texts.count("reduce-\nscatter") == 2
    assert texts.count("fwd") == 2 and texts.count("bwd") == 2
    assert len(fig.axes[2].get_lines()) == 3        # two ranks and the whole model's line
    assert fsdp_lifecycle.summary(_lifecycle_record()).startswith(
        "rank 0: 4 all_gathers and 2 reduce_scatters for 2 layers; at most 100 B")


#: torch's own on 2 ranks, one world for the tests below (each world costs a process start)
TORCHS_OWN = [("course_utils.torch_dist.fsdp_lifecycle:engine_fsdp_lifecycle", {}),
              *[("course_utils.torch_dist.sharding:engine_memory", {"strategy": name})
                for name in ("ddp", "ddp_view", "ddp_bf16")],
              ("course_utils.torch_dist.sharding:engine_fsdp2_traffic", {"micro": 3})]


@pytest.fixture(scope="module")
def torchs_own():
    return dict(zip(("lifecycle", "ddp", "ddp_view", "ddp_bf16", "fsdp2_micro3"),
                    spawn_several(2, TORCHS_OWN, timeout=300), strict=True))


@pytest.mark.timeout(400)
def test_fsdp_lifecycle_recorded_on_two_ranks_of_torchs_fsdp(torchs_own):
    res = torchs_own["lifecycle"]
    for r in res:
        ev = r["events"]
        for layer in range(4):
            mine = [(e["kind"], e["phase"]) for e in ev if e["layer"] == layer]
            assert mine.count(("all_gather", "forward")) == 1, mine
            assert mine.count(("all_gather", "backward")) == 1, mine
            assert mine.count(("reduce_scatter", "backward")) == 1, mine
            assert mine.count(("free", "forward")) == 1 and mine.count(("free", "backward")) == 1
            # gather, the full weights, compute and free, in that order, in forward
            fwd = [k for k, ph in mine if ph == "forward"]
            assert fwd == ["all_gather", "full", "compute", "free"], fwd
        gathers = [e["layer"] for e in ev if e["kind"] == "all_gather"]
        assert gathers == [0, 1, 2, 3, 3, 2, 1, 0]
        assert max(r["alive"]) == max(r["layer_bytes"]) < r["model_bytes"]
        assert [e["bytes"] for e in ev if e["kind"] == "all_gather"][:4] == r["layer_bytes"]


@pytest.mark.timeout(400)
def test_ddp_buckets_are_a_second_copy_of_the_gradients_unless_views(torchs_own):
    for strategy, buckets in (("ddp", "grads"), ("ddp_view", None)):
        for r in torchs_own[strategy]:
            assert r["buckets"] == (r[buckets] if buckets else 0), r
            assert r["grads"] == r["params"] == 4 * r["n_params"]


def test_global_batches_are_the_same_on_every_rank_and_any_range_alone():
    import torch

    whole = dcp_resume.global_batches(0, 4)
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(whole[2:], dcp_resume.global_batches(
        2, 2), strict=True))
    assert whole[0][0].shape == (dcp_resume.GLOBAL_BATCH, 16)
    assert not torch.equal(whole[0][0], whole[1][0])


@pytest.mark.timeout(400)
def test_a_checkpoint_of_model_and_adam_saved_by_1_rank_resumes_on_2(tmp_path):
    # the notebook saves on 2 and resumes on 4; here the smallest worlds that reshard
    path = str(tmp_path / "ckpt")
    saved = spawn("course_utils.torch_dist.dcp_resume:engine_dcp_save", 1, sources=[],
                  timeout=300, path=path)
    resumed = spawn("course_utils.torch_dist.dcp_resume:engine_dcp_resume", 2, sources=[],
                    timeout=300, path=path)
    want = saved[0]
    for r in resumed:
        assert r["world_size"] == 2 and r["weights_loaded"] == want["weights_saved"]
        after = max(abs(a - b) for a, b in zip(r["weights_after"], want["weights_after"],
                                                 strict=True))
        bare = max(abs(a - b) for a, b in zip(r["weights_after_fresh_adam"],
                                                want["weights_after"], strict=True))
        assert after < 1e-5 < 1e-3 < bare  # Adam's state is what the resume needed


@pytest.mark.timeout(400)
def test_bf16_variants_send_fewer_bytes_and_fsdp2_accumulates_with_one_reduce_scatter(
        torchs_own):
    full, half = torchs_own["ddp"][0], torchs_own["ddp_bf16"][0]
    assert half["sent"] == full["sent"] / 2  # bf16_compress_hook: 2 bytes an element
    assert half["optimizer"] == full["optimizer"]  # the state held stays fp32
    table = sharding.memory_table([full, half], 2)
    assert "DDP, bf16_compress_hook" in table
    acc = torchs_own["fsdp2_micro3"][0]
    assert acc["calls"] == {"all_gather_single": 24, "reduce_scatter_single": 4}
