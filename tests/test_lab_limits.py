"""A learner's memory on the hub host (course_utils/workshop/lab_limits.py, lab_spawner.py):
the workshop file's size, the groups made under a cgroup root, the hub's spawner moving a
process into its learner's group before it drops root, and the check's line. The real-cgroup
tests need root and a memory controller (as CI and the rig have); else they skip."""

from __future__ import annotations

import getpass
import os
import subprocess
import sys
import types

import pytest

from course_utils.workshop import lab_limits
from course_utils.workshop.check_setup import check_lab_memory
from course_utils.workshop.plan import WorkshopError, parse_size, workshop_from_dict
from course_utils.workshop.render import hub_config

HOSTS = [{"name": "gpu1", "address": "10.0.0.1", "gpus": 2, "cpus": 8}]

real_cgroups = pytest.mark.skipif(
    os.geteuid() != 0 or lab_limits.memory_controller() is None,
    reason="needs root and a cgroup memory controller; run: sudo make test")


def test_sizes_in_the_workshop_file():
    assert parse_size("8G") == 8 << 30 and parse_size("512M") == 512 << 20
    assert parse_size("1.5G") == 3 << 29 and parse_size(" 2 GiB") == 2 << 30
    assert parse_size(0) == 0 and parse_size("0") == 0 and parse_size(4096) == 4096
    for bad in ("8X", "", "G", -1, True):
        with pytest.raises(ValueError):
            parse_size(bad)
    assert workshop_from_dict({"learners": 2, "hosts": HOSTS}).max_memory == 8 << 30
    ws = workshop_from_dict({"learners": 2, "hosts": HOSTS, "hub": {"max_memory": "2G"}})
    assert ws.max_memory == 2 << 30
    with pytest.raises(WorkshopError, match=r"max_memory.*not a size") as err:
        workshop_from_dict({"learners": 2, "hosts": HOSTS, "hub": {"max_memory": "2 gigs"}})
    assert '"8G"' in err.value.fix


def test_the_hubs_config_starts_labs_with_the_limited_spawner(tmp_path):
    ws = workshop_from_dict({"learners": 2, "hosts": HOSTS, "hub": {"max_memory": "3G"}})
    text = hub_config(ws, tmp_path / "p", tmp_path / "r", tmp_path / "s")
    assert ('c.JupyterHub.spawner_class = "course_utils.workshop.lab_spawner.LimitedSpawner"'
            in text)
    assert f"c.LimitedSpawner.memory_max = {3 << 30}" in text


def test_groups_under_a_v1_and_a_v2_root(tmp_path):
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text("max")
    procs = lab_limits.prepare_group("ann", 1 << 30, v1)
    assert procs == v1 / "memory" / "course-labs" / "ann" / "cgroup.procs"
    assert (procs.parent / "memory.limit_in_bytes").read_text() == str(1 << 30)

    v2 = tmp_path / "v2"
    (v2 / "course-labs").mkdir(parents=True)  # a real cgroupfs makes these files itself
    (v2 / "cgroup.controllers").write_text("cpu io memory pids")
    (v2 / "cgroup.subtree_control").write_text("cpu")
    (v2 / "course-labs" / "cgroup.subtree_control").write_text("")
    procs = lab_limits.prepare_group("ben", 2 << 30, v2)
    assert (procs.parent / "memory.max").read_text() == str(2 << 30)
    assert (v2 / "cgroup.subtree_control").read_text() == "+memory"  # given to the children
    assert (v2 / "course-labs" / "cgroup.subtree_control").read_text() == "+memory"

    assert lab_limits.memory_controller(tmp_path / "none") is None
    with pytest.raises(OSError, match="no cgroup memory controller"):
        lab_limits.prepare_group("cy", 1, tmp_path / "none")


def _allocating(mb: int, preexec) -> subprocess.CompletedProcess:
    code = (f"b = b'x' * ({mb} << 20)\n"
            "from course_utils.workshop.lab_limits import group_of\nimport os\n"
            "print(group_of(os.getpid()))")
    return subprocess.run([sys.executable, "-c", code], preexec_fn=preexec, capture_output=True,
                          text=True, timeout=60)


@real_cgroups
def test_the_spawners_process_joins_its_learners_group_before_dropping_root_and_is_held_to_it():
    from course_utils.workshop.lab_spawner import LimitedSpawner

    learner = f"pytest-{os.getpid()}"
    spawner = LimitedSpawner(memory_max=200 << 20)
    spawner._procs_file = lab_limits.prepare_group(learner, 200 << 20)
    spawner.user = types.SimpleNamespace(name=learner)
    try:
        preexec = spawner.make_preexec_fn(getpass.getuser())  # root here: setuid to itself
        small = _allocating(50, preexec)
        assert small.returncode == 0, small.stderr
        assert small.stdout.strip().endswith(f"/course-labs/{learner}")
        big = _allocating(400, preexec)  # past the group's limit: the OOM killer ends it
        assert big.returncode == -9, (big.returncode, big.stderr)
        assert not lab_limits.group_of(os.getpid()).endswith(learner)  # the hub is not in it
    finally:
        os.rmdir(spawner._procs_file.parent)


@real_cgroups
def test_the_check_makes_a_probe_group_and_reads_its_limit_back():
    ws = workshop_from_dict({"learners": 2, "hosts": HOSTS, "hub": {"max_memory": "3G"}})
    line = check_lab_memory(ws)
    assert line.status == "PASS" and f"= {3 << 30})" in line.text(), line.text()
    assert not (lab_limits.memory_controller()[0] / "course-check").exists()


def test_the_check_names_a_missing_controller_and_an_unset_limit(monkeypatch, tmp_path):
    ws = workshop_from_dict({"learners": 2, "hosts": HOSTS, "hub": {"max_memory": 0}})
    assert check_lab_memory(ws).text().startswith("[WARN] lab memory: [hub] max_memory = 0")
    monkeypatch.setattr(lab_limits, "CGROUP_ROOT", tmp_path)
    line = check_lab_memory(workshop_from_dict({"learners": 2, "hosts": HOSTS}))
    assert line.status == "FAIL" and "set [hub] max_memory = 0" in line.fix, line.text()
