"""Pure tests of the helpers behind units 7-9 (no engines): scaling rows, DETAIL messages, the
deterministic tiny run that the atomic-save check resumes, the elastic demo's arguments."""

from __future__ import annotations

import pytest

from course_utils.torch_dist import faults, perf


def test_scaling_row_ratios():
    res = [{"one_rank_s": 0.2, "ddp_s": 0.125, "comm_s": 0.025, "samples_per_step": 128,
            "world_size": 2},
           {"one_rank_s": 0.0, "ddp_s": 0.1, "comm_s": 0.02, "samples_per_step": 128,
            "world_size": 2}]
    row = perf.scaling_row(res)
    assert row["speedup"] == pytest.approx(1.6)        # the slowest rank sets the pace
    assert row["one_rank_samples_s"] == pytest.approx(640)
    assert row["comm_share"] == pytest.approx(0.2)


def test_shorten_fingerprint_drops_tensor_options():
    msg = ("Rank 0 is running collective: CollectiveFingerPrint(SequenceNumber=1, "
           "OpType=ALLREDUCE, TensorShape=[4], TensorDtypes=Float, TensorDeviceTypes="
           "TensorOptions(dtype=float (default), device=cpu, layout=Strided (default))))"
           ", but Rank 1")
    short = faults.shorten_fingerprint(msg)
    assert "TensorOptions" not in short and "TensorShape=[4]" in short and short.endswith("Rank 1")


def test_set_debug_rejects_unknown_levels():
    with pytest.raises(ValueError, match="DETAIL"):
        faults.set_debug("VERBOSE")


def test_tiny_run_resumes_exactly():
    pytest.importorskip("torch")
    import copy

    from course_utils.checks.faults import tiny_run

    states = []
    full = tiny_run(0, 5, lambda s: states.append(copy.deepcopy(s)))  # a snapshot, as a file is
    resumed = tiny_run(3, 5, lambda s: None, states[2])
    assert states[2]["step"] == 3
    assert float((full - resumed).abs().max()) == 0.0
