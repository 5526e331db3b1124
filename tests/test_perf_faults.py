"""Tests of the helpers behind units 7-9 that need no engines: the scaling table and its noise,
the sweep table and figure, reading the learner's ring from unit 1, DETAIL messages, the
atomic-save child (a real fork that really dies with SIGKILL), the TF drills' spec checks."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from course_utils.assignments.lessons import NOTEBOOK_DIR
from course_utils.torch_dist import faults, perf


def _scaling(one, ddp, view, nosync):
    return {"rank": 0, "world_size": 2, "samples_per_step": 128, "grad_bytes": 1,
            "seconds": {"one_rank": one, "ddp": ddp, "ddp_bucket_view": view,
                        "no_sync": nosync}}


def test_scaling_table_medians_speedup_noise_and_paired_comm():
    res = _scaling(one=[0.2, 0.2, 0.2, 0.2, 0.2], ddp=[0.1, 0.1, 0.1, 0.1, 0.5],
                   view=[0.1] * 5, nosync=[0.08, 0.08, 0.08, 0.08, 0.08])
    rows = {r["kind"]: r for r in perf.scaling_table(res)}
    assert rows["ddp"]["speedup"] == pytest.approx(2.0)       # the median ignores one burst
    assert rows["one_rank"]["samples_s"] == pytest.approx(640)
    assert rows["ddp"]["comm_ms"] == pytest.approx(20.0)        # ddp - no_sync, round by round
    assert rows["one_rank"]["comm_ms"] is None and rows["one_rank"]["noise"] == 0.0
    text = perf.format_scaling(perf.scaling_table(res))
    assert "2 ranks, DDP + gradient_as_bucket_view" in text and "noise" in text


def test_flag_effect_says_when_noise_hides_the_difference():
    noisy = _scaling([0.2] * 4, [0.1, 0.05, 0.15, 0.1], [0.09, 0.05, 0.14, 0.09], [0.05] * 4)
    assert "cannot tell the two apart" in perf.flag_effect(perf.scaling_table(noisy))
    clear = _scaling([0.2] * 4, [0.100, 0.101, 0.100, 0.101], [0.080, 0.081, 0.080, 0.081],
                     [0.05] * 4)
    said = perf.flag_effect(perf.scaling_table(clear))
    assert "-20%" in said and "the view helped" in said


def test_format_sweep_columns():
    table = perf.format_sweep({"sizes": [4, 4096], "seconds": {"dist.all_reduce": [1e-4, 2e-3],
                                                               "ring": [2e-4, 1e-3]}}, 2)
    lines = table.splitlines()
    assert "dist.all_reduce" in lines[0] and "ring" in lines[0] and len(lines) == 4
    assert lines[3].split("|")[0].strip() == "4096", lines[3]


def test_ring_source_reads_the_solution_cell_of_unit_1(tmp_path):
    src = perf.ring_source(NOTEBOOK_DIR / "01_collectives.ipynb")
    assert "def ring_all_reduce(t):" in src and "%%px" not in src
    compile(src, "ring", "exec")
    with pytest.raises(FileNotFoundError, match="unit 1"):
        perf.ring_source(tmp_path / "01_collectives.ipynb")


def test_sweep_compare_draws_every_series():
    from course_utils import viz

    sizes = [4, 64, 1024]
    fig = viz.sweep_compare(sizes, {"gloo": [1e-4, 1e-4, 2e-4], "yours": [2e-4, 2e-4, 3e-4]}, 2,
                            {"alpha": 5e-5, "beta": 1e-9})
    left, right = fig.axes
    assert [ln.get_label() for ln in left.lines][:2] == ["gloo", "yours"]
    assert len(right.lines) == 2 and "busbw" in right.get_ylabel()
    with pytest.raises(ValueError, match="3 sizes"):
        viz.sweep_compare(sizes, {"bad": [1.0]}, 2)


def test_learner_lookup_names_the_missing_cell():
    from course_utils.cluster.engines.engine import px_name

    with pytest.raises(NameError, match="run the %%px cell that defines it"):
        px_name("surely_not_defined_here")


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
    import copy

    from course_utils.checks.watchdog_and_save import tiny_run

    states = []
    full = tiny_run(0, 5, lambda s: states.append(copy.deepcopy(s)))  # a snapshot, as a file is
    resumed = tiny_run(3, 5, lambda s: None, states[2])
    assert states[2]["step"] == 3
    assert float((full - resumed).abs().max()) == 0.0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork child: Linux")
def test_join_elastic_stops_torchrun_and_its_workers_at_the_timeout(tmp_path):
    import psutil

    from course_utils.errors import CourseError

    handle = faults.start_elastic(str(tmp_path / "elastic"), steps=8, crash_at=4)
    agent = psutil.Process(handle["proc"].pid)
    deadline = time.monotonic() + 60  # until torchrun has started its workers
    while len(agent.children(recursive=True)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    workers = agent.children(recursive=True)
    assert len(workers) >= 2, "torchrun started no workers within 60 s"
    t0 = time.monotonic()
    with pytest.raises(CourseError, match="did not finish within 0.5 s") as err:
        faults.join_elastic(handle, timeout=0.5)
    assert "Fix:" in str(err.value) and time.monotonic() - t0 < 20
    assert handle["proc"].poll() is not None
    # The workers run in sessions of their own: killing torchrun alone would leave them.
    assert not [w.pid for w in workers if w.is_running() and w.status() != psutil.STATUS_ZOMBIE]


def test_atomic_save_child_really_dies_mid_save(tmp_path):
    import torch

    from course_utils.checks import watchdog_and_save as probes
    from course_utils.checks.watchdog_and_save import tiny_run

    tiny_run(0, 3, lambda s: None)   # the parent used torch's thread pool before the fork

    def plain(state, path):
        torch.save(state, path)

    def atomic(state, path):
        torch.save(state, path + ".tmp")
        os.replace(path + ".tmp", path)

    for save, survives in ((plain, False), (atomic, True)):
        path = str(tmp_path / f"{save.__name__}.pt")
        t0 = time.perf_counter()
        code, _ = probes._forked_child(save, path, 6, 3, 30)
        assert code == -9 and time.perf_counter() - t0 < 20
        try:
            step = torch.load(path, weights_only=True)["step"]
        except Exception:
            step = None
        assert (step == 3) if survives else (step is None), (save.__name__, step)

    def unsolved(state, path):
        raise NotImplementedError("Exercise 2: replace this line with your code")

    code, err = probes._forked_child(unsolved, str(tmp_path / "u.pt"), 6, 3, 30)
    assert code == 1 and err == "NotImplementedError: Exercise 2: replace this line with your code"


def test_tf_drill_spec_names_the_missing_ps():
    from course_utils.tf_dist import TaskSet, TFServerNotAnswering, wait_ready
    from course_utils.tf_dist import tasks as tf_tasks

    tp = TaskSet(roles={"ps": [0], "worker": [0, 1]},
                 cluster={"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"]})
    broken = tf_tasks.with_missing_ps(tp)
    assert broken["ps"][0] != tp.cluster["ps"][0] and broken["worker"] == tp.cluster["worker"]
    assert tp.rank_of("worker:1") == 1 and "worker:1" in tp.table()
    with pytest.raises(TFServerNotAnswering, match=r"ps:0 at 127\.0\.0\.1:\d+.*\nFix: start"):
        wait_ready(broken, timeout=0.3)


def test_task_kill_waits_until_the_process_is_gone():
    from course_utils.tf_dist import tasks as tf_tasks

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    tf_tasks._PIDS["ps:9"] = proc.pid
    try:
        t0 = time.perf_counter()
        assert tf_tasks.engine_kill_task("ps:9") == proc.pid
        assert time.perf_counter() - t0 < 5
        with pytest.raises(ProcessLookupError):
            os.kill(proc.pid, 0)
        with pytest.raises(KeyError, match="ps:9"):
            tf_tasks.engine_kill_task("ps:9")
        assert tf_tasks.engine_stop_tasks() == 0
    finally:
        proc.kill()


def test_one_task_starter_per_host():
    from types import SimpleNamespace

    from course_utils.tf_dist import tasks as tf_tasks

    ranks = [SimpleNamespace(rank=r, host=h, addr=a) for r, (h, a) in enumerate(
        [("a", "10.0.0.1"), ("a", "10.0.0.1"), ("b", "10.0.0.2"), ("b", "10.0.0.2")])]
    assert tf_tasks.starters(SimpleNamespace(ranks=ranks)) == [0, 0, 2, 2]
