"""The one-node SLURM test rig (tests/rigs/slurm.py): real munged, slurmctld and slurmd."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from course_utils import procs
from tests.rigs import slurm as rigs_slurm
from tests.rigs.common import RigError, RigUnavailable
from tests.rigs.slurm import (
    MARKER,
    SlurmRig,
    clean_stale,
    ensure_packages,
    kill_processes,
    listening_addresses,
    marked_processes,
    missing_programs,
    owner_alive,
    parse_job_record,
    require_rig,
    wait_until,
)

# The session rig may first apt-get install Slurm and munge (CI=true).
pytestmark = pytest.mark.timeout(1200)
slurm_rig = rigs_slurm.slurm_rig  # the session fixture, shared by every test module using it


# -- helpers, no cluster needed ---------------------------------------------------------------

def test_listening_addresses_sees_a_loopback_listener() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert listening_addresses(port) == ["0100007F"]
    assert listening_addresses(port) == []


def test_wait_until_returns_the_value_or_raises_with_diagnostics() -> None:
    calls = iter([None, 0, "ready"])
    assert wait_until(lambda: next(calls), 5, "the thing", interval=0) == "ready"
    with pytest.raises(RigError) as info:
        wait_until(lambda: None, 0.05, "never", lambda: "LOG TAIL", interval=0.01)
    assert "waiting for never" in str(info.value)
    assert "Fix:" in str(info.value) and "LOG TAIL" in str(info.value)


def test_parse_job_record_reads_state_and_reason() -> None:
    line = ("JobId=3 JobName=wrap UserId=root(0) JobState=PENDING Reason=PartitionConfig "
            "Dependency=(null) Requeue=1")
    assert parse_job_record(line) == ("PENDING", "PartitionConfig")
    assert parse_job_record("") == ("UNKNOWN", "None")


def test_missing_programs_names_only_absent_ones() -> None:
    assert missing_programs(["sh", "no-such-program-xyz"]) == ["no-such-program-xyz"]


def test_ensure_packages_explains_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("COURSE_TEST_INSTALL", raising=False)
    monkeypatch.setattr(rigs_slurm, "missing_programs", lambda names=(): ["slurmd"])
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    with pytest.raises(RigUnavailable, match="slurmd not installed.*apt-get install"):
        ensure_packages()
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(RigUnavailable, match="needs root"):
        ensure_packages()


def test_require_rig_skips_but_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="needs root"):
        require_rig()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI must run every rig.*needs root"):
        require_rig()


def test_owner_alive_checks_pid_and_start_time(tmp_path: Path) -> None:
    owner = tmp_path / "owner"
    owner.write_text(f"{os.getpid()} {procs.start_time(os.getpid())}\n")
    assert owner_alive(owner)
    owner.write_text(f"{os.getpid()} 1\n")  # same pid, other start time: a reused pid
    assert not owner_alive(owner)
    owner.write_text("garbage")
    assert not owner_alive(owner)
    assert not owner_alive(tmp_path / "missing")


def _marked_shell(root: Path) -> subprocess.Popen[bytes]:
    """A marked shell with an unmarked-looking child (like slurmstepd and its task)."""
    env = dict(os.environ, **{MARKER: str(root)})
    proc = subprocess.Popen(["sh", "-c", "sleep 60 & wait"], env=env, start_new_session=True)
    wait_until(lambda: len(marked_processes(root)) == 2, 5, "the shell and its sleep")
    return proc


def test_marked_processes_finds_descendants_and_kill_processes_ends_them(tmp_path: Path) -> None:
    proc = _marked_shell(tmp_path)
    pids = marked_processes(tmp_path)
    assert proc.pid in pids and len(pids) == 2
    kill_processes(pids)
    proc.wait(5)
    assert marked_processes(tmp_path) == []


def test_daemon_ports_stay_below_the_course_picks_and_the_learners_blocks() -> None:
    from course_utils.cluster.ports import PICK_FLOOR
    from course_utils.workshop.plan import PORT_BASE

    ports = rigs_slurm.daemon_ports(2)
    assert len(set(ports)) == 2 and all(p < min(PICK_FLOOR, PORT_BASE) for p in ports), ports


def test_clean_stale_removes_runs_of_dead_owners_only(tmp_path: Path) -> None:
    dead, alive = tmp_path / "run-dead", tmp_path / "run-alive"
    dead.mkdir()
    alive.mkdir()
    (dead / "owner").write_text("999999 1\n")
    (alive / "owner").write_text(f"{os.getpid()} {procs.start_time(os.getpid())}\n")
    proc = _marked_shell(dead)
    assert clean_stale(tmp_path) == [dead]
    proc.wait(5)
    assert not dead.exists() and alive.exists()
    assert marked_processes(dead) == []


# -- the real cluster -------------------------------------------------------------------------

def test_sinfo_shows_the_partition_idle(slurm_rig: SlurmRig) -> None:
    assert slurm_rig.node == socket.gethostname().split(".")[0]
    assert slurm_rig.cpus == 2 and slurm_rig.partition == "debug"
    assert slurm_rig.env == {"SLURM_CONF": str(slurm_rig.conf)}
    out = slurm_rig.run(["sinfo", "-h", "-p", slurm_rig.partition, "-o", "%P %a %D %t %N %c"])
    print(slurm_rig.run("sinfo").stdout)
    assert out.stdout.split() == ["debug*", "up", "1", "idle", slurm_rig.node, "2"]


def test_daemons_listen_on_loopback_only(slurm_rig: SlurmRig) -> None:
    assert listening_addresses(slurm_rig.ctld_port) == ["0100007F"]
    assert listening_addresses(slurm_rig.slurmd_port) == ["0100007F"]


def test_srun_runs_two_tasks(slurm_rig: SlurmRig) -> None:
    out = slurm_rig.run("srun -n2 hostname").stdout.splitlines()
    assert out == [socket.gethostname()] * 2


def test_sbatch_job_writes_one_line_per_task(slurm_rig: SlurmRig) -> None:
    job = slurm_rig.sbatch("srun bash -c 'echo task $SLURM_PROCID local $SLURM_LOCALID'\n",
                           "--ntasks=2", "--output=tasks-%j.out")
    assert slurm_rig.wait_job(job, timeout=30) == "COMPLETED"
    out = slurm_rig.job_output(job)
    assert out.name == f"tasks-{job}.out"
    assert sorted(out.read_text().splitlines()) == ["task 0 local 0", "task 1 local 1"]


def test_job_larger_than_the_node_stays_pending_with_a_reason(slurm_rig: SlurmRig) -> None:
    job = slurm_rig.sbatch("hostname\n", f"--ntasks={slurm_rig.cpus + 1}")
    try:
        state, reason = slurm_rig.wait_reason(job)
        assert state == "PENDING"
        assert reason in {"PartitionConfig", "Resources"}, reason
        assert slurm_rig.job_state(job) == (state, reason)
    finally:
        slurm_rig.cancel(job)
    assert slurm_rig.wait_job(job, timeout=10) == "CANCELLED"


def test_sacct_says_accounting_is_disabled(slurm_rig: SlurmRig) -> None:
    assert not slurm_rig.accounting
    done = slurm_rig.run("sacct", check=False)
    assert done.returncode != 0
    assert "accounting storage is disabled" in done.stdout + done.stderr


def test_activated_points_subprocesses_at_the_rig_and_restores(slurm_rig: SlurmRig,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "12345")  # an outer job's variable must not leak in
    monkeypatch.delenv("SLURM_CONF", raising=False)
    before = dict(os.environ)
    with slurm_rig.activated():
        assert os.environ["SLURM_CONF"] == str(slurm_rig.conf)
        assert "SLURM_JOB_ID" not in os.environ
        child = subprocess.run([sys.executable, "-c",
                                "import subprocess; print(subprocess.run(['sinfo', '-h', '-o', "
                                "'%t'], capture_output=True, text=True).stdout)"],
                               capture_output=True, text=True, timeout=30, check=True)
        assert child.stdout.split() == ["idle"]
    assert dict(os.environ) == before


def test_failed_start_raises_with_logs_and_removes_everything(
        monkeypatch: pytest.MonkeyPatch) -> None:
    require_rig()
    monkeypatch.setattr(rigs_slurm, "_SLURM_CONF", rigs_slurm._SLURM_CONF + "NoSuchKey=1\n")
    def runs() -> set[Path]:
        return set(rigs_slurm.BASE.iterdir()) if rigs_slurm.BASE.exists() else set()

    before = runs()
    with pytest.raises(RigError) as info:
        SlurmRig.start(timeout=10)
    text = str(info.value)
    assert "exited with status" in text and "Fix:" in text
    assert "unrecognized key: NoSuchKey" in text  # the daemon's own log line
    assert runs() <= before


def test_teardown_leaves_no_process_and_no_file(slurm_rig: SlurmRig) -> None:
    require_rig()
    rig = SlurmRig.start()  # a second cluster, beside the session one
    try:
        job = rig.sbatch("sleep 60\n")
        wait_until(lambda: rig.job_state(job)[0] == "RUNNING", 15, "the job to run")
        pids = rig.pids()
        daemons = [proc.pid for proc in rig.procs.values()]
        assert set(daemons) < set(pids)  # plus slurmstepd and the job's sleep
    finally:
        rig.teardown()
    assert rig.pids() == []
    assert [pid for pid in pids if procs.pid_alive(pid)] == []
    assert not rig.root.exists()
    rig.teardown()  # twice is fine
    # the session rig was not disturbed
    assert slurm_rig.run(["sinfo", "-h", "-o", "%t"]).stdout.split() == ["idle"]
