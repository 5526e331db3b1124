"""Units 8 and 9 without a cluster: the stuck-call message names the ranks that returned, the
timelines of a kill during a save and of a torchrun restart (parsed from the demo's own lines,
drawn headless), and the forked child's save events."""

from __future__ import annotations

import os

import matplotlib
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from course_utils.cluster.kernel.stuck_calls import StuckCalls, returned_ranks
from course_utils.cluster.ranks import RankInfo, RankMap  # noqa: E402
from course_utils.viz import faults_timeline  # noqa: E402
from tests.rank_maps import two_hosts  # noqa: E402

# The lines elastic_demo.py prints, in its own format (a run of section 5).
LINES = [
    "[elastic] attempt 0: resumed at step 0 (time 1000.00; 4.0 s after this process started)",
    "[elastic] rank 1 crashes at step 4 (time 1002.50)",
    "[elastic] attempt 1: resumed at step 4 (time 1009.00; 3.5 s after this process started)",
    "[elastic] attempt 1: finished 8 steps (time 1010.25); weight checksum 1.234567",
]


def rank_map(n: int) -> RankMap:
    return RankMap(tuple(
        RankInfo(engine_id=10 + r, rank=r, world_size=n, local_rank=r, local_world_size=n,
                 node_rank=0, host="vm", addr="127.0.0.1", pid=100 + r, gpus=0,
                 master_addr="127.0.0.1")
        for r in range(n)))


def test_a_timed_out_call_names_the_ranks_that_already_returned():
    ranks = rank_map(3)
    err = StuckCalls().timed_out(ranks, [(10, "m0")], 5.0, "call_named()")
    assert "still running on ranks [0]" in str(err)
    assert "ranks [1, 2] already returned from it" in str(err) and "Fix:" in str(err)
    one = StuckCalls().timed_out(ranks, [(11, "m1")], 5.0, "f() on rank 1")
    assert "already returned" not in str(one)   # a call on one rank: nobody else was asked
    assert returned_ranks(ranks, [0], "g()", targets=[10, 12]) == [2]
    assert returned_ranks(ranks, [0, 1, 2], "g()") == []


def test_ranks_left_running_after_a_rank_raised_are_named_and_recorded():
    ranks, stuck = rank_map(3), StuckCalls()
    note = stuck.left_running(ranks, [(10, "m0"), (12, "m2")], "train()", [1], grace=3.0)
    assert note.startswith("ranks 0, 2 were still running train() 3 s after rank 1 raised")
    assert note.endswith("a new call would queue behind them")
    err = stuck.still_stuck({10: {"queue": ["m0"]}}, {10, 11, 12})
    assert "still busy in train(), which kept running after rank 1 failed 0 s ago" in str(err)
    assert err.fix.startswith("wait until it ends") and "cu.restart()" in err.fix
    assert stuck.still_stuck({10: {"queue": []}}, {10, 11, 12}) is None and stuck.last is None
    one = StuckCalls().left_running(ranks, [(10, "m0")], "f()", [1, 2], grace=3.0)
    assert one.startswith("rank 0 was still running f() 3 s after ranks 1-2 raised")


def test_ranks_left_running_on_another_host_are_named_with_it():
    two = two_hosts()
    note = StuckCalls().left_running(two, [(12, "m2"), (13, "m3")], "f()", [0, 1], grace=3.0)
    assert note.startswith("ranks 2-3 on b were still running f() 3 s after ranks 0-1 raised")
    assert "or their host lost the network" in note
    both = StuckCalls().left_running(two, [(11, "m1"), (12, "m2")], "f()", [0], grace=3.0)
    assert both.startswith("ranks 1-2 (on a, b) were still running")
    assert "on " not in StuckCalls().left_running(rank_map(3), [(10, "m0")], "f()", [1])[:12]


def test_parse_elastic_reads_starts_resumes_crash_and_finish():
    events = faults_timeline.parse_elastic(["noise", *LINES])
    kinds = [(e["kind"], e["attempt"], e["step"]) for e in events]
    assert kinds == [("start", 0, None), ("resume", 0, 0), ("crash", 0, 4), ("start", 1, None),
                     ("resume", 1, 4), ("finish", 1, 8)]
    t = {(e["kind"], e["attempt"]): e["t"] for e in events}
    assert t[("start", 0)] == 0.0 and t[("resume", 0)] == pytest.approx(4.0)
    assert t[("crash", 0)] == pytest.approx(6.5) and t[("start", 1)] == pytest.approx(9.5)
    spans = faults_timeline.restart_spans(events)
    training = [s for s in spans if s["kind"] == "training"]
    assert [(s["attempt"], s["steps"], s["ended"]) for s in training] == [
        (0, (0, 4), "crash"), (1, (4, 8), "finish")]


def test_restart_timeline_draws_both_attempts_and_the_gap():
    fig = faults_timeline.restart_timeline(LINES)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["attempt 0", "attempt 1"]
    texts = " ".join(t.get_text() for t in ax.texts)
    assert "steps 0→4" in texts and "steps 4→8" in texts and "6.5 s to train again" in texts
    plt.close(fig)
    empty = faults_timeline.restart_timeline([])
    assert "no [elastic] lines" in empty.axes[0].get_title()
    plt.close(empty)


def test_kill_during_save_draws_each_save_and_what_is_on_disk():
    events = [(0.01, "save", 1), (0.02, "saved", 1), (0.03, "save", 2), (0.04, "saved", 2),
              (0.05, "save", 3), (0.051, "kill", 3)]
    spans = faults_timeline.save_spans(events)
    assert [(s["n"], s["killed"]) for s in spans] == [(1, False), (2, False), (3, True)]
    result = {"events": events, "files": ["atomic-check.pt", "atomic-check.pt.tmp"],
              "loads": True, "step": 2}
    fig = faults_timeline.kill_during_save(result)
    title = fig.axes[0].get_title()
    assert "atomic-check.pt.tmp" in title and "loads at step 2" in title
    assert "SIGKILL" in " ".join(t.get_text() for t in fig.axes[0].texts)
    plt.close(fig)
    fig = faults_timeline.kill_during_save({"files": [], "loads": False, "load_error": "bad"})
    assert "nothing" in fig.axes[0].get_title() and "does not load (bad)" in fig.axes[0].get_title()
    plt.close(fig)


def test_the_forked_child_reports_its_saves_and_the_kill(tmp_path):
    import torch

    from course_utils.checks import watchdog_and_save as probes

    probes.tiny_run(0, 3, lambda s: None)   # the parent used torch's thread pool before the fork

    def atomic(state, path):
        torch.save(state, path + ".tmp")
        os.replace(path + ".tmp", path)

    events: list = []
    code, _ = probes._forked_child(atomic, str(tmp_path / "a.pt"), 6, 3, 30, events)
    assert code == -9
    assert [k for _, k, _ in events] == ["save", "saved"] * 3 + ["save", "kill"]
    assert all(t >= 0 for t, _, _ in events) and [n for *_, n in events][-1] == 4
