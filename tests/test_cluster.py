"""The cluster and torch helpers against real ipyparallel engines and real gloo groups."""

from __future__ import annotations

import os
import socket
import stat
import time

import ipyparallel as ipp
import pytest

import course_utils as cu
from course_utils import torch_dist
from course_utils.cluster import lifecycle as cl
from course_utils.cluster.engine import getenv
from course_utils.errors import (
    BackendUnavailable,
    ClusterNotRunning,
    ClusterTimeout,
    EngineError,
    EnginesDidNotStart,
    PortInUse,
    WorldSizeMismatch,
)

pytestmark = pytest.mark.cluster
CID = f"pytest-cluster-{os.getpid()}"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); treat it as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture(scope="module")
def cluster():
    cc = cu.start(n=2, cluster_id=CID)
    yield cc
    cc.stop(force=True)


@ipp.interactive
def rank_sum() -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([dist.get_rank() + 1.0])
    dist.all_reduce(t)
    return t.item()


def test_start_is_idempotent_and_ranks_are_pushed(cluster):
    assert cu.start(cluster_id=CID) is cluster
    assert cluster.world_size == 2 and cluster.owned
    env = cluster.run(getenv, "RANK")
    assert env == ["0", "1"]
    assert cluster.pull("world_size") == [2, 2]
    assert cluster.run(getenv, "OMP_NUM_THREADS") == ["1", "1"]  # 2 cores / 2 engines
    assert [r.pid for r in cluster.ranks] == cluster.run(os.getpid)


def test_push_pull_call_in_rank_order(cluster):
    cluster.push({"x": 5})
    cluster.view.execute("def twice(a): return (rank, a * 2 + x)")
    assert cluster.call("twice", 1) == [(0, 7), (1, 7)]
    with pytest.raises(EngineError, match=r"\[rank 0\] NameError: 'nope' is not defined"):
        cluster.call("nope")


def test_engine_error_names_each_rank(cluster):
    @ipp.interactive
    def boom():
        import os

        raise ValueError(f"bad on {os.environ['RANK']}")

    with pytest.raises(EngineError) as err:
        cluster.run(boom)
    assert "[rank 0] ValueError: bad on 0" in str(err.value)
    assert "[rank 1] ValueError: bad on 1" in str(err.value)


def test_init_torch_is_idempotent_and_all_reduce_sums(cluster):
    first = torch_dist.init(cluster)
    assert first["backend"] == "gloo" and first["world_size"] == 2
    again = torch_dist.init(cluster)
    assert again["reused"] is True and again["master_port"] == first["master_port"]
    assert cluster.run(rank_sum) == [3.0, 3.0]


def test_reinit_after_destroy_uses_a_fresh_port(cluster):
    first = torch_dist.init(cluster)
    assert torch_dist.destroy(cluster) == [True, True]
    assert torch_dist.destroy(cluster) == [False, False]
    second = torch_dist.init(cluster)
    assert second["reused"] is False
    assert cluster.run(rank_sum) == [3.0, 3.0]
    assert "master_port" in first


def test_world_size_mismatch_is_clear(cluster):
    with pytest.raises(WorldSizeMismatch, match="world_size=3 was asked but the cluster has 2"):
        torch_dist.init(cluster, world_size=3)
    with pytest.raises(WorldSizeMismatch, match="has 2 engines, n=3"):
        cu.start(n=3, cluster_id=CID) if not cluster.owned else cl._connect_existing(
            CID, cluster.profile, 3, 5)


def test_port_in_use_is_detected_on_rank0_host(cluster):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(PortInUse, match=f"master_port {port} is already in use"):
            torch_dist.init(cluster, master_port=port)


def test_nccl_without_gpus_fails_before_touching_engines(cluster):
    t0 = time.perf_counter()
    with pytest.raises(BackendUnavailable, match="nccl needs one CUDA GPU per rank"):
        torch_dist.init(cluster, backend="nccl")
    assert time.perf_counter() - t0 < 1


def test_second_kernel_connects_without_owning(cluster):
    saved = cl._current
    cl._current = None  # what a fresh notebook kernel sees
    try:
        t0 = time.perf_counter()
        other = cu.start(cluster_id=CID)
        assert time.perf_counter() - t0 < 2
        assert other is not cluster and not other.owned
        assert other.ranks.engine_ids == cluster.ranks.engine_ids
        other.stop()  # a non-owner only disconnects
        assert all(alive(r.pid) for r in cluster.ranks)
    finally:
        cl._current = saved
    assert cluster.ping()


def test_hung_collective_times_out_and_restart_recovers(cluster):
    torch_dist.init(cluster)
    old_pids = [r.pid for r in cluster.ranks]

    @ipp.interactive
    def only_rank0():
        import torch
        import torch.distributed as dist

        if dist.get_rank() == 0:
            dist.all_reduce(torch.ones(1))
        return 1

    t0 = time.perf_counter()
    with pytest.raises(ClusterTimeout, match=r"still running on ranks \[0\]") as err:
        cluster.run(only_rank0, timeout=2)
    assert time.perf_counter() - t0 < 5
    assert "cu.restart()" in err.value.fix

    restarted = cu.restart()
    assert restarted is cluster and cluster.world_size == 2
    assert not any(alive(p) for p in old_pids)
    # the restart hook rebuilt the process group on the new engines
    assert cluster.run(rank_sum) == [3.0, 3.0]
    assert cluster.pull("rank") == [0, 1]


def test_stop_leaves_no_engines_and_current_raises():
    cid = f"{CID}-stop"
    cc = cu.start(n=2, cluster_id=cid)
    pids = [r.pid for r in cc.ranks]
    cu.stop()
    deadline = time.time() + 10
    while any(alive(p) for p in pids) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in pids)
    assert not cl.cluster_file(cid).exists()
    with pytest.raises(ClusterNotRunning, match="cu.start"):
        cu.current()


def test_engines_that_exit_fail_fast(monkeypatch):
    monkeypatch.setenv("COURSE_ENGINE_PYTHON", "/bin/false")
    t0 = time.perf_counter()
    with pytest.raises(EnginesDidNotStart, match="exited before registering") as err:
        cu.start(n=2, cluster_id=f"{CID}-false", timeout=30)
    assert time.perf_counter() - t0 < 15
    assert "course doctor" in err.value.fix


def test_engines_that_never_register_time_out(monkeypatch, tmp_path):
    slow = tmp_path / "slowpython"
    slow.write_text("#!/bin/sh\nexec sleep 60\n")
    slow.chmod(slow.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("COURSE_ENGINE_PYTHON", str(slow))
    t0 = time.perf_counter()
    with pytest.raises(EnginesDidNotStart, match="did not register in 2 s"):
        cu.start(n=2, cluster_id=f"{CID}-slow", timeout=2)
    assert time.perf_counter() - t0 < 15
