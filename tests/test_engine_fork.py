"""Local engines forked from one server (course_utils/cluster/engine_fork.py), against real
ipyparallel engines: what an exec'd engine had, a forked one has too."""

from __future__ import annotations

import os
import signal
import time

import ipyparallel as ipp
import pytest

import course_utils as cu
from course_utils import procs
from course_utils.cluster import engine_fork
from course_utils.errors import EngineError

CID = f"pytest-fork-{os.getpid()}"


@ipp.interactive
def facts() -> dict:
    import os
    import sys

    import numpy

    return {"pid": os.getpid(), "ppid": os.getppid(), "torch": "torch" in sys.modules,
            "argv": sys.argv[1:], "cluster": os.environ.get("IPP_CLUSTER_ID"),
            "threads": os.environ.get("OMP_NUM_THREADS"), "draw": numpy.random.rand()}


def servers(cid: str) -> list[int]:
    """Fork servers whose environment names cluster ``cid`` (its forked engines show the
    server's command line too: a server is one whose parent is not a server)."""
    forked = {p for p in procs.pids_with_environ(f"IPP_CLUSTER_ID={cid}")
              if any(a.startswith("--socket=") for a in procs.cmdline(p))}
    return sorted(p for p in forked if procs.parent(p) not in forked)


def wait_gone(pids: list[int], seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while any(procs.pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(procs.pid_alive(p) for p in pids)


def test_engines_are_children_of_one_server_that_imported_torch():
    cc = cu.start(n=3, cluster_id=CID)
    try:
        got = cc.run(facts)
        (server,) = servers(CID)  # one server for the three engines, prestarted
        assert {g["ppid"] for g in got} == {server}
        assert len({g["pid"] for g in got}) == 3 and server not in {g["pid"] for g in got}
        assert all(g["torch"] for g in got)  # imported once, in the server
        # each child has the engine's own arguments, environment and random state
        assert all(g["argv"] == ["--IPEngine.timeout=30"] for g in got)
        assert {g["cluster"] for g in got} == {CID} and got[0]["threads"]
        assert len({g["draw"] for g in got}) == 3
        for g in got:  # process scans see an engine: command line and environment
            assert "ipyparallel" in " ".join(procs.cmdline(g["pid"]))
            assert procs.environ_has(g["pid"], f"IPP_CLUSTER_ID={CID}")
        # a restart forks the new engines from the same server
        cc = cu.restart()
        assert {g["ppid"] for g in cc.run(facts)} == {server}
        engines = [g["pid"] for g in cc.run(facts)]
    finally:
        cu.stop(force=True)
    assert wait_gone([server, *engines]), "the server or an engine outlived cu.stop()"


def test_an_engine_killed_by_its_pid_is_a_dead_rank():
    cc = cu.start(n=2, cluster_id=f"{CID}-kill")
    try:
        victim = cc.run(facts)[1]["pid"]
        os.kill(victim, signal.SIGKILL)
        assert wait_gone([victim])  # the server reaps its child
        with pytest.raises(EngineError, match="gone"):
            cc.run(facts, timeout=30)
    finally:
        cu.stop(force=True)


def test_fork_off_starts_each_engine_as_its_own_python(monkeypatch):
    monkeypatch.setenv(engine_fork.ENV_FORK, "0")
    cid = f"{CID}-off"
    cc = cu.start(n=2, cluster_id=cid)
    try:
        got = cc.run(facts)
        assert servers(cid) == [] and {g["ppid"] for g in got} == {os.getpid()}
        assert not any("ipyparallel_fork_server" in " ".join(procs.cmdline(g["pid"])) for g in got)
    finally:
        cu.stop(force=True)


def test_server_key_names_python_and_every_variable():
    env = {"A": "1", "IPP_CLUSTER_ID": "c"}
    key = engine_fork.server_key("/usr/bin/python3", env)
    assert key == engine_fork.server_key("/usr/bin/python3", dict(reversed(env.items())))
    assert key != engine_fork.server_key("/usr/bin/python3", {**env, "A": "2"})
    assert key != engine_fork.server_key("/opt/python3", env)
    assert oct(engine_fork.socket_dir().stat().st_mode & 0o777) == "0o700"


def test_a_request_for_another_program_is_not_forked():
    with pytest.raises(engine_fork.ForkUnavailable, match="not a local course engine"):
        engine_fork.fork_engine(["python", "-m", "ipyparallel.engine"], {}, ".", os.devnull)
