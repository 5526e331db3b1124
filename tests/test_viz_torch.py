"""The PyTorch track's recorders on real engines (4 gloo ranks): the data behind each figure is
what the collectives, the profiler and DDP really did.

The ring all-reduce is the learner's exercise: the reference ring below lives in the tests only.
"""

from __future__ import annotations

import os
import time

import matplotlib
import pytest

matplotlib.use("Agg")

from course_utils import viz  # noqa: E402
from course_utils.torch_dist import live_log, perf, record  # noqa: E402
from course_utils.torch_dist.p2p import chunk_bounds  # noqa: E402
from course_utils.viz import cheatsheet, ring  # noqa: E402

CID = f"pytest-viz-{os.getpid()}"
P = 4

REFERENCE_RING = """
import torch
import torch.distributed as dist
from course_utils.torch_dist.p2p import chunk_bounds

_buffers = {}


def ring_all_reduce(t):
    p, r = world_size, rank
    flat = t.view(-1)
    bounds = chunk_bounds(flat.numel(), p)
    buf = _buffers.setdefault(t.dtype, torch.empty(bounds[0][1] - bounds[0][0], dtype=t.dtype))
    for phase in (0, 1):
        for s in range(p - 1):
            a0, a1 = bounds[(r - s + phase) % p]
            c0, c1 = bounds[(r - s - 1 + phase) % p]
            into = buf[: c1 - c0] if phase == 0 else flat[c0:c1]
            reqs = [dist.isend(flat[a0:a1], (r + 1) % p), dist.irecv(into, (r - 1) % p)]
            for q in reqs:
                q.wait()
            if phase == 0:
                flat[c0:c1] += into
    return 0
"""


# dist.all_reduce of the very input the ring recorder gives this rank (defined on the engines:
# functions of this test module cannot be unpickled there).
ALL_REDUCE_OF_RING_INPUT = """
def all_reduce_of_ring_input(n):
    t = (torch.arange(n, dtype=torch.float32) + 1.0) * float(2 ** dist.get_rank())
    dist.all_reduce(t)
    return t.tolist()
"""


@pytest.fixture(scope="module")
def cc():
    import course_utils as cu

    cluster = cu.start(n=P, cluster_id=CID)
    cu.start_torch(cluster)
    cluster.view.execute(REFERENCE_RING + ALL_REDUCE_OF_RING_INPUT, block=True)
    yield cluster
    cluster.stop(force=True, kill=True)  # nothing to save: no 2 s SIGTERM wait


def test_ring_replay_last_frame_is_dist_all_reduce_on_every_rank(cc):
    n = 2 * P
    recs = record.record_ring_replay("ring_all_reduce", ranks=P, n=n, cluster=cc)
    truth = cc.call("all_reduce_of_ring_input", n, timeout=60)
    assert [r["frames"][-1] for r in sorted(recs, key=lambda r: r["rank"])] == truth
    rp = ring.replay_frames(recs)
    assert rp["steps"] == 2 * (P - 1) and rp["phases"][P - 1] == "all-gather"
    assert all(m == 2**P - 1 for row in rp["masks"][-1] for m in row)
    # reduce-scatter, step s: rank r sends chunk (r - s) mod p to its right neighbour
    bounds = chunk_bounds(n, P)
    for s in range(P - 1):
        for src, dst, start, size in rp["sends"][s]:
            assert dst == (src + 1) % P and (start, start + size) == bounds[(src - s) % P]
    # The frames are the ranks' real buffers: at every step the receiver's chunk becomes its
    # own values plus the message (reduce-scatter) or the message itself (all-gather) ...
    vals = rp["values"]
    for k in range(rp["steps"]):
        for src, dst, start, size in rp["sends"][k]:
            sent, had = vals[k][src][start:start + size], vals[k][dst][start:start + size]
            got = vals[k + 1][dst][start:start + size]
            added = [a + b for a, b in zip(had, sent, strict=True)]
            assert got == (added if rp["phases"][k] == "reduce-scatter" else sent), (k, src)
    # ... and after reduce-scatter rank r holds the finished sum of chunk r + 1: the per-step
    # partial sums add up to dist.all_reduce's result.
    for r in range(P):
        a, b = bounds[(r + 1) % P]
        assert vals[P - 1][r][a:b] == truth[r][a:b]
        assert rp["masks"][P - 1][r][a:b] == [2**P - 1] * (b - a)
    with pytest.raises(Exception, match="not defined"):
        cc.run(record.engine_record_ring_frames, "no_such_ring", timeout=30)


def test_ring_replay_copies_the_ring_to_a_cluster_of_another_size(cc):
    # The notebook's case: its cluster has another size, so the ring is copied (with the
    # names it uses) to a separate cluster started for the recording, then stopped.
    t0 = time.perf_counter()
    recs = record.record_ring_replay("ring_all_reduce", ranks=2, n=4, cluster=cc)
    assert len(recs) == 2 and ring.replay_frames(recs)["steps"] == 2
    assert recs[0]["frames"][-1] == [3.0, 6.0, 9.0, 12.0]  # (1 + 2) * (i + 1)
    assert cc.ping() and cc.world_size == P  # the original cluster is untouched
    print(f"side cluster recording: {time.perf_counter() - t0:.1f} s")


def test_cheatsheet_grids_match_each_collectives_definition(cc):
    recs = sorted(cc.run(record.engine_record_collectives, 2, timeout=60),
                  key=lambda r: r["rank"])
    w, p = 2, P

    def mine(r: int) -> list[float]:
        return [10.0 * (r + 1) + j for j in range(w)]

    def chunk(i: int, r: int) -> list[float]:
        return [100.0 * i + 10.0 * (r + 1) + j for j in range(w)]

    total = [sum(mine(q)[j] for q in range(p)) for j in range(w)]
    everyone = [v for q in range(p) for v in mine(q)]
    for r, rec in enumerate(recs):
        t = rec["trace"]
        assert set(t) == set(record.COLLECTIVES)
        assert t["broadcast"] == (mine(r), mine(0))
        assert t["scatter"][1] == chunk(r, 0)
        assert t["scatter"][0] == ([v for i in range(p) for v in chunk(i, 0)] if r == 0 else None)
        assert t["gather"] == (mine(r), everyone if r == 0 else None)
        assert t["reduce"] == (mine(r), total if r == 0 else None)
        assert t["all_reduce"] == (mine(r), total)
        assert t["all_gather"] == (mine(r), everyone)
        assert t["reduce_scatter"][1] == [sum(chunk(r, q)[j] for q in range(p)) for j in range(w)]
    owner = cheatsheet.origins(recs)
    assert all(v not in owner for v in total), "a sum must not look like one rank's input"
    fig = cheatsheet.collectives_cheatsheet(recs)
    fig.canvas.draw()


def test_sweep_times_grow_with_the_message_and_fit(cc):
    # 16 MiB, not 1 MiB: on a loaded 2-core machine 4 ranks' 4 B median has taken 4 ms, as
    # long as 1 MiB did; 16 MiB moves 24 MiB a rank, far above any scheduling delay
    sizes = [4, 4096, 1 << 24]
    sw = cc.run(record.engine_sweep_all_reduce, sizes, 5, timeout=120)
    assert all(s == sw[0] for s in sw), "every rank reports the slowest rank's times"
    assert sw[0]["sizes"] == sizes and sw[0]["world_size"] == P
    assert all(t > 0 for t in sw[0]["seconds"]) and sw[0]["seconds"][-1] > sw[0]["seconds"][0]
    fit = viz.fit_alpha_beta(sw[0]["sizes"], sw[0]["seconds"], P)
    assert fit["alpha"] > 0 and fit["bandwidth"] > 0


def test_ddp_profile_shows_one_all_reduce_per_bucket_per_step(cc):
    # What unit 3 calls (its default caps, 25 and 1 MiB), on a model with 1.6 MiB of gradients
    w, d = 320, 4
    runs = record.profile_ddp(steps=2, cluster=cc, width=w, depth=d, batch=32, warmup=1)
    assert list(runs) == ["bucket_cap_mb=25", "bucket_cap_mb=1"]
    for cap, recs in runs.items():
        for rec in recs:
            buckets = rec["bucket_bytes"]
            assert sum(buckets) == rec["grad_bytes"] == 4 * (d * (w * w + w) + w * 10 + 10)
            kinds = {e["kind"] for e in rec["events"]}
            assert {"forward", "backward", "optimizer", "all_reduce"} <= kinds
            for s in range(2):
                reds = [e for e in rec["events"] if e["kind"] == "all_reduce" and e["step"] == s]
                assert len(reds) == len(buckets), (cap, s, len(reds), buckets)
                assert [e["bucket"] for e in reds] == list(range(len(buckets)))
            assert all(e["end"] >= e["start"] >= 0 for e in rec["events"])
    big, small = (len(runs[k][0]["bucket_bytes"]) for k in runs)
    assert small > big, f"more buckets at 1 MiB than at 25 MiB: {small} vs {big}"
    assert max(runs["bucket_cap_mb=1"][0]["bucket_bytes"]) <= 2**20 + 4 * (w * w + w)
    viz.ddp_timeline(runs).canvas.draw()


def test_live_log_is_published_while_training_runs(cc):
    ar = live_log.start_train_live(40, delay=0.03, cluster=cc, batch=32, hidden=16, max_hz=20.0)
    seen = []
    while not ar.ready():
        seen.append([len(r) if r else 0 for r in viz.live.published_rows(ar)])
        time.sleep(0.1)
    rows = viz.live.watch(ar, P, live=False, timeout=60)
    assert [len(r) for r in rows] == [40] * P
    assert any(0 < max(s) < 40 for s in seen), f"nothing arrived while training ran: {seen}"
    assert rows[0][-1]["loss"] < rows[0][0]["loss"]
    assert {"step", "loss", "step_time", "samples_per_s", "time"} <= set(rows[0][0])


def test_sweep_is_flat_flags_times_that_do_not_grow():
    assert perf.sweep_is_flat([1e-3, 1.1e-3, 2e-3])        # 4 MiB no slower than 4 B: load
    assert not perf.sweep_is_flat([5e-5, 1e-4, 2e-3])
    assert perf.sweep_is_flat([1e-3])


def test_sweep_measures_again_only_while_the_times_are_flat(cc):
    got = perf.sweep([4, 1 << 20], with_ring=False, cluster=cc, iters=3, attempts=3)
    t = got["seconds"]["dist.all_reduce"]
    assert got["sizes"] == [4, 1 << 20] and len(t) == 2 and all(x > 0 for x in t)
    assert 1 <= got["attempts"] <= 3
    assert got["attempts"] == 3 or not perf.sweep_is_flat(t), "stopped while still flat"
