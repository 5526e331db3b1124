"""The PyTorch track's helpers (p2p, bandwidth, join_watch, train, viz, data) and its tests.

Pure tests run anywhere; ``cluster`` tests use real engines and a real gloo group; the
mistakes learners make live in the catalogue (``tests/mistakes/``, run by
``tests/notebook_items``, inside nbval's runs).
"""

from __future__ import annotations

import os
import subprocess
import sys

import ipyparallel as ipp
import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

from course_utils import bandwidth, checks, data, p2p, train, viz  # noqa: E402

CID = f"pytest-torch-{os.getpid()}"


# ---- pure ----------------------------------------------------------------------------------
@pytest.mark.parametrize("n,p", [(10, 3), (7, 2), (1, 2), (0, 4), (100003, 5), (6, 1)])
def test_chunk_bounds_cover_the_buffer(n, p):
    b = p2p.chunk_bounds(n, p)
    assert len(b) == p and b[0][0] == 0 and b[-1][1] == n
    assert all(b[i][1] == b[i + 1][0] for i in range(p - 1))
    sizes = [e - s for s, e in b]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == n


def test_chunk_bounds_rejects_nonsense():
    with pytest.raises(ValueError):
        p2p.chunk_bounds(5, 0)


def test_ring_bytes_and_bandwidth_formulas():
    rb = p2p.ring_bytes(1000, 2, 4)
    assert rb["total"] == 2 * 1000 * 4 and rb["per_rank"] == 4000 == rb["min"] == rb["max"]
    rb = p2p.ring_bytes(7, 4, 8)  # chunks 2,2,2,1
    assert rb["total"] == 6 * 7 * 8 and rb["min"] == 6 * 8 and rb["max"] == 6 * 16
    assert bandwidth.algbw(2e9, 2.0) == pytest.approx(1.0)
    assert bandwidth.busbw(2e9, 2.0, 2) == pytest.approx(1.0)
    assert bandwidth.busbw(2e9, 2.0, 4) == pytest.approx(1.5)
    assert bandwidth.busbw(2e9, 2.0, 4, "all_gather") == pytest.approx(0.75)
    with pytest.raises(ValueError):
        bandwidth.busbw(1, 1, 2, "nope")
    table = bandwidth.bandwidth_table({"gloo": 0.1, "mine": 0.2}, 64 * 2**20, 2)
    assert "0.50x" in table and "1.00x" in table and "64 MiB" in table


def test_sklearn_digits_shape_and_split():
    tr, te = data.sklearn_digits(True), data.sklearn_digits(False)
    assert tr.x.shape == (1797 - data.DIGITS_TEST, 3, 32, 32) and te.x.shape[0] == data.DIGITS_TEST
    assert tr.x.dtype == np.float32 and 0.0 <= tr.x.min() and tr.x.max() <= 1.0
    # 4x nearest upsampling: each 4x4 block is constant, channels are equal.
    assert np.array_equal(tr.x[:, 0], tr.x[:, 2])
    assert np.array_equal(tr.x[:, :, ::4, ::4], tr.x[:, :, 3::4, 3::4])
    assert "not CIFAR-10" in tr.note


def test_cifar10_falls_back_without_files(tmp_path):
    import socket

    before = socket.getdefaulttimeout()
    ds = data.cifar10(str(tmp_path / "none"), train=True, n=100, download=False)
    assert socket.getdefaulttimeout() == before  # the download timeout is not left behind
    assert ds.name == "sklearn-digits" and len(ds) == 100 and ds.x.shape[1:] == (3, 32, 32)
    assert ds.note.startswith("CIFAR-10 unavailable") and "\n" not in ds.note
    assert "no local copy" in ds.note and "download=False" in ds.note


def test_cifar10_without_a_copy_or_a_download_skips_torchvisions_import(tmp_path):
    """Every rank but the one that downloads asks with ``download=False``: without a local copy
    the answer is the fallback, decided before torchvision's import (seconds of CPU a rank).
    The folder checked is the one torchvision extracts to."""
    from torchvision.datasets import CIFAR10

    assert data.CIFAR10_FOLDER == CIFAR10.base_folder
    code = ("import sys\nfrom course_utils import data\n"
            f"ds = data.cifar10({str(tmp_path / 'none')!r}, n=10, download=False)\n"
            "print(ds.name, 'torchvision' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert out == ["sklearn-digits", "False"]


def test_cifar10_reads_a_local_copy(tmp_path, monkeypatch):
    """The real torchvision path: a tiny archive in CIFAR-10's on-disk format is read as such."""
    import pickle

    from torchvision.datasets import CIFAR10

    folder = tmp_path / CIFAR10.base_folder
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name, _md5 in CIFAR10.train_list + CIFAR10.test_list:
        batch = {"data": rng.integers(0, 256, (4, 3072), dtype=np.uint8),
                 "labels": list(range(4))}
        with open(folder / name, "wb") as f:
            pickle.dump(batch, f)
    with open(folder / CIFAR10.meta["filename"], "wb") as f:
        pickle.dump({"label_names": [str(i) for i in range(10)]}, f)
    # our fake files have other checksums than the real archive's
    monkeypatch.setattr("torchvision.datasets.cifar.check_integrity", lambda *a, **k: True)
    ds = data.cifar10(str(tmp_path), train=True, download=False)
    assert ds.name == "cifar10" and ds.x.shape == (20, 3, 32, 32) and ds.x.max() <= 1.0


def test_step_batches_concatenate_to_full_batches():
    # The expectation is written out from the shared permutation by hand (not from
    # step_batches): 11 items on 2 ranks drop 1; rank r holds perm[r::2] of the first 10;
    # 2 items a rank a step, 2 steps an epoch, then the shard starts over.
    perm = np.random.default_rng(3).permutation(11)
    full = train.full_batches(11, 2, 2, 3, seed=3)
    by_hand = [[0, 2, 1, 3], [4, 6, 5, 7], [0, 2, 1, 3]]
    assert [b.tolist() for b in full] == [perm[i].tolist() for i in by_hand]
    assert perm[10] not in np.concatenate(full)            # the remainder is never used
    # properties: p*B distinct items a step; one epoch's steps never share an item
    big = train.full_batches(100, 4, 6, 4, seed=0)         # 25 a rank: 4 steps of 6 = 1 epoch
    assert all(len(set(b.tolist())) == 24 for b in big)
    assert len(set(np.concatenate(big).tolist())) == 96
    per_rank = [train.step_batches(100, r, 2, 8, 20, seed=3) for r in range(2)]
    assert all(len(b) == 8 for b in per_rank[0])
    assert not set(per_rank[0][0]) & set(per_rank[1][0])
    with pytest.raises(ValueError):
        train.step_batches(10, 0, 2, 8, 1)


def test_models_are_seeded_and_shaped():
    import torch

    a, b = train.digits_mlp(1), train.digits_mlp(1)
    assert torch.equal(train.flat_params(a), train.flat_params(b))
    assert not torch.equal(train.flat_params(a), train.flat_params(train.digits_mlp(2)))
    cnn = train.original_cnn(seed=0)
    assert cnn(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    assert len(list(cnn.parameters())) == 6


def test_reference_sgd_is_deterministic_and_learns():
    w1 = train.reference_sgd(5, 0.5, 16, 2)
    assert np.array_equal(w1, train.reference_sgd(5, 0.5, 16, 2))
    assert not np.array_equal(w1, train.flat_params(train.digits_mlp(0)).numpy())


def test_viz_figures_are_pure_functions_of_arrays():
    import matplotlib.pyplot as plt

    figs = [
        viz.per_rank_tensors([[1, 2], [3, 4]], [[4, 6], None], "t"),
        viz.replica_divergence({"a": [0, 1, 2], "b": [0, 0, 0]}),
        viz.per_rank_curves([[3, 2, 1], [3, 2.5, 1.5]], "loss", "t", [3, 2.2, 1.2]),
        viz.bandwidth_bars({"gloo": 0.5, "ring": 0.55}, "t"),
        viz.ring_trace([{"before": [0, 1], "messages": [(1, [0])], "after": [100, 102]},
                        {"before": [100, 101], "messages": [(0, [101])], "after": [100, 102]}]),
    ]
    assert [len(f.axes) for f in figs] == [4, 1, 1, 1, 1]
    for f in figs:
        plt.close(f)
    with pytest.raises(ValueError):
        viz.per_rank_tensors([[1]], [[1], [2]], "mismatch")


# ---- real engines ---------------------------------------------------------------------------
RING_OK = """
import torch, torch.distributed as dist
from course_utils.torch_dist.p2p import chunk_bounds

def ring_ok(t):
    p, r = dist.get_world_size(), dist.get_rank()
    flat = t.view(-1)
    b = chunk_bounds(flat.numel(), p)
    sent = 0
    buf = torch.empty(b[0][1] - b[0][0], dtype=t.dtype)
    for phase in (0, 1):
        for s in range(p - 1):
            (a0, a1) = b[(r - s + phase) % p]
            (c0, c1) = b[(r - s - 1 + phase) % p]
            dst = buf[: c1 - c0] if phase == 0 else flat[c0:c1]
            reqs = []
            if a1 > a0:
                reqs.append(dist.isend(flat[a0:a1], (r + 1) % p))
            if c1 > c0:
                reqs.append(dist.irecv(dst, (r - 1) % p))
            for q in reqs:
                q.wait()
            if phase == 0:
                flat[c0:c1] += dst
            sent += (a1 - a0) * t.element_size()
    return sent

def ring_cheat(t):
    dist.all_reduce(t)
    return int(2 * (dist.get_world_size() - 1) / dist.get_world_size() * t.numel()) * 4
"""

CKPT_FUNCS = """
import os, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from course_utils import train

def save_good(m, o, epoch, path):
    if dist.get_rank() == 0:
        torch.save({"model": m.module.state_dict(), "optimizer": o.state_dict(), "epoch": epoch},
                   path + ".tmp")
        os.replace(path + ".tmp", path)
    dist.barrier()

def save_no_barrier(m, o, epoch, path):
    if dist.get_rank() == 0:
        torch.save({"model": m.module.state_dict(), "optimizer": o.state_dict(), "epoch": epoch},
                   path)

def save_everyone(m, o, epoch, path):
    torch.save({"model": m.state_dict(), "optimizer": o.state_dict(), "epoch": epoch}, path)
    dist.barrier()

ck_model = DDP(train.original_cnn(seed=0))
ck_opt = torch.optim.SGD(ck_model.parameters(), lr=0.1, momentum=0.9)
"""


@pytest.fixture(scope="module")
def tcluster():
    import course_utils as cu

    cc = cu.start(n=2, cluster_id=CID)
    cu.start_torch(cc)
    yield cc
    cc.stop(force=True)


def test_check_all_reduce_accepts_a_ring_and_catches_a_cheat(tcluster):
    tcluster.view.execute(RING_OK, block=True)
    for n in (1, 7, 1001):
        res = tcluster.run(checks.engine_check_all_reduce, "ring_ok", n, 0, timeout=60)
        assert all(x["max_abs_diff"] <= x["tol"] for x in res), res
        assert sum(x["bytes_sent"] for x in res) == p2p.ring_bytes(n, 2, 4)["total"]
    ok = tcluster.run(checks.engine_check_point_to_point_only, "ring_ok", 1001, timeout=60)
    assert all(x["max_abs_diff"] <= x["tol"] for x in ok) and checks.ring_problem(ok) is None
    cheat = tcluster.run(checks.engine_check_point_to_point_only, "ring_cheat", 1001, timeout=60)
    assert all("isend/irecv only" in x["error"] for x in cheat)
    assert "isend/irecv only" in checks.ring_problem(cheat)
    rec = tcluster.run(p2p.engine_record_ring, "ring_ok", 5, timeout=60)
    assert rec[0]["before"] == [0, 1, 2, 3, 4] and rec[1]["after"] == [100, 102, 104, 106, 108]
    assert rec[0]["messages"] == [(1, [0.0, 1.0, 2.0]), (1, [106.0, 108.0])]  # partial, then done
    # The guard is lifted afterwards: the real all_reduce works again.
    lifted = tcluster.run(checks.engine_check_all_reduce, "ring_cheat", 5, timeout=60)
    assert checks.ring_problem(lifted) is None, lifted


def test_engine_time_and_bench(tcluster):
    tcluster.view.execute(RING_OK, block=True)
    res = tcluster.run(bandwidth.engine_bench_all_reduce, "ring_ok", 4 * 2**20, 3, timeout=120)
    assert res[0] == res[1]  # max-reduced: every rank reports the slowest rank's time
    assert set(res[0]) == {"dist.all_reduce (gloo)", "ring_ok"} and all(
        0 < s < 10 for s in res[0].values())


@ipp.interactive
def spreads():
    import torch
    import torch.distributed as dist

    from course_utils import train as tr

    r = dist.get_rank()
    m = tr.digits_mlp(seed=r)
    different = tr.replica_spread(m)
    for t in m.parameters():
        dist.broadcast(t.data, 0)
    same = tr.replica_spread(m)
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(r))
    m(x).sum().backward()
    g = tr.grad_spread(m)
    met = tr.reduce_metrics(loss_sum=float(r + 1), correct=r, count=2)
    ev = tr.evaluate(m, torch.zeros(10, 64), torch.zeros(10, dtype=torch.long))
    return different, same, g, met, ev


def test_replica_and_grad_spread_reduce_metrics_evaluate(tcluster):
    (d0, s0, g0, m0, e0), (d1, s1, g1, m1, e1) = tcluster.run(spreads, timeout=60)
    assert d0 == d1 > 0 and s0 == s1 == 0.0 and g0 == g1 > 0
    assert m0["loss"] == m1["loss"] == pytest.approx(3 / 4) and m0["accuracy"] == 0.25
    assert m0["local_accuracy"] == 0.0 and m1["local_accuracy"] == 0.5
    assert e0["count"] == 10 and e0["accuracy"] == e1["accuracy"]


def test_engine_check_checkpoint(tcluster, tmp_path):
    tcluster.view.execute(CKPT_FUNCS, block=True)
    path = str(tmp_path / "ck.pt")
    args = ("ck_model", "ck_opt", 3)
    good = tcluster.run(checks.engine_check_checkpoint, "save_good", path, *args, timeout=60)
    assert good[0]["calls"] == [path + ".tmp"] and good[1]["calls"] == []
    assert all(x["exists_on_return"] for x in good) and good[0]["epoch"] == 3
    assert not good[0]["module_prefixed"] and good[0]["n_model_keys"] == 6
    assert not any(x["leftovers"] for x in good)
    nob = tcluster.run(checks.engine_check_checkpoint, "save_no_barrier", path, *args, timeout=60)
    assert not nob[1]["exists_on_return"]  # rank 1 returned while rank 0 was still writing
    every = tcluster.run(checks.engine_check_checkpoint, "save_everyone", path, *args, timeout=60)
    assert every[1]["calls"] and every[0]["module_prefixed"]


RING_BLOCKING = """
import torch, torch.distributed as dist

def ring_blocking(t):
    # every rank sends first, then receives: deadlocks at any size on gloo
    p, r = dist.get_world_size(), dist.get_rank()
    buf = torch.empty_like(t)
    dist.send(t, (r + 1) % p)
    dist.recv(buf, (r - 1) % p)
    t += buf
    return t.numel() * t.element_size()
"""


def test_watchdog_names_a_deadlock_in_seconds_and_spares_the_group(tcluster):
    import time

    tcluster.view.execute(RING_BLOCKING + RING_OK, block=True)
    t0 = time.perf_counter()
    res = tcluster.run(checks.engine_check_all_reduce, "ring_blocking", 1, 0, "float32", 2.0,
                       timeout=60)
    took = time.perf_counter() - t0
    assert all(x["stuck"] and x["stuck"]["call"] == "send" for x in res), res
    assert took < 15, took
    assert "send/recv deadlock" in checks.ring_problem(res)
    # the course's group still works: the watchdog's messages used a throwaway group
    again = tcluster.run(checks.engine_check_all_reduce, "ring_ok", 7, timeout=60)
    assert checks.ring_problem(again) is None, again


JOIN_FUNCS = """
import datetime, torch, torch.distributed as dist

def join_right(addr, port, timeout_s):
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s))
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()

def join_rank0(addr, port, timeout_s):
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=0,
                            world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s))
"""


def test_engine_join_watches_a_learners_init(tcluster):
    import time

    import course_utils as cu
    from course_utils import join_watch, ports

    tcluster.view.execute(JOIN_FUNCS, block=True)
    addr = tcluster.ranks.master_addr
    try:
        port = tcluster.run_on(0, ports.free_port, addr)
        good = tcluster.run(join_watch.engine_join, "join_right", addr, port, 5, timeout=60)
        assert join_watch.explain_join(good, addr, port, timeout_s=5) is None, good
        assert good[1]["group"]["init_method"] == f"tcp://{addr}:{port}"
        assert tcluster.run(join_watch.engine_gather_ranks, timeout=30) == [[0, 1], [0, 1]]
        port = tcluster.run_on(0, ports.free_port, addr)
        t0 = time.perf_counter()
        bad = tcluster.run(join_watch.engine_join, "join_rank0", addr, port, 3, timeout=60)
        assert time.perf_counter() - t0 < 15
        assert [o["claims"][0]["rank"] for o in bad] == [0, 0]
        assert "two ranks claimed rank 0" in join_watch.explain_join(bad, addr, port, timeout_s=3)
        assert tcluster.run(join_watch.engine_has_group, timeout=30) == [False, False]
    finally:
        cu.start_torch(tcluster)   # engine_join destroyed the course's group: build it again


def test_engine_check_dp_step_tells_mistakes_apart(tcluster):
    steps = """
import torch, torch.distributed as dist, torch.nn.functional as F

def dp_right(model, opt, xb, yb):
    opt.zero_grad()
    loss = F.cross_entropy(model(xb), yb)
    loss.backward()
    for q in model.parameters():
        dist.all_reduce(q.grad)
        q.grad /= dist.get_world_size()
    opt.step()
    out = loss.detach().clone()
    dist.all_reduce(out)
    return float(out) / dist.get_world_size()

def dp_summed(model, opt, xb, yb):
    opt.zero_grad()
    loss = F.cross_entropy(model(xb), yb)
    loss.backward()
    for q in model.parameters():
        dist.all_reduce(q.grad)
    opt.step()
    out = loss.detach().clone()
    dist.all_reduce(out)
    return float(out) / dist.get_world_size()
"""
    tcluster.view.execute(steps, block=True)
    right = tcluster.run(checks.engine_check_dp_step, "dp_right", timeout=120)
    assert checks.dp_step_problem(right) is None, right
    summed = tcluster.run(checks.engine_check_dp_step, "dp_summed", timeout=120)
    assert [r["step1"] for r in summed] == ["summed", "summed"]


WRAPS = """
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler
from course_utils import data as _data

_d = _data.sklearn_digits(True)
X, Y = torch.from_numpy(_d.x[:64]), torch.from_numpy(_d.y[:64])
device = torch.device("cpu")

def wrap_good(model):
    return DDP(model.to(device))

def wrap_gpu_ids(model):
    return DDP(model.to(device), device_ids=[0])

def sampler_padded(dataset, epoch):
    s = DistributedSampler(dataset, num_replicas=2, rank=dist.get_rank(), seed=0)
    s.set_epoch(epoch)
    return s
"""


def test_engine_check_ddp_and_sampler_report_what_the_tests_read(tcluster):
    tcluster.view.execute("import torch.distributed as dist\n" + WRAPS, block=True)
    good = tcluster.run(checks.engine_check_ddp, fn_name="wrap_good", timeout=60)
    assert all(x["error"] is None and x["is_ddp"] for x in good)
    assert all(x["param_spread"] == 0.0 and x["grad_spread"] == 0.0 for x in good)
    assert all(x["vs_manual"] < 1e-5 for x in good)
    bad = tcluster.run(checks.engine_check_ddp, fn_name="wrap_gpu_ids", timeout=60)
    assert all("device_ids" in x["error"] and not x["is_ddp"] for x in bad)
    # the process group is still usable after a wrap that raised on every rank
    assert tcluster.run(checks.engine_check_ddp, fn_name="wrap_good", timeout=60)[0]["is_ddp"]
    padded = tcluster.run(checks.engine_check_sampler, fn_name="sampler_padded", n=101,
                          timeout=60)
    assert [len(x["orders"][0]) for x in padded] == [51, 51] and padded[0]["drop_last"] is False
    assert padded[0]["orders"][0] != padded[0]["orders"][1]
