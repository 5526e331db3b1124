"""Unit tests of the pure helpers: rank map, ports, profiles, settings, backend choice."""

from __future__ import annotations

import os
import random
import socket
import time
from pathlib import Path

import pytest

from course_utils import settings
from course_utils.cluster import ports
from course_utils.cluster.launchers.fork_client import ForkedEngineSetLauncher
from course_utils.cluster.launchers.launching import cluster_kwargs
from course_utils.cluster.profiles import ClusterProfile, load_profile, profile_from_dict
from course_utils.cluster.ranks import build_rank_map
from course_utils.errors import BackendUnavailable, CourseError, ProfileError
from course_utils.torch_dist import choose_backend


def desc(host, addr="10.0.0.1", pid=1, gpus=0):
    return {"host": host, "addr": addr, "pid": pid, "gpus": gpus}


# ---- rank map ----------------------------------------------------------------------------------
def test_local_rank_map_orders_by_engine_id_and_uses_loopback():
    rm = build_rank_map({3: desc("vm", pid=30), 1: desc("vm", pid=10)}, local=True)
    assert [r.engine_id for r in rm] == [1, 3]
    assert [r.rank for r in rm] == [0, 1]
    assert [r.local_rank for r in rm] == [0, 1]
    assert rm.master_addr == "127.0.0.1"
    assert all(r.world_size == 2 and r.local_world_size == 2 for r in rm)


def test_two_host_rank_map_follows_profile_host_order():
    d = {
        0: desc("gpu-b", "10.0.0.2"), 1: desc("gpu-a", "10.0.0.1"),
        2: desc("gpu-b", "10.0.0.2"), 3: desc("gpu-a", "10.0.0.1"),
    }
    rm = build_rank_map(d, host_order=["gpu-a", "gpu-b"])
    assert [(r.host, r.engine_id, r.rank, r.local_rank, r.node_rank) for r in rm] == [
        ("gpu-a", 1, 0, 0, 0), ("gpu-a", 3, 1, 1, 0),
        ("gpu-b", 0, 2, 0, 1), ("gpu-b", 2, 3, 1, 1),
    ]
    assert rm.master_addr == "10.0.0.1"  # rank 0's host
    assert rm.by_engine(0).rank == 2
    env = rm[3].as_env()
    assert env == {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                   "GROUP_RANK": "1", "MASTER_ADDR": "10.0.0.1"}


def test_rank_map_unknown_hosts_sorted_after_listed_ones():
    rm = build_rank_map({0: desc("z"), 1: desc("a"), 2: desc("m")}, host_order=["m"])
    assert [r.host for r in rm] == ["m", "a", "z"]


def test_rank_map_rejects_empty_and_table_lists_every_rank():
    with pytest.raises(ValueError, match="no engines"):
        build_rank_map({})
    table = build_rank_map({0: desc("vm"), 1: desc("vm")}, local=True).table()
    assert len(table.splitlines()) == 3 and "rank" in table


def test_rank_map_by_engine_unknown_raises():
    rm = build_rank_map({0: desc("vm")}, local=True)
    with pytest.raises(KeyError):
        rm.by_engine(9)


# ---- ports ---------------------------------------------------------------------------------------
def test_free_port_is_bindable_and_distinct():
    many = ports.free_ports(5)
    assert len(set(many)) == 5
    p = ports.free_port()
    assert not ports.port_in_use(p)


def test_free_ports_come_from_below_the_ephemeral_range():
    # Outgoing connections get ports from the ephemeral range; a port picked below it cannot
    # be taken by one of them between the pick and the bind.
    low, high = ports.pick_range()
    ephemeral_low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    assert (low, high) == (ports.PICK_FLOOR, ephemeral_low)
    assert all(low <= p < high for p in ports.free_ports(20))
    random.seed(0)  # a learner's seed must not make every process pick the same ports
    first = ports.free_ports(3)
    random.seed(0)
    assert ports.free_ports(3) != first


def _hold_block(size: int = 10) -> tuple[int, list[socket.socket]]:
    """``size`` consecutive ports bound here, below the ports the course picks from (so no
    other test's cluster takes one meanwhile): the first port and the sockets holding them."""
    for low in range(ports.PICK_FLOOR - 1000, 1024, -size):
        held: list[socket.socket] = []
        try:
            for port in range(low, low + size):
                held.append(socket.socket())
                held[-1].bind(("127.0.0.1", port))
            return low, held
        except OSError:
            for s in held:
                s.close()
    raise RuntimeError("no block of free ports below the course's range")


def test_a_learners_block_of_ports_is_kept_and_a_full_one_says_so(monkeypatch):
    low, held = _hold_block()
    try:  # the whole block taken: an error, not a port outside
        monkeypatch.setenv("COURSE_PORTS", f"{low}-{low + 9}")
        assert ports.pick_range() == (low, low + 10)
        with pytest.raises(CourseError, match="no 1 free port"):
            ports.free_port()
    finally:
        for s in held:
            s.close()
    assert all(low <= p <= low + 9 for p in ports.free_ports(4))
    monkeypatch.setenv("COURSE_PORTS", "20000")
    with pytest.raises(CourseError, match="not a block of ports LOW-HIGH"):
        ports.pick_range()


def test_free_ports_skip_a_port_someone_listens_on(monkeypatch):
    with socket.socket() as taken:
        low, high = ports.pick_range()
        for port in range(low, high):
            try:
                taken.bind(("127.0.0.1", port))
                break
            except OSError:
                continue
        taken.listen()
        busy = taken.getsockname()[1]
        # the listening port twice, then the real generator: the port next to it may be taken
        # by another test's server while the suite runs
        picks, real = iter([busy, busy]), ports._RNG.randrange
        monkeypatch.setattr(ports._RNG, "randrange", lambda a, b: next(picks, 0) or real(a, b))
        got = ports.free_ports(1)
        assert got != [busy] and low <= got[0] < high


def test_free_ports_let_the_os_pick_when_the_range_leaves_no_room(monkeypatch):
    monkeypatch.setattr(ports, "pick_range", lambda: (0, 0))
    many = ports.free_ports(3)
    assert len(set(many)) == 3 and all(0 < p < 65536 for p in many)


def test_port_in_use_detects_a_listener():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert ports.port_in_use(s.getsockname()[1])
    with pytest.raises(ValueError):
        ports.port_in_use(70000)


# ---- backend choice ------------------------------------------------------------------------------
def test_auto_backend_is_gloo_on_cpu_and_nccl_with_a_gpu_per_rank():
    assert choose_backend("auto", [0, 0], [0, 1]) == "gloo"
    assert choose_backend("auto", [2, 2], [0, 1]) == "nccl"
    assert choose_backend("auto", [1, 1], [0, 1]) == "gloo"  # rank 1 would share GPU 0
    assert choose_backend("gloo", [2, 2], [0, 1]) == "gloo"


def test_nccl_without_gpus_names_the_ranks_and_the_fix():
    with pytest.raises(BackendUnavailable) as err:
        choose_backend("nccl", [0, 0], [0, 1])
    assert "rank(s) [0, 1]" in str(err.value) and "Fix:" in str(err.value)
    with pytest.raises(BackendUnavailable, match="not one of"):
        choose_backend("mpi-ish", [0], [0])


# ---- profiles ------------------------------------------------------------------------------------
def test_local_profile_defaults(monkeypatch):
    monkeypatch.delenv("COURSE_ENGINE_PYTHON", raising=False)
    prof = load_profile(None)
    assert prof.is_local and prof.engine_count(3) == 3 and prof.engine_cmd() is None
    env = prof.engine_env(2, threads=1)
    assert env["OMP_NUM_THREADS"] == "1" and "GLOO_SOCKET_IFNAME" not in env
    assert cluster_kwargs(prof)["engines"] is ForkedEngineSetLauncher
    monkeypatch.setenv("COURSE_ENGINE_FORK", "0")
    assert cluster_kwargs(prof)["engines"] == "local"


def test_two_host_example_profile_parses():
    prof = load_profile("two-hosts")
    assert prof.launcher == "ssh" and len(prof.hosts) == 2
    assert prof.engine_count(None) == sum(h.engines for h in prof.hosts)
    env = prof.engine_env(4, threads=8)
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == prof.socket_ifname
    kw = cluster_kwargs(prof)
    assert kw["engines"].__name__ == "CourseSSHEngineSetLauncher"
    assert kw["controller_ip"] == kw["controller_location"] == prof.controller_ip
    engines = kw["config"].SSHEngineSetLauncher.engines
    assert list(engines) == prof.host_order


@pytest.mark.parametrize("name", ["local", "two-hosts", "slurm"])
def test_every_launchers_engines_wait_30_s_for_their_registration(name, tmp_path):
    """ipyparallel's engines give up after 5 s without the controller's answer; a controller
    busy starting several learners' clusters at once can take longer."""
    from course_utils.cluster.launchers.launching import REGISTRATION_S, new_ipp_cluster

    cl = new_ipp_cluster("reg-test", load_profile(name), 2)
    engines = cl.engine_launcher_class(parent=cl, profile_dir=str(tmp_path), cluster_id="r")
    assert REGISTRATION_S >= 30
    assert engines.engine_args == [f"--IPEngine.timeout={REGISTRATION_S}"]
    if hasattr(engines, "write_batch_script"):  # Slurm: the line srun runs in the job script
        engines.write_batch_script(2)
        command = Path(engines.batch_file).read_text().splitlines()[-1]
    else:  # a set of per-engine launchers, each given the config traits it shares with the
        # set, as ipyparallel's start() does; an SSH one runs ``program + program_args`` there
        shared = set(engines.traits(config=True)) & set(
            engines.launcher_class.class_traits(config=True))
        one = engines.launcher_class(parent=engines, **{t: getattr(engines, t) for t in shared})
        command = " ".join(map(str, getattr(one, "program_args", None) or one.args))
    assert f"--IPEngine.timeout={REGISTRATION_S}" in command, command


@pytest.mark.parametrize(
    "data, match",
    [
        ({"launcher": "mpi"}, "not one of"),
        ({"launcher": "ssh", "controller_ip": "1.2.3.4"}, "needs \\[\\[hosts\\]\\]"),
        ({"launcher": "ssh", "hosts": [{"host": "a"}]}, "needs controller_ip"),
        ({"hosts": [{"engines": 2}]}, "has no 'host'"),
        ({"hosts": [{"host": "a", "engines": 0}]}, "not a positive integer"),
        ({"engines": -1}, "engines = -1"),
    ],
)
def test_bad_profiles_are_clear_errors(data, match):
    with pytest.raises(ProfileError, match=match) as err:
        profile_from_dict(data, name="t")
    assert isinstance(err.value, CourseError) and err.value.fix


def test_missing_profile_file_names_where_it_looked(tmp_path):
    with pytest.raises(ProfileError, match="not found"):
        load_profile(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("launcher = ")
    with pytest.raises(ProfileError, match="not valid TOML"):
        load_profile(bad)


def test_profile_object_passes_through():
    p = ClusterProfile(name="x")
    assert load_profile(p) is p


# ---- settings ------------------------------------------------------------------------------------
def test_sbatch_script_runs_the_module_it_is_given():
    from course_utils.cluster.launchers.slurm_script import (
        SCRIPT_MODULE,
        check_sbatch_script,
        make_sbatch_script,
    )

    default = make_sbatch_script("two-hosts")
    assert check_sbatch_script(default).ok and f"-m {SCRIPT_MODULE} " in default
    mine = make_sbatch_script("two-hosts", module="my_pkg.train", script_args=["--lr", "0.1"])
    assert check_sbatch_script(mine, module="my_pkg.train").ok
    assert "-m my_pkg.train --lr 0.1" in mine and "# python -m my_pkg.train on 2 node" in mine
    assert not check_sbatch_script(mine).ok  # the default check still expects unit 3's script
    with pytest.raises(ValueError, match="module"):
        make_sbatch_script("two-hosts", module="rm -rf /")


def test_local_engines_wait_until_the_connection_file_is_complete(tmp_path):
    import json
    import threading

    from course_utils.cluster.engines import ipyparallel_engine as boot

    env = {"IPP_PROFILE_DIR": str(tmp_path), "IPP_CLUSTER_ID": "c1"}
    path = tmp_path / "security" / "ipcontroller-c1-engine.json"
    assert boot.connection_file(env) == str(path)
    assert boot.connection_file({"IPP_PROFILE_DIR": "/p"}).endswith(
        "/p/security/ipcontroller-engine.json")
    path.parent.mkdir()
    path.write_text("")  # what the controller leaves between creating and writing the file
    assert not boot.wait_for_connection_file(str(path), timeout=0.2)
    threading.Timer(0.3, lambda: path.write_text(json.dumps({"key": "k"}))).start()
    t0 = time.monotonic()
    assert boot.wait_for_connection_file(str(path), timeout=10)
    assert 0.25 < time.monotonic() - t0 < 5
    boot.preload(["colorsys", "no_such_module_here"])  # a missing one is skipped
    import sys

    assert "colorsys" in sys.modules


def test_settings_read_environment(monkeypatch):
    monkeypatch.setenv("COURSE_ENGINES", "3")
    assert settings.default_engines() == 3
    monkeypatch.setenv("COURSE_ENGINES", "three")
    with pytest.raises(ValueError, match="not an integer"):
        settings.default_engines()
    monkeypatch.setenv("COURSE_ENGINES", "0")
    with pytest.raises(ValueError, match="positive"):
        settings.default_engines()


def test_thread_budget_splits_cores_between_engines():
    assert settings.threads_per_engine(2, cores=2) == 1
    assert settings.threads_per_engine(4, cores=16) == 4
    assert settings.threads_per_engine(8, cores=2) == 1


def test_course_error_renders_cause_and_fix():
    err = CourseError("it broke", "do this")
    assert str(err) == "it broke\nFix: do this"
    assert err._render_traceback_()[-1] == "Fix: do this"


# ---- data ----------------------------------------------------------------------------------------
def test_digits_are_real_and_scaled():
    from course_utils.data import digits

    d = digits()
    assert d.x.shape == (1797, 64) and d.x.dtype.name == "float32"
    assert 0.0 <= d.x.min() and d.x.max() <= 1.0
    assert sorted(set(d.y.tolist())) == list(range(10)) and "sklearn" in d.note


def test_shards_are_disjoint_equal_and_cover():
    import numpy as np

    from course_utils.data import shard_indices

    shards = [shard_indices(10, r, 3, seed=1) for r in range(3)]
    assert [len(s) for s in shards] == [3, 3, 3]
    allidx = np.concatenate(shards)
    assert len(set(allidx.tolist())) == 9
    assert not np.array_equal(shards[0], shard_indices(10, 0, 3, seed=2))
    assert len(shard_indices(10, 0, 3, drop_last=False)) == 4
    with pytest.raises(ValueError, match="not in 0..2"):
        shard_indices(10, 3, 3)


# ---- framework import guard ----------------------------------------------------------------------
def test_torchvision_imports_after_tensorflow_without_crashing():
    """Without course_utils.compat this order segfaults (exit -11) on TF 2.21 + torch 2.14."""
    import subprocess
    import sys

    code = ("import course_utils, torch, tensorflow, torchvision, sys; "
            "print('ok', 'triton' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=180, env={"TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-1500:]
    assert out.stdout.strip().endswith("ok False")


def test_import_guard_installs_once():
    from course_utils.compat import install_import_guard

    assert install_import_guard() is False  # course_utils' import already installed it


# ---- grading helpers -----------------------------------------------------------------------------
def test_with_solution_replaces_only_the_region_and_keeps_indent():
    from nbformat.v4 import new_code_cell, new_notebook

    from course_utils.instructor.graded_tests import with_solution

    cell = new_code_cell("def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION\n")
    cell.metadata["nbgrader"] = {"grade_id": "ex", "solution": True}
    nb = with_solution(new_notebook(cells=[cell]), "ex", "x = 2\nreturn x")
    assert nb.cells[0].source == "def f():\n    x = 2\n    return x\n"
    with pytest.raises(KeyError):
        with_solution(nb, "missing", "pass")
    with pytest.raises(ValueError, match="no solution region"):
        with_solution(nb, "ex", "pass")



#: Stands in for ``ssh``: runs the command on this machine while the "link" file exists, and
#: fails as ssh does (exit 255) once it is gone.
LINK_SSH = """
import os, subprocess, sys
if not os.path.exists(sys.argv[1]):
    sys.stderr.write("ssh: connect to host: No route to host\\n")
    sys.exit(255)
command = " ".join(sys.argv[sys.argv.index("HOST") + 1:])
sys.exit(subprocess.run(command, shell=True, executable="/bin/bash").returncode)
"""


def test_an_engine_whose_host_stays_unreachable_is_reported_stopped(tmp_path, caplog):
    """The SSH engine launcher's poll (ipyparallel's ``ssh_waitpid`` on a real process): a
    failed ssh is retried, and after ``unreachable_for`` the engine counts as stopped (-1) with
    a warning, where ipyparallel's waiting thread would die with a traceback."""
    import logging
    import subprocess
    import sys
    import time

    from course_utils.cluster.launchers.ssh import CourseSSHEngineLauncher

    (tmp_path / "ssh.py").write_text(LINK_SSH)
    link = tmp_path / "link-up"
    link.touch()
    engine = subprocess.Popen(["sleep", "60"])
    try:
        launcher = CourseSSHEngineLauncher(
            ssh_cmd=[sys.executable, str(tmp_path / "ssh.py"), str(link)], ssh_args=[],
            hostname="HOST", remote_python=sys.executable)
        launcher.log = logging.getLogger("test-ssh-poll")
        launcher.pid, launcher.unreachable_for = engine.pid, 0.5
        with pytest.raises(TimeoutError, match="still running"):  # the real poll, link up
            launcher.wait_one(timeout=1)
        link.unlink()
        with pytest.raises(TimeoutError, match="polling again"):
            launcher.wait_one(timeout=1)
        time.sleep(0.6)
        with caplog.at_level(logging.WARNING, logger="test-ssh-poll"):
            assert launcher.wait_one(timeout=1) == -1
        assert "no answer from the host" in caplog.text and "taking it as stopped" in caplog.text
    finally:
        engine.kill()


def test_procs_tell_live_zombie_and_gone_processes_apart():
    import subprocess
    import sys

    from course_utils import procs

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                             env={**os.environ, "COURSE_TEST_MARK": "procs-1"})
    try:
        # until the child has exec'd python, /proc shows this process's command line and
        # environment (a forked copy); wait for that moment, bounded
        deadline = time.time() + 10
        while "time.sleep(30)" not in " ".join(procs.cmdline(child.pid)) \
                and time.time() < deadline:
            time.sleep(0.01)
        assert procs.pid_alive(child.pid)
        assert procs.parent(child.pid) == os.getpid()
        assert procs.start_time(child.pid)
        assert child.pid in set(procs.pids_with_environ("COURSE_TEST_MARK=procs-1"))
        assert child.pid in set(procs.pids_with_environ_prefix("COURSE_TEST_MARK=procs-"))
        assert child.pid not in set(procs.pids_with_environ_prefix("COURSE_TEST_MARK=procs-2"))
        assert "time.sleep(30)" in " ".join(procs.cmdline(child.pid))
    finally:
        child.kill()
        deadline = time.time() + 10
        while procs.state(child.pid) not in ("Z", None) and time.time() < deadline:
            time.sleep(0.05)
    assert procs.state(child.pid) == "Z", "an unreaped child is a zombie"
    assert not procs.pid_alive(child.pid), "a zombie is not alive"
    child.wait()
    assert not procs.pid_alive(child.pid) and procs.start_time(child.pid) is None


def test_notebook_cells_find_by_grade_id_or_cell_id_in_nbformat_and_json():
    import nbformat

    from course_utils import notebook_cells as nc

    raw = {"cells": [
        {"cell_type": "markdown", "id": "intro", "metadata": {}, "source": ["# T"]},
        {"cell_type": "code", "id": "c1", "metadata": {"nbgrader": {"grade_id": "ex1"}},
         "source": ["%%px\n", "x = 1\n"]},
    ]}
    node = nbformat.from_dict({**raw, "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
    for cells in (raw["cells"], node.cells):
        assert nc.grade_id(nc.find_cell(cells, "ex1")) == "ex1"
        assert nc.find_cell(cells, "c1") is nc.find_cell(cells, "ex1")
        assert nc.find_cell(cells, "intro", cell_type="code") is None
        assert nc.find_cell(cells, "nope") is None
        assert nc.without_px(nc.source_text(nc.find_cell(cells, "ex1"))) == "x = 1"
    assert nc.nbgrader_meta(raw["cells"][0]) == {}


def test_notebook_cells_pair_tests_and_solutions_by_exercise_metadata_not_by_grade_id():
    from course_utils import notebook_cells as nc

    def cell(gid, *, solution=False, grade=False, exercise=None, cell_type="code", **course):
        meta = {"nbgrader": {"grade_id": gid, "solution": solution, "grade": grade}}
        if exercise or course:
            meta["course"] = {**({"exercise": exercise} if exercise else {}), **course}
        return {"cell_type": cell_type, "metadata": meta, "source": ""}

    cells = [cell("ex1-solution", solution=True, exercise="ex1"),
             cell("ex1-lesson"),                                   # no exercise: a lesson
             cell("check-shards", grade=True, exercise="ex1"),     # paired, whatever its name
             cell("ex1-test", grade=True, exercise="predict"),     # a name's prefix pairs nothing
             cell("predict-solution", solution=True, exercise="predict"),
             cell("written", solution=True, grade=True, exercise="essay", cell_type="markdown"),
             cell("stop", teardown=True), cell("teardown-md", cell_type="markdown")]
    assert nc.exercise_cells(cells) == {"ex1": {"solution": [0], "tests": [2]},
                                        "predict": {"solution": [4], "tests": [3]}}
    assert [nc.exercise(c) for c in cells[:3]] == ["ex1", "", "ex1"]
    assert [nc.is_teardown(c) for c in cells] == [False] * 6 + [True, False]
