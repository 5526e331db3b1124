"""Local engines forked from one server (course_utils/cluster/launchers/fork_client.py),
against real ipyparallel engines: what an exec'd engine had, a forked one has too."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time

import ipyparallel as ipp
import pytest

import course_utils as cu
from course_utils import procs
from course_utils.cluster.launchers import fork_client
from course_utils.errors import EngineError

CID = f"pytest-fork-{os.getpid()}"


@ipp.interactive
def facts() -> dict:
    import os
    import sys

    import numpy

    return {"pid": os.getpid(), "ppid": os.getppid(), "torch": "torch" in sys.modules,
            "dynamo": "torch._dynamo" in sys.modules,
            "argv": sys.argv[1:], "cluster": os.environ.get("IPP_CLUSTER_ID"),
            "threads": os.environ.get("OMP_NUM_THREADS"),
            "extra": os.environ.get("COURSE_KERNEL_EXTRA"), "draw": numpy.random.rand()}


def servers(cid: str) -> list[int]:
    """The fork servers this process started that forked engines of cluster ``cid``; each is
    a fork server by its command line."""
    found = fork_client.servers_of(cid)
    assert all(any(a.startswith("--socket=") for a in procs.cmdline(p)) for p in found)
    return found


def children(pid: int) -> set[int]:
    return {p for p in procs.all_pids() if procs.parent(p) == pid}


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
        # and what a first optimizer step would import in every engine (about 2 CPU-s each)
        assert all(g["dynamo"] for g in got)
        # each child has the engine's own arguments, environment and random state
        assert all(g["argv"] == ["--IPEngine.timeout=30"] for g in got)
        assert {g["cluster"] for g in got} == {CID} and got[0]["threads"]
        assert len({g["draw"] for g in got}) == 3
        for g in got:  # process scans see an engine by its command line
            assert "ipyparallel" in " ".join(procs.cmdline(g["pid"]))
        # a restart forks the new engines from the same server
        cc = cu.restart()
        assert {g["ppid"] for g in cc.run(facts)} == {server}
        engines = [g["pid"] for g in cc.run(facts)]
    finally:
        cu.stop(force=True)
    assert wait_gone(engines), "an engine outlived cu.stop()"
    # the server stays, idle, for the next cluster; ending the process's servers ends it
    assert procs.pid_alive(server) and not children(server)
    fork_client.stop_fork_servers()
    assert wait_gone([server]), "the server outlived the end of the process's servers"
    tag = fork_client.cluster_tag(sys.executable, {"IPP_CLUSTER_ID": CID})
    assert list(fork_client.socket_dir().glob(f"{tag}-*")) == []  # its socket went with it


def test_the_server_has_imported_what_an_engine_imports_as_it_starts():
    """An engine's kernel imports debugpy as it starts (about 0.3 s of CPU, most of a forked
    engine's start): a child the server forks has it, and torch's optimizer machinery, before
    anything runs in it."""
    from course_utils.cluster.launchers import fork_protocol

    cu.start(n=1, cluster_id=f"{CID}-imported")
    try:
        path = fork_client.own_server_socket()
        read, write = os.pipe()
        with open(os.devnull, "rb") as null:
            fork_protocol.fork_call(path, "builtins:exec", [
                "import sys; print([m in sys.modules for m in "
                "('ipykernel.debugger', 'torch._dynamo', 'IPython')])"],
                [null.fileno(), write], dict(os.environ), os.getcwd())
        os.close(write)
        with os.fdopen(read) as out:
            assert out.read().strip() == "[True, True, True]"
    finally:
        cu.stop(force=True)


def test_an_engines_nanny_is_forked_by_its_server_and_relays_signals():
    before = set(procs.all_pids())
    cc = cu.start(n=2, cluster_id=CID)
    try:
        (server,) = servers(CID)
        engines = {g["pid"] for g in cc.run(facts)}
        kids = children(server) - before
        nannies = [p for p in kids if p not in engines]
        assert len(nannies) == 2, (kids, engines)  # one per engine, no fresh python
        # ipyparallel's signal path goes through the nanny: SIGINT stops a running cell
        ar = cc.client[0].apply_async(time.sleep, 60)
        time.sleep(1)
        cc.client.send_signal(signal.SIGINT, targets=[0], block=True)
        with pytest.raises(ipp.error.RemoteError, match="KeyboardInterrupt"):
            ar.get(timeout=20)
    finally:
        cu.stop(force=True)
    # the nannies follow their engines, although the server is their parent
    assert wait_gone(nannies), "a nanny outlived its engine"


def test_a_socket_no_server_answers_on_is_removed():
    import socket

    dead = fork_client.socket_dir() / "0000000000-1-dead.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(dead))
    s.close()  # bound, never listening: what a killed server leaves
    assert dead.name in fork_client.remove_stale_sockets() and not dead.exists()


JOIN_AND_RESTART = """
import json, os, course_utils as cu
cc = cu.start(cluster_id=os.environ["CID"])
assert not cc.owned
cc = cu.restart()
print(json.dumps(cc.run(lambda: __import__("os").getppid())))
"""


def test_a_kernel_that_joined_the_cluster_forks_its_new_engines_from_the_owners_server():
    import json
    import subprocess
    import sys

    cid = f"{CID}-join"
    cu.start(n=2, cluster_id=cid)
    try:
        (server,) = servers(cid)
        # another process, with an environment of its own (as a notebook kernel has)
        out = subprocess.run([sys.executable, "-c", JOIN_AND_RESTART], capture_output=True,
                             text=True, timeout=120,
                             env={**os.environ, "CID": cid, "COURSE_KERNEL_EXTRA": "1"})
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout.strip().splitlines()[-1]) == [server, server]
        got = cu.start(cluster_id=cid).run(facts)
        engines = [g["pid"] for g in got]
        # the engines have the joiner's variables; /proc shows the server's (the cluster's)
        assert [g["extra"] for g in got] == ["1", "1"]
        assert not any(procs.environ_has(p, "COURSE_KERNEL_EXTRA=1") for p in engines)
    finally:
        cu.stop(force=True)
    assert wait_gone(engines)


def test_an_engine_killed_by_its_pid_is_a_dead_rank():
    cc = cu.start(n=2, cluster_id=f"{CID}-kill")
    try:
        victim = cc.run(facts)[1]["pid"]
        (launcher,) = [el for es in cc.cluster.engines.values() for el in es.launchers.values()
                       if el.pid == victim]
        assert isinstance(launcher, fork_client.ForkedEngineLauncher)
        with pytest.raises(TimeoutError):  # its own waiter: join waits while the engine runs
            asyncio.run(launcher.join(timeout=0.5))
        os.kill(victim, signal.SIGKILL)
        assert wait_gone([victim])  # the server reaps its child
        with pytest.raises(EngineError, match="gone"):
            cc.run(facts, timeout=30)
        asyncio.run(launcher.join(timeout=5))  # and returns once it is gone
    finally:
        cu.stop(force=True)


def test_fork_off_starts_each_engine_as_its_own_python(monkeypatch):
    monkeypatch.setenv(fork_client.ENV_FORK, "0")
    cid = f"{CID}-off"
    cc = cu.start(n=2, cluster_id=cid)
    try:
        got = cc.run(facts)
        assert servers(cid) == [] and {g["ppid"] for g in got} == {os.getpid()}
        assert not any("ipyparallel_fork_server" in " ".join(procs.cmdline(g["pid"])) for g in got)
    finally:
        cu.stop(force=True)


def test_server_key_names_python_cwd_and_every_variable_but_the_momentary_and_cluster_ones():
    env = {"A": "1", "IPP_CLUSTER_ID": "c", "PYTEST_CURRENT_TEST": "t.py::a (setup)",
           "COURSE_GRADING_RUN": "grade-1-1"}
    key = fork_client.server_key("/usr/bin/python3", env, "/w")
    assert key == fork_client.server_key("/usr/bin/python3", dict(reversed(env.items())), "/w")
    assert key != fork_client.server_key("/usr/bin/python3", {**env, "A": "2"}, "/w")
    # a grader's run mark must be in every process of that run's environment (it kills by it)
    assert key != fork_client.server_key("/usr/bin/python3",
                                         {**env, "COURSE_GRADING_RUN": "grade-1-2"}, "/w")
    assert key != fork_client.server_key("/usr/bin/python3", env, "/elsewhere")
    # a restart in the next test, or the next cluster of this process, reuses the server
    for name in fork_client.MOMENTARY + fork_client.CLUSTER_VARS:
        assert key == fork_client.server_key("/usr/bin/python3", {**env, name: "other"}, "/w")
    assert key != fork_client.server_key("/opt/python3", env, "/w")
    assert oct(fork_client.socket_dir().stat().st_mode & 0o777) == "0o700"


def test_importing_scikit_learn_tensorflow_or_compiling_keeps_the_server_key():
    """The course's offline data imports scikit-learn in the process, unit 8 TensorFlow after
    ``cu.start()``; both write variables into its environment: a cluster started after them
    is forked by the same server."""
    code = ("import os, sys\n"
            "from course_utils.cluster.launchers.fork_client import server_key\n"
            "key = lambda: server_key(sys.executable, dict(os.environ), os.getcwd())\n"
            "before = dict(os.environ), key()\n"
            "import sklearn\n"
            "from torch._inductor.runtime.cache_dir_utils import cache_dir\n"
            "cache_dir()\n"
            "import tensorflow\n"
            "from tensorflow.python import tpu\n"
            "print(sorted(set(os.environ) - set(before[0])), key() == before[1])\n")
    momentary = ("KMP_", "TORCHINDUCTOR_", "TF2_", "ENABLE_RUNTIME_", "TPU_ML_", "HDF5_PLUGIN")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env={k: v for k, v in os.environ.items()
                                           if not k.startswith(momentary)})
    assert out.returncode == 0, out.stderr[-2000:]
    added, same = out.stdout.strip().splitlines()[-1].rsplit(" ", 1)
    for name in ("KMP_INIT_AT_FORK", "TORCHINDUCTOR_CACHE_DIR", "TF2_BEHAVIOR",
                 "TPU_ML_PLATFORM"):
        assert name in added, added
    assert same == "True", f"{added} changed the key"


def test_a_server_that_exits_idle_as_it_is_asked_is_replaced_not_given_up(monkeypatch):
    """A kept server exits a minute after its last child; one asked in that moment is
    replaced by a new one, and forking stays on for that environment."""
    env, cwd = dict(os.environ), os.getcwd()
    fork_client._own_connection(sys.executable, env, cwd).close()  # a running server
    real, calls = fork_client._connect, []

    def exits_first(sock_path, proc, deadline):
        calls.append(proc.pid)
        if len(calls) == 1:  # the server exits (idle) between being found and being reached
            proc.terminate()
            proc.wait(timeout=10)
        return real(sock_path, proc, deadline)

    monkeypatch.setattr(fork_client, "_connect", exits_first)
    try:
        fork_client._own_connection(sys.executable, env, cwd).close()
        assert len(calls) == 2 and calls[0] != calls[1]
        assert fork_client.server_key(sys.executable, env, cwd) not in fork_client._BROKEN
    finally:
        fork_client.stop_fork_servers()


def test_stopping_a_cluster_leaves_the_processs_helper_server():
    """A server started for checks' worlds alone serves no cluster: a cluster's stop in the
    same process does not end it (it would import torch again for the next world)."""
    fork_client.stop_fork_servers()
    path = fork_client.helper_server_socket()
    assert path
    cu.start(n=1, cluster_id=f"{CID}-beside")
    cu.stop(force=True)
    try:
        assert fork_client.own_server_socket() == path and os.path.exists(path)
    finally:
        fork_client.stop_fork_servers()


def test_a_clusters_stop_ends_what_its_server_forked_and_the_next_cluster_reuses_the_server():
    """An engine a joined kernel restarted is forked by the owner's server but recorded only
    in that kernel; the owner's stop ends what the server forked (``course lab`` left such
    engines once in a CI run). The server stays, idle: the next cluster this process starts
    with the same environment is forked by it, without importing torch again."""
    from course_utils.cluster.launchers import fork_protocol

    cid = f"{CID}-unknown"
    cc = cu.start(n=1, cluster_id=cid)
    (server,) = servers(cid)
    path = fork_client.own_server_socket()
    with open(os.devnull, "wb") as null:
        stray = fork_protocol.fork_call(path, "time:sleep", [300], [null.fileno()] * 2,
                                        dict(os.environ), os.getcwd())
    assert procs.parent(stray) == server
    cc.stop(force=True)
    assert wait_gone([stray]), "what the server forked outlived the stop"
    assert procs.pid_alive(server) and not children(server)
    try:
        cc = cu.start(n=1, cluster_id=f"{cid}-next")
        assert servers(f"{cid}-next") == [server]
        assert procs.parent(cc.run(os.getpid)[0]) == server
    finally:
        cu.stop(force=True)
        fork_client.stop_fork_servers()
    assert wait_gone([server])


def test_a_request_for_another_program_is_not_forked():
    with pytest.raises(fork_client.ForkUnavailable, match="not a local engine"):
        fork_client.fork_engine(["python", "-m", "ipyparallel.controller"], {}, ".", os.devnull)


LAUNCHED_BY = """
def launched_by():
    import os

    from course_utils import procs
    launcher = os.getppid()
    return launcher, procs.parent(launcher)
"""


def test_a_check_world_of_its_own_is_forked_by_the_clusters_server(monkeypatch):
    from course_utils.checks import spawn
    from course_utils.cluster import ports
    from course_utils.errors import CourseError

    cid = f"{CID}-world"
    cu.start(n=2, cluster_id=cid)
    try:
        (server,) = servers(cid)
        before = sorted(p for p in procs.all_pids() if procs.parent(p) == server)
        # the ranks are forks of one launcher, which the cluster's server forked
        got = spawn("__main__:launched_by", 2, timeout=60, sources=[LAUNCHED_BY])
        assert got[0] == got[1] and got[0][0] not in (server, os.getpid()), got
        assert got[0][1] == server, got
        # started by rank 0's engine (the learner's cells are read there): the same server
        cu.current().view.execute(LAUNCHED_BY, block=True)
        assert spawn("__main__:launched_by", 2, cells=["launched_by"], timeout=60)[0][1] == server
        # a failing rank is still reported with its message, and nothing is left
        with pytest.raises(CourseError, match=r"rank 1 of the 2-rank check failed.*rank one"):
            spawn("os:getppid", 2, timeout=60, sources=[
                "if rank == 1:\n    raise RuntimeError('rank one broke')\ndist.barrier()\n"])
        # a world whose rank 0 cannot join (its port taken since the pick) is formed once
        # more on a fresh port; taken twice, the error says so
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            real, picked = ports.free_ports, []

            def taken_once(*a):  # the store's port taken on the first pick only
                picked.append(a)
                return [taken.getsockname()[1], real(1)[0]] if len(picked) == 1 else real(*a)

            monkeypatch.setattr(ports, "free_ports", taken_once)
            got = spawn("__main__:launched_by", 2, timeout=60, sources=[LAUNCHED_BY])
            assert got[0][1] == server, got
            spare = ports.free_port()
            monkeypatch.setattr(ports, "free_ports", lambda *a: [taken.getsockname()[1], spare])
            with pytest.raises(CourseError, match=r"rank 0 of the 2-rank check failed.*cannot "
                                                  r"listen"):
                spawn("os:getppid", 2, timeout=60, sources=[])
        # the launcher is gone when spawn returns; its server reaps it in its next
        # loop (every 0.2 s), so its children are back to these within a moment
        deadline = time.monotonic() + 5
        while (left := sorted(p for p in procs.all_pids() if procs.parent(p) == server)) \
                != before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert left == before, [(p, procs.state(p)) for p in left]
    finally:
        cu.stop(force=True)


@ipp.interactive
def preloaded() -> tuple[bool, int]:
    import os
    import sys

    return "tabnanny" in sys.modules, os.getppid()


def test_a_cluster_started_with_preload_has_its_modules_on_every_engine_start_and_restart():
    """``cu.start(preload=[...])`` (units 4 and 5 pass TensorFlow): the fork server is
    started with the list and imports it before it forks, and a restart's engines come from
    the same server; a cluster started without it does not have the module."""
    cid = f"{CID}-preload"
    cc = cu.start(n=2, cluster_id=cid, preload=["tabnanny"])  # nothing else imports it
    try:
        (server,) = servers(cid)
        assert procs.environ_has(server, "COURSE_ENGINE_PRELOAD=tabnanny")
        assert cc.run(preloaded) == [(True, server)] * 2
        cc = cu.restart()
        assert cc.run(preloaded) == [(True, server)] * 2
    finally:
        cu.stop(force=True)
    cc = cu.start(n=1, cluster_id=f"{cid}-without")
    try:
        assert cc.run(preloaded)[0][0] is False
    finally:
        cu.stop(force=True)
