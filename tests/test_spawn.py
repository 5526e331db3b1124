"""The one runner of graded checks on ranks of their own (``course_utils/checks/spawn.py``):
the rank map it gives, the learner's cells it carries from rank 0 of a real cluster (with what
they use from other cells), and how a rank that fails, is killed or hangs is reported."""

from __future__ import annotations

import os
import tempfile
import time

import pytest

import course_utils as cu
from course_utils.checks.spawn import RankFailed, simulated_rank_map, spawn
from course_utils.errors import CourseError

CID = f"pytest-spawn-{os.getpid()}"

#: What a probe sees on each rank (the names a %%px cell sees on an engine).
SEEN = """
import os
import sys
import torch.distributed as dist

def seen():
    return {"rank": rank, "world_size": world_size, "local_rank": local_rank, "host": host,
            "group": dist.is_initialized(), "env": os.environ["LOCAL_RANK"],
            "port": os.environ["MASTER_PORT"], "keys": {0: "int keys survive"},
            "dynamo": "torch._dynamo" in sys.modules}
"""


def test_simulated_rank_map_numbers_local_ranks_per_host():
    ranks = simulated_rank_map((2, 2))
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert [r["local_rank"] for r in ranks] == [0, 1, 0, 1]
    assert len({r["host"] for r in ranks}) == 2
    assert [r["local_rank"] for r in simulated_rank_map((3,))] == [0, 1, 2]


def test_hosts_that_do_not_hold_nprocs_ranks_are_refused():
    with pytest.raises(ValueError, match="hold 3 ranks, not nprocs=4"):
        spawn("os:getpid", 4, sources=[], hosts=(2, 1))


def test_each_rank_has_its_entry_of_the_rank_map_and_no_group_when_asked():
    got = spawn("__main__:seen", 4, sources=[SEEN], hosts=(2, 2), group=False, timeout=90)
    assert [g["rank"] for g in got] == [0, 1, 2, 3]
    assert [g["local_rank"] for g in got] == [0, 1, 0, 1]
    assert [g["env"] for g in got] == ["0", "1", "0", "1"]
    assert not any(g["group"] for g in got) and len({g["port"] for g in got}) == 1
    assert got[0]["keys"] == {0: "int keys survive"}  # results come back as Python objects
    # what an optimizer's first step imports was imported once, before the ranks were forked
    assert all(g["dynamo"] for g in got)
    assert all(g["group"] for g in spawn("__main__:seen", 2, sources=[SEEN], timeout=90))


LAUNCHER = """
import os

from course_utils import procs

def launcher():
    return os.getppid(), procs.cmdline(procs.parent(os.getppid()))
"""


def test_worlds_started_without_a_cluster_are_forked_by_one_helper_server(monkeypatch, tmp_path):
    # no cluster in this process: a fork server started for it forks each world's launcher,
    # so torch is imported once for many checks, not once per world
    from course_utils.cluster.launchers import fork_client

    fork_client.stop_fork_servers()
    first = spawn("__main__:launcher", 2, sources=[LAUNCHER], timeout=90)
    second = spawn("__main__:launcher", 2, sources=[LAUNCHER], timeout=90)
    assert first[0][0] != second[0][0]  # a launcher per world
    assert "ipyparallel_fork_server" in " ".join(first[0][1]) and first[0][1] == second[0][1]
    assert fork_client.own_server_socket() is not None
    # the socket folder follows tempfile's; a server started before a change is still found
    # (it was not: the next world waited a minute for a socket that was not there)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    t0 = time.monotonic()
    assert spawn("__main__:launcher", 2, sources=[LAUNCHER], timeout=90)[0][1] == first[0][1]
    assert time.monotonic() - t0 < 30
    fork_client.stop_fork_servers()
    # with forking off, the launcher is a fresh python that imports what the ranks need first
    monkeypatch.setenv(fork_client.ENV_FORK, "0")
    assert all(g["dynamo"] for g in spawn("__main__:seen", 2, sources=[SEEN], group=False,
                                          timeout=90))
    got = spawn("__main__:launcher", 2, sources=[LAUNCHER], timeout=90)
    assert "ipyparallel_fork_server" not in " ".join(got[0][1])
    assert fork_client.own_server_socket() is None


def test_a_rank_that_raises_is_reported_at_once_with_its_message():
    broken = "if rank == 1:\n    raise RuntimeError('rank one broke')\ndist.barrier()\n"
    with pytest.raises(RankFailed, match=r"rank 1 of the 2-rank check failed.*rank one broke"):
        spawn("os:getpid", 2, sources=[broken], timeout=60)


def test_a_rank_ended_by_a_signal_names_the_signal():
    killed = "import os, signal\nif rank == 2:\n    os.kill(os.getpid(), signal.SIGKILL)\n"
    with pytest.raises(RankFailed) as caught:
        spawn("os:getpid", 3, sources=[killed], timeout=60)
    assert caught.value.rank == 2 and caught.value.signal_name == "SIGKILL"


def test_a_collective_only_some_ranks_reach_ends_at_the_deadline():
    # rank 1 stays alive without joining the barrier (a rank that left would reset it at once)
    stuck = "import time\nif rank == 0:\n    dist.barrier()\nelse:\n    time.sleep(60)\n"
    with pytest.raises(CourseError, match="did not finish in 8 s"):
        spawn("os:getpid", 2, sources=[stuck], timeout=8, collective_timeout=60)


HELPER_CELL = """
SCALE = 3

def scaled(x):
    return SCALE * x
"""

LEARNER_CELL = """
import torch


def total():
    t = torch.tensor([float(scaled(rank + 1))])
    dist.all_reduce(t)
    return float(t.item()) + chunk_bounds(4, 2)[0][1]
"""


@pytest.fixture(scope="module")
def cluster():
    cc = cu.start(n=2, cluster_id=CID)
    cu.start_torch(cc)
    cc.view.execute("from course_utils.torch_dist.p2p import chunk_bounds", block=True)
    cc.view.execute(HELPER_CELL, block=True)
    cc.view.execute(LEARNER_CELL, block=True)
    yield cc
    cc.stop(force=True, kill=True)


@pytest.mark.timeout(300)
def test_the_learners_cell_runs_on_more_ranks_with_what_it_uses_from_other_cells(cluster):
    from course_utils.checks.collective_calls import engine_check_collectives  # noqa: F401

    # total() uses scaled() and SCALE (another cell) and chunk_bounds (imported in a third)
    got = spawn("engine_check_collectives", 3, cells=["total"], cluster=cluster, timeout=120,
                fn_name="total")
    want = 3.0 * (1 + 2 + 3) + 2
    assert [g["result"] for g in got] == [want] * 3
    assert all(g["calls"] == {"all_reduce": 1} for g in got)


def test_a_name_no_cell_defined_says_which_cell_to_run(cluster):
    with pytest.raises(Exception, match="'nowhere' is not defined on this engine"):
        spawn("os:getpid", 2, cells=["nowhere"], cluster=cluster, timeout=60)


#: A ring step that posts both sides and waits on them, and one that forgets to wait.
WAITED = """
def ring_all_reduce(t):
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    buf = torch.empty_like(t)
    reqs = [dist.isend(t.clone(), right), dist.irecv(buf, left)]
    for q in reqs:
        q.wait()
    t += buf
    return t.numel() * t.element_size()
"""
UNWAITED = WAITED.replace("    for q in reqs:\n        q.wait()\n", "")


def test_the_watchdog_names_requests_never_waited_for_in_seconds():
    import time

    probe = "course_utils.checks.ring_allreduce:engine_try_ring"
    fine = spawn(probe, 2, sources=[WAITED], timeout=60, fn_name="ring_all_reduce", n=3)
    assert fine == [{"x": [3.0] * 3, "sent": 12}] * 2, fine
    t0 = time.monotonic()
    got = spawn(probe, 2, sources=[UNWAITED], timeout=60, fn_name="ring_all_reduce", n=3)
    took = time.monotonic() - t0
    print(got, f"{took:.1f} s")
    for r, res in enumerate(got):
        assert res["error"].startswith(f"P2PUnwaited: rank {r}: 2 request(s)"), res
        assert "call wait() on it" in res["error"]
    assert took < 20, took  # not the group's timeout


def _unit1_ring(slip: tuple[str, str]) -> str:
    """Unit 1's ring solution, with one slip a learner makes (``(old, new)``)."""
    import re

    from course_utils.assignments.lessons import NOTEBOOK_DIR, read
    from course_utils.notebook_cells import find_cell, without_px

    cell = find_cell(read(NOTEBOOK_DIR / "01_collectives.ipynb").cells, "ex1-solution")
    src = re.sub(r"[ \t]*### (BEGIN|END) SOLUTION\n", "", without_px(cell.source))
    assert slip[0] in src
    return src.replace(slip[0], slip[1], 1)


def test_a_ring_stuck_on_one_rank_ends_every_rank_in_seconds_not_at_the_groups_timeout():
    # rank 0 finishes the first size and goes on; rank 1 waits for a chunk never sent. Both
    # stop after the first size (they agree on it), and the watchdog's group is not destroyed
    # with a stuck request in it: before, 39 s here (the next size's group, then the destroy,
    # each waited out its timeout), for a message found after 5 s
    src = _unit1_ring(("bounds[(r - s) % p], bounds[(r - s - 1) % p]",
                       "bounds[(left - s) % p], bounds[(r - s - 1) % p]"))
    calls = [("engine_check_all_reduce", ["ring_all_reduce", n, 20 + k, "float32"])
             for k, n in enumerate((1, 7, 13))]
    t0 = time.monotonic()
    got = spawn("course_utils.checks.ring_allreduce:engine_ring_calls", 2, sources=[src],
                timeout=90, collective_timeout=20, calls=calls)
    took = time.monotonic() - t0
    assert [len(per_rank) for per_rank in got] == [1, 1], got
    assert any(per_rank[0]["stuck"] for per_rank in got), got
    assert took < 15, took


def test_first_failure_names_the_rank_whose_error_is_its_own():
    from course_utils.checks import first_failure

    lost = {"rank": 0, "error": "RuntimeError: ... Connection closed by peer [127.0.0.1]:1"}
    own = {"rank": 1, "error": "RuntimeError: mat1 and mat2 shapes cannot be multiplied"}
    assert first_failure([lost, own, {"rank": 2}]) is own
    assert first_failure([lost, {"rank": 1}]) is lost  # only knock-ons: the first of them
    assert first_failure([{"rank": 0}, {"rank": 1}]) is None


def test_a_rank_with_its_result_waits_for_its_peers_results_or_a_failure(tmp_path):
    """A rank keeps its connections until the world is over: every rank has a result, or one
    failed (its traceback is there); else it gives up after its timeout."""
    from course_utils.checks.spawned_ranks import wait_for_peers

    (tmp_path / "result-0.pkl").write_bytes(b"")
    t0 = time.monotonic()
    assert wait_for_peers(tmp_path, 2, timeout=0.3) is False
    assert time.monotonic() - t0 >= 0.3
    (tmp_path / "failed-1.txt").write_text("Traceback ...")
    assert wait_for_peers(tmp_path, 2, timeout=5) is True
    (tmp_path / "failed-1.txt").unlink()
    (tmp_path / "result-1.pkl").write_bytes(b"")
    t0 = time.monotonic()
    assert wait_for_peers(tmp_path, 2, timeout=5) is True and time.monotonic() - t0 < 1
