"""Engines as a Slurm job (course_utils/cluster/launchers/slurm.py), ``course doctor --profile`` and
unit 6's batch script (course_utils/cluster/launchers/slurm_script.py) submitted with ``sbatch``.

The first half needs no Slurm (profile parsing, batch script, Slurm's words, rank map); the
second half runs on the one-node rig of tests/rigs/slurm.py (skipped with the install command
where it cannot be built, run in CI).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import socket
import subprocess
import time
import tomllib
from pathlib import Path

import pytest

import course_utils as cu
from course_utils import cli, procs
from course_utils.cluster import ports
from course_utils.cluster.engines import engine
from course_utils.cluster.kernel import lifecycle
from course_utils.cluster.launchers import slurm, slurm_queue
from course_utils.cluster.launchers.launching import cluster_kwargs
from course_utils.cluster.launchers.slurm_script import (
    RDZV_PORT,
    check_sbatch_script,
    make_sbatch_script,
    write_sbatch_script,
)
from course_utils.cluster.profiles import (
    ClusterProfile,
    SlurmSpec,
    load_profile,
    profile_from_dict,
)
from course_utils.cluster.ranks import build_rank_map, slurm_step
from course_utils.errors import CourseError, EnginesDidNotStart, ProfileError
from course_utils.instructor import doctor_slurm
from tests.rigs import slurm as rigs_slurm
from tests.rigs.slurm import SlurmRig, wait_until

# The session rig may first apt-get install Slurm and munge (CI=true).
pytestmark = pytest.mark.timeout(1200)
slurm_rig = rigs_slurm.slurm_rig  # the session-wide one-node cluster


def slurm_profile(**slurm_table: object) -> dict:
    """A slurm profile as a dict: loopback controller, 2 engines, the given [slurm] table."""
    return {"launcher": "slurm", "controller_ip": "127.0.0.1", "engines": 2,
            "slurm": slurm_table}


# ---- profile ----------------------------------------------------------------------------------
def test_example_slurm_profile_parses_into_the_jobs_request():
    prof = load_profile("slurm")
    spec = prof.slurm
    assert prof.launcher == "slurm" and prof.engine_count(None) == 4
    assert (spec.partition, spec.time, spec.cpus_per_engine, spec.gpus_per_engine,
            spec.account, spec.nodes) == ("gpu", "01:00:00", 8, 1, "course", 2)
    assert prof.engine_env(4, threads=99)["OMP_NUM_THREADS"] == "8"  # the job's CPUs per task
    kw = cluster_kwargs(prof)
    assert kw["engines"] is slurm.SlurmEngines
    assert kw["controller_ip"] == kw["controller_location"] == prof.controller_ip
    script = kw["config"].SlurmEngines.batch_template
    for line in ("#SBATCH --partition=gpu", "#SBATCH --time=01:00:00",
                 "#SBATCH --cpus-per-task=8", "#SBATCH --gpus-per-task=1",
                 "#SBATCH --account=course", "#SBATCH --nodes=2", "#SBATCH --ntasks={n}"):
        assert line in script.splitlines()
    assert script.splitlines()[-1] == ("srun --kill-on-bad-exit=1 --cpus-per-task=8 "
                                       "{program_and_args}")


def test_slurm_profile_without_a_table_asks_for_nothing_special():
    prof = profile_from_dict(slurm_profile(), name="bare")
    assert prof.slurm == SlurmSpec()
    assert slurm.sbatch_options(prof.slurm) == []
    assert prof.engine_env(2, threads=8)["OMP_NUM_THREADS"] == "1"  # Slurm's default: 1 CPU
    assert "--cpus-per-task" not in slurm.batch_template(prof.slurm)


@pytest.mark.parametrize("table, match", [
    ({"time": "1h"}, "not a Slurm time"),
    ({"cpus_per_engine": 0}, "cpus_per_engine = 0"),
    ({"gpus_per_engine": -1}, "gpus_per_engine = -1"),
    ({"nodes": True}, "nodes = True"),
    ({"partition": "gpu; rm -rf"}, "plain name"),
    ({"options": "--exclusive"}, "list of sbatch options"),
    ({"gpu": 1}, "unknown slurm key"),
])
def test_bad_slurm_tables_are_clear_errors(table, match):
    with pytest.raises(ProfileError, match=match) as err:
        profile_from_dict(slurm_profile(**table), name="t")
    assert err.value.fix


def test_a_slurm_table_needs_the_slurm_launcher():
    with pytest.raises(ProfileError, match="needs launcher"):
        profile_from_dict({"slurm": {"partition": "x"}}, name="t")


@pytest.mark.parametrize("time_limit", ["30", "05:00", "02:00:00", "1-12", "1-12:30:00", 45])
def test_slurm_time_formats_are_accepted(time_limit):
    prof = profile_from_dict(slurm_profile(time=time_limit), name="t")
    assert prof.slurm.time == str(time_limit)


# ---- batch script ---------------------------------------------------------------------------
def test_template_escapes_braces_and_refuses_multi_line_options():
    prof = profile_from_dict(slurm_profile(options=["--comment={x}"]), name="t")
    assert "#SBATCH --comment={{x}}" in slurm.batch_template(prof.slurm)
    prof = profile_from_dict(slurm_profile(options=["--comment=a\nsrun evil"]), name="t")
    with pytest.raises(CourseError, match="spans lines"):
        slurm.batch_template(prof.slurm)


def test_launcher_writes_its_batch_script_into_the_profile_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    pdir = tmp_path / "profile"
    pdir.mkdir()
    prof = profile_from_dict(slurm_profile(partition="debug", cpus_per_engine=2), name="t")
    launcher = slurm.SlurmEngines(profile_dir=str(pdir), cluster_id="c1",
                                  config=cluster_kwargs(prof)["config"])
    launcher.write_batch_script(3)
    script = pdir / "slurm_engine-c1.sbatch"
    assert launcher.batch_file == str(script) == str(slurm.batch_file(pdir, "c1"))
    text = script.read_text()
    assert "#SBATCH --ntasks=3" in text and "#SBATCH --partition=debug" in text
    assert "#SBATCH --job-name=ipengine-c1" in text and "ipyparallel.engine" in text
    assert f"#SBATCH --output={pdir}/log/" in text
    assert list(tmp_path.iterdir()) == [pdir]  # nothing in the current directory


def test_batch_script_picks_its_rendezvous_port_on_the_node_unless_given(tmp_path):
    text = make_sbatch_script(rig_ddp_profile(), script_args=["--steps", "1"])
    res = check_sbatch_script(text, expect={"--rdzv-endpoint": "$HEAD_NODE:$RDZV_PORT"})
    assert res.ok, res.errors
    (pick,) = [ln for ln in text.splitlines() if ln.startswith("RDZV_PORT=")]
    port = int(subprocess.run(["bash", "-c", f"set -eu; {pick}; echo $RDZV_PORT"],
                              capture_output=True, text=True, timeout=30, check=True).stdout)
    with socket.socket() as sock:  # free when the script looked
        sock.bind(("", port))
    low, high = ports.pick_range()  # and below the ephemeral range, as every port we pick
    assert low <= port < high
    fixed = make_sbatch_script(rig_ddp_profile(), rdzv_port=29555)
    assert "RDZV_PORT=29555" in fixed.splitlines()
    assert check_sbatch_script(fixed, expect={"--rdzv-endpoint": "$HEAD_NODE:29555"}).ok


# ---- Slurm's words ---------------------------------------------------------------------------
RECORD = ("JobId=7 JobName=ipengine-c UserId=root(0) JobState=PENDING Reason=PartitionConfig "
          "Dependency=(null) ExitCode=0:0 Partition=debug NodeList= NumTasks=2 CPUs/Task=3 "
          "TRES=cpu=6,mem=1M,node=1,billing=6 Command=/tmp/my dir/x.sbatch StdOut={out}")


def test_parse_job_reads_the_fields_a_learner_needs():
    status = slurm.parse_job(RECORD.format(out="/o.log"))
    assert (status.job_id, status.state, status.reason) == ("7", "PENDING", "PartitionConfig")
    assert status.partition == "debug" and status.fields["CPUs/Task"] == "3"
    assert status.fields["Command"] == "/tmp/my dir/x.sbatch"  # a value with a space
    assert status.summary() == "PENDING (reason PartitionConfig)"
    assert slurm.parse_job("", "9").state == "UNKNOWN"


def test_job_error_fails_fast_only_when_waiting_cannot_help(tmp_path):
    never = slurm.parse_job(RECORD.format(out="x"))
    err = slurm.job_error(never, 0, 2, waited=1.2, timed_out=False)
    assert isinstance(err, slurm.SlurmJobError) and isinstance(err, EnginesDidNotStart)
    assert "Slurm job 7" in err.cause and "PENDING, reason PartitionConfig" in err.cause
    assert "2 tasks x 3 CPUs" in err.cause and "waiting will not help" in err.cause
    assert "cpus_per_engine" in err.fix and "sinfo -p debug" in err.fix

    busy = slurm.parse_job(RECORD.format(out="x").replace("PartitionConfig", "Resources"))
    assert slurm.job_error(busy, 0, 2, waited=3.0, timed_out=False) is None
    err = slurm.job_error(busy, 0, 2, waited=30.4, timed_out=True)
    assert "reason Resources" in err.cause and "after 30 s" in err.cause
    assert "$COURSE_START_TIMEOUT" in err.fix

    out = tmp_path / "job.log"
    out.write_text("line 1\n/no/such/python: not found\n")
    ended = slurm.parse_job(RECORD.format(out=out).replace("JobState=PENDING", "JobState=FAILED")
                            .replace("Reason=PartitionConfig", "Reason=NonZeroExitCode"))
    err = slurm.job_error(ended, 1, 2, waited=2, timed_out=False)
    assert "ended FAILED (reason NonZeroExitCode)" in err.cause
    assert "/no/such/python: not found" in err.cause and "1 of 2 engines" in err.cause

    running = slurm.parse_job("JobId=8 JobState=RUNNING Reason=None NodeList=n1")
    assert slurm.job_error(running, 1, 2, waited=5, timed_out=False) is None
    err = slurm.job_error(running, 1, 2, waited=60, timed_out=True)
    assert "RUNNING on n1" in err.cause and "controller_ip" in err.fix


@pytest.mark.parametrize("said, fix", [
    ("sbatch: error: Batch job submission failed: Invalid partition name specified", "sinfo -s"),
    ("sbatch: error: Invalid generic resource (gres) specification", "gpus_per_engine = 0"),
    ("Unable to contact slurm controller (connect failure)", "scontrol ping"),
    ("something new", "course doctor --profile"),
])
def test_explain_names_the_fix(said, fix):
    assert fix in slurm.explain(said)


def test_run_command_failures_are_course_errors():
    assert slurm.run_command(["echo", "hi"]) == "hi\n"
    with pytest.raises(slurm.SlurmError, match="not installed"):
        slurm.run_command(["no-such-sbatch-xyz"])
    with pytest.raises(slurm.SlurmError, match="did not answer within 0.2 s"):
        slurm.run_command(["sleep", "5"], timeout=0.2)
    with pytest.raises(slurm.SlurmError, match=r"failed \(3\): Invalid account") as err:
        slurm.run_command(["sh", "-c", "echo Invalid account >&2; exit 3"])
    assert "sacctmgr" in err.value.fix
    assert slurm.run_command(["sh", "-c", "echo out; exit 3"], check=False) == "out\n"


def test_engines_problem_ignores_clusters_without_slurm():
    class NoSlurm:  # what the hook reads of an ipyparallel Cluster: its engine sets
        engines: dict = {}

    assert slurm_queue.engines_problem(NoSlurm(), 0, 2, timed_out=True) is None


# ---- what engines report, and the rank map ---------------------------------------------------
SRUN_ENV = {"SLURM_JOB_ID": "42", "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
            "SLURM_STEP_NUM_TASKS": "4", "SLURMD_NODENAME": "n2", "SLURM_STEP_NODELIST": "n[1-2]"}


def test_slurm_facts_come_from_srun_variables(monkeypatch):
    assert engine.slurm_facts({"SLURM_JOB_ID": "42"}) is None  # in an allocation, not a task
    assert engine.slurm_facts(SRUN_ENV) == {
        "job_id": 42, "procid": 3, "localid": 1, "nodeid": 1, "ntasks": 4, "node": "n2",
        "nodelist": "n[1-2]"}
    for var in [v for v in os.environ if v.startswith("SLURM")]:
        monkeypatch.delenv(var)
    assert "slurm" not in engine.describe()
    for var, value in SRUN_ENV.items():
        monkeypatch.setenv(var, value)
    assert engine.describe()["slurm"]["procid"] == 3


def _task(procid: int, localid: int, nodeid: int, node: str, job: int = 42) -> dict:
    return {"host": "same-hostname", "addr": f"10.0.0.{nodeid + 1}", "pid": 100 + procid,
            "gpus": 0, "slurm": {"job_id": job, "procid": procid, "localid": localid,
                                 "nodeid": nodeid, "ntasks": 4, "node": node}}


def test_rank_map_follows_slurm_procid_not_engine_ids():
    # Engines register in any order: engine 0 is task 3, engine 3 is task 0.
    descs = {0: _task(3, 1, 1, "n2"), 1: _task(1, 1, 0, "n1"), 2: _task(2, 0, 1, "n2"),
             3: _task(0, 0, 0, "n1")}
    assert slurm_step(descs)
    rm = build_rank_map(descs, local=False)
    assert rm.engine_ids == [3, 1, 2, 0]
    assert [(r.rank, r.local_rank, r.node_rank, r.host) for r in rm] == [
        (0, 0, 0, "n1"), (1, 1, 0, "n1"), (2, 0, 1, "n2"), (3, 1, 1, "n2")]
    assert rm.hosts == ("n1", "n2") and {r.local_world_size for r in rm} == {2}
    assert rm.master_addr == "10.0.0.1"


def test_rank_map_ignores_slurm_when_engines_are_not_one_step():
    # Local engines started inside an salloc shell all inherit PROCID 0.
    descs = {0: _task(0, 0, 0, "n1"), 1: _task(0, 0, 0, "n1")}
    assert not slurm_step(descs)
    assert [r.engine_id for r in build_rank_map(descs, local=True)] == [0, 1]
    mixed = {0: _task(0, 0, 0, "n1"), 1: _task(1, 1, 0, "n1", job=43)}
    assert not slurm_step(mixed)


# ---- doctor, no Slurm needed -------------------------------------------------------------------
SINFO = ["debug* up 1 idle", "gpu up 2 mix", "gpu up 1 drain", "old down 1 down*"]


@pytest.mark.parametrize("partition, ok, text", [
    (None, True, "'debug' (Slurm's default) is up: 1 node(s) (1 idle)"),
    ("gpu", True, "'gpu' is up: 3 node(s) (2 mix, 1 drain)"),
    ("nope", False, "'nope' does not exist; Slurm has: debug, gpu, old"),
    ("old", False, "'old' is down"),
])
def test_doctor_partition_check(partition, ok, text):
    table = {"partition": partition} if partition else {}
    prof = profile_from_dict(slurm_profile(**table), name="p")
    check, name = doctor_slurm.check_partition(prof, SINFO)
    assert check.ok is ok and check.detail == text
    assert name == ((partition or "debug") if ok else "")
    assert ok or check.fix


# ---- on the one-node rig ------------------------------------------------------------------------
@pytest.fixture
def on_rig(slurm_rig: SlurmRig, tmp_path, monkeypatch):
    """The rig's Slurm for this process and its subprocesses; cwd a fresh directory."""
    monkeypatch.chdir(tmp_path)
    with slurm_rig.activated():
        yield slurm_rig


def rig_profile(rig: SlurmRig, path: Path, **overrides: object) -> Path:
    """profiles/slurm.toml, pointed at the rig: loopback controller, 2 engines, 1 CPU each."""
    table = {"partition": rig.partition, "time": "5", "cpus_per_engine": 1, "account": "course"}
    table.update(overrides)
    body = "\n".join(f"{k} = {v!r}".replace("'", '"') for k, v in table.items())
    path.write_text(f'launcher = "slurm"\ncontroller_ip = "127.0.0.1"\nengines = 2\n'
                    f"[slurm]\n{body}\n")
    return path


def engines_job(cc: lifecycle.CourseCluster) -> str:
    (es,) = cc.cluster.engines.values()
    return es.job_id


def test_start_submits_the_engines_as_a_slurm_job_restart_and_stop_cancel_it(on_rig, tmp_path):
    rig = on_rig
    cid = f"pytest-slurm-{os.getpid()}"
    t0 = time.perf_counter()
    cc = cu.start(profile=rig_profile(rig, tmp_path / "rig.toml"), cluster_id=cid, timeout=60)
    try:
        up = time.perf_counter() - t0
        job = engines_job(cc)
        fields = slurm.job_status(job).fields
        assert fields["JobState"] == "RUNNING" and fields["Partition"] == rig.partition
        assert (fields["TimeLimit"], fields["Account"]) == ("00:05:00", "course")
        assert (fields["NumTasks"], fields["CPUs/Task"]) == ("2", "1")
        script = slurm.batch_file(lifecycle.profile_dir(), cid)
        assert fields["Command"] == str(script) and script.exists()
        assert not list(tmp_path.glob("*.sbatch"))  # not in the current directory

        # The rank map agrees with what Slurm told each engine.
        reports = cc.run(engine.describe)
        nodes = rig.run(["scontrol", "show", "hostnames",
                         reports[0]["slurm"]["nodelist"]]).stdout.split()
        assert list(cc.ranks.hosts) == nodes == [rig.node]
        for info, report in zip(cc.ranks, reports, strict=True):
            facts = report["slurm"]
            assert str(facts["job_id"]) == job
            assert (facts["procid"], facts["localid"], facts["nodeid"], facts["node"]) == (
                info.rank, info.local_rank, info.node_rank, info.host)
        assert cc.run(engine.getenv, "RANK") == ["0", "1"]
        assert cc.run(engine.getenv, "OMP_NUM_THREADS") == ["1", "1"]
        print(f"\n{cc.world_size} engines up as Slurm job {job} in {up:.1f} s")
        print(rig.run("squeue").stdout + cc.ranks.table())

        # restart: a new job replaces the old one; the controller drops the old engines.
        t0 = time.perf_counter()
        cu.restart()
        print(f"restart: job {job} -> {engines_job(cc)} in {time.perf_counter() - t0:.1f} s")
        assert rig.wait_job(int(job), timeout=15) == "CANCELLED"
        job = engines_job(cc)
        assert sorted(cc.client.ids) == sorted(cc.ranks.engine_ids)
        reports = cc.run(engine.describe)
        assert [(r["slurm"]["job_id"], r["slurm"]["procid"]) for r in reports] == [
            (int(job), 0), (int(job), 1)]
        pids = [info.pid for info in cc.ranks]
    finally:
        cu.stop()
    assert rig.wait_job(int(job), timeout=15) == "CANCELLED"
    assert rig.run(["squeue", "-h", "-t", "PD,R", "-j", job], check=False).stdout.strip() == ""
    wait_until(lambda: not any(procs.pid_alive(p) for p in pids), 10, "engines to exit")


def test_a_request_the_node_cannot_satisfy_fails_at_once_with_slurms_reason(on_rig, tmp_path):
    rig = on_rig
    prof = rig_profile(rig, tmp_path / "big.toml", cpus_per_engine=rig.cpus + 1)
    t0 = time.perf_counter()
    with pytest.raises(slurm.SlurmJobError) as err:
        cu.start(profile=prof, cluster_id=f"pytest-slurm-big-{os.getpid()}", timeout=60)
    took = time.perf_counter() - t0
    print(f"\nfailed after {took:.1f} s:\n{err.value}")
    text = str(err.value)
    job = text.split("Slurm job ", 1)[1].split()[0]
    assert "PENDING, reason PartitionConfig" in text and "\nFix: " in text
    assert f"x {rig.cpus + 1} CPUs" in text
    assert took < 20  # long before the 60 s timeout
    assert rig.wait_job(int(job), timeout=15) == "CANCELLED"


def test_a_job_waiting_for_busy_nodes_fails_at_the_timeout(on_rig, tmp_path):
    rig = on_rig
    blocker = rig.sbatch("sleep 60\n", f"--ntasks={rig.cpus}")
    try:
        wait_until(lambda: rig.job_state(blocker)[0] == "RUNNING", 15, "the blocker to run")
        t0 = time.perf_counter()
        with pytest.raises(slurm.SlurmJobError) as err:
            cu.start(profile=rig_profile(rig, tmp_path / "rig.toml"),
                     cluster_id=f"pytest-slurm-busy-{os.getpid()}", timeout=3)
        took = time.perf_counter() - t0
    finally:
        rig.cancel(blocker)
    print(f"\nfailed after {took:.1f} s:\n{err.value}")
    assert "PENDING, reason Resources" in err.value.cause
    # the seconds it waited, from the submission: the 3 s limit plus a poll (4 s under load)
    waited = re.search(r"after (\d+) s", err.value.cause)
    assert waited and 3 <= int(waited.group(1)) <= took + 1, err.value.cause
    assert 3 <= took < 15


def test_a_job_slurm_refuses_is_a_course_error(on_rig, tmp_path):
    prof = rig_profile(on_rig, tmp_path / "nope.toml", partition="nope")
    cid = f"pytest-slurm-nope-{os.getpid()}"
    with pytest.raises(slurm.SlurmError, match="Invalid partition name") as err:
        cu.start(profile=prof, cluster_id=cid, timeout=30)
    assert "sinfo -s" in err.value.fix
    assert not lifecycle.cluster_file(cid).exists()


def test_doctor_slurm_checks_pass_on_the_rig(on_rig, tmp_path):
    prof = load_profile(rig_profile(on_rig, tmp_path / "rig.toml"))
    checks = list(doctor_slurm.slurm_checks(prof, engines=2, timeout=30))
    print("\n" + "\n".join(c.line() for c in checks))
    assert [c.name for c in checks] == ["slurm commands", "scheduler", "partition",
                                        "engine request", "tiny job"]
    assert all(c.ok for c in checks)
    assert "using 2 processors on nodes" in checks[3].detail


def test_doctor_names_the_fix_when_slurm_is_not_ready(on_rig, tmp_path, monkeypatch, capsys):
    rig = on_rig
    too_big = rig_profile(rig, tmp_path / "big.toml", cpus_per_engine=rig.cpus + 1)
    assert cli.main(["doctor", "--profile", str(too_big), "--no-tf"]) == 1
    out = capsys.readouterr().out
    print(out)
    assert "[FAIL] engine request: Slurm refuses" in out
    assert "Requested node configuration is not available -> fix: ask for fewer" in out
    assert "[FAIL] cluster: skipped" in out

    prof = load_profile(rig_profile(rig, tmp_path / "rig.toml"))
    dead = tmp_path / "dead.conf"
    dead.write_text(rig.conf.read_text().replace(f"SlurmctldPort={rig.ctld_port}",
                                                 f"SlurmctldPort={ports.free_port()}"))
    monkeypatch.setenv("SLURM_CONF", str(dead))
    checks = list(doctor_slurm.slurm_checks(prof, engines=2, timeout=30))
    assert [(c.name, c.ok) for c in checks] == [("slurm commands", True), ("scheduler", False)]
    assert "Unable to contact slurm controller" in checks[1].detail
    assert "scontrol ping" in checks[1].fix


def test_doctor_says_when_slurm_is_not_installed(monkeypatch):
    monkeypatch.setattr(doctor_slurm, "_missing", lambda programs=(): ["sbatch"])
    check = doctor_slurm.check_commands()
    assert not check.ok and "sbatch" in check.detail and "slurm-client" in check.fix


def test_cluster_files_name_the_launcher_so_course_stop_can_cancel_the_job(tmp_path):
    import ipyparallel as ipp

    cl = ipp.Cluster(engines=slurm.SlurmEngines, cluster_id="x", profile_dir=str(tmp_path))
    name = cl.to_dict()["engines"]["class"]
    assert name == "course_utils.cluster.launchers.slurm.SlurmEngines"
    assert ipp.Cluster(engines=name).engine_launcher_class is slurm.SlurmEngines


# ---- unit 6's batch script, submitted for real ------------------------------------------------
def rig_ddp_profile(partition: str = "debug") -> ClusterProfile:
    """profiles/slurm.toml as shipped, changed only where the one-node rig differs: its
    partition, one node, 2 processes of 1 CPU and no GPU, loopback as the interface."""
    data = tomllib.loads((Path(__file__).parents[1] / "profiles" / "slurm.toml").read_text())
    data.update(controller_ip="127.0.0.1", socket_ifname="lo", engines=2)
    data["slurm"].update(partition=partition, nodes=1, cpus_per_engine=1,
                         gpus_per_engine=0, time="5")
    return profile_from_dict(data, name="slurm-rig")


def finished_job(rig: SlurmRig, job: int, out: Path, timeout: float) -> dict[str, str]:
    """Wait (bounded) for ``job`` to end; its ``scontrol`` fields. Fails, printing the job's
    state, reason and output, when it is still queued/running at ``timeout`` or did not
    complete."""
    deadline = time.monotonic() + timeout
    while True:
        fields = slurm.job_status(str(job)).fields
        state = fields.get("JobState", "UNKNOWN")
        if state in rigs_slurm.TERMINAL_STATES or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if state != "COMPLETED" or fields.get("ExitCode") != "0:0":
        text = out.read_text(errors="replace")[-3000:] if out.exists() else "(no such file)"
        if state not in rigs_slurm.TERMINAL_STATES:
            rig.run(["scancel", str(job)], check=False)
        pytest.fail(f"Slurm job {job} is {state} (reason {fields.get('Reason')}, exit code "
                    f"{fields.get('ExitCode')}) after {timeout:.0f} s at most; its output "
                    f"{out}:\n{text}\n{rig.logs(10)}")
    return fields


def test_a_batch_job_that_fails_or_overstays_is_reported_with_its_output(on_rig, tmp_path):
    rig = on_rig
    script = write_sbatch_script(tmp_path / "bad.sbatch", "#!/bin/bash\n#SBATCH --output=bad-%j.out"
                                 "\necho 'ddp_script: boom'\nexit 3\n")
    job = int(rig.run(["sbatch", "--parsable", str(script)], cwd=tmp_path).stdout)
    with pytest.raises(pytest.fail.Exception) as err:
        finished_job(rig, job, tmp_path / f"bad-{job}.out", timeout=30)
    print(f"\n{str(err.value).split(chr(10) + '--- ')[0]}")
    assert f"Slurm job {job} is FAILED (reason NonZeroExitCode, exit code 3:0)" in str(err.value)
    assert "ddp_script: boom" in str(err.value)
    slow = int(rig.run(["sbatch", "--parsable", "--wrap", "sleep 60"], cwd=tmp_path).stdout)
    with pytest.raises(pytest.fail.Exception, match=f"job {slow} is (PENDING|RUNNING)"):
        finished_job(rig, slow, tmp_path / "none.out", timeout=1)
    assert rig.wait_job(slow, timeout=15) == "CANCELLED"  # not left running


def test_unit6_batch_script_runs_under_sbatch_and_every_rank_ends_equal(on_rig, tmp_path):
    """The script unit 6 prints, made the same way from the course's Slurm profile, submitted
    with ``sbatch``: srun -> the venv's torchrun -> 2 gloo ranks of unit 3's training."""
    rig = on_rig
    steps = 3
    text = make_sbatch_script(rig_ddp_profile(rig.partition),
                              script_args=["--steps", str(steps), "--backend", "gloo"])
    check = check_sbatch_script(text, expect={"nodes": "1", "--nnodes": "1",
                                              "--nproc-per-node": "2", "cpus-per-task": "2",
                                              "partition": rig.partition, "account": "course"})
    assert check.ok, check.errors
    assert "export GLOO_SOCKET_IFNAME=lo" in text
    script = write_sbatch_script(tmp_path / "ddp.sbatch", text)
    t0 = time.perf_counter()
    # torchrun's usual port is taken on the node: the job's rendezvous must not need it.
    with socket.socket() as squatter:
        with contextlib.suppress(OSError):  # if someone else holds it, just as good
            squatter.bind(("", RDZV_PORT))
            squatter.listen()
        job = int(rig.run(["sbatch", "--parsable", str(script)], cwd=tmp_path)
                  .stdout.split(";")[0])
        out = tmp_path / f"course-ddp-{job}.out"  # where the script's --output says
        fields = finished_job(rig, job, out, timeout=300)
    took = time.perf_counter() - t0
    assert Path(fields["StdOut"]) == out and out.is_file()
    assert (fields["JobName"], fields["Partition"], fields["Account"]) == (
        "course-ddp", rig.partition, "course")
    assert (fields["NumNodes"], fields["NumCPUs"], fields["NodeList"]) == ("1", "2", rig.node)
    log = out.read_text()
    print(f"\njob {job} in {took:.1f} s (sbatch to end): " + " ".join(
        f"{k}={fields.get(k)}" for k in ("JobState", "Reason", "ExitCode", "RunTime", "NodeList",
                                         "NumNodes", "NumCPUs", "StdOut")) + f"\n{log}")

    # What Slurm gave the job (the script's first line) sets the ranks and the world size.
    head = re.search(r"^job (\d+): (\d+) node\(s\) \((\S+)\) x (\d+) process\(es\), "
                     r"rendezvous on (\S+):(\d+)$", log, re.M)
    assert head, log
    assert (int(head[1]), head[3], head[5]) == (job, rig.node, rig.node)
    nodes, nproc, port = int(head[2]), int(head[4]), int(head[6])
    assert (nodes, nproc) == (1, 2) and port != RDZV_PORT
    ranks = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert len(ranks) == nodes * nproc, log
    node_host = re.search(r"\bNodeHostName=(\S+)", rig.run(
        ["scontrol", "-o", "show", "node", rig.node]).stdout)[1]
    assert sorted(r["rank"] for r in ranks) == list(range(nodes * nproc))
    for r in ranks:
        assert r["world_size"] == nodes * nproc and r["node_rank"] in range(nodes)
        assert r["local_rank"] == r["rank"] % nproc and r["host"] == node_host
        assert (r["steps"], r["backend"], r["replica_spread"]) == (steps, "gloo", 0.0)
        assert math.isfinite(r["loss"])
    assert len({r["checksum"] for r in ranks}) == 1, ranks  # equal weights on every rank
    assert len({r["loss"] for r in ranks}) == 1  # the reduced loss


# ---- two nodes: one slurmd in each network namespace of the two-host rig ----------------------
@pytest.fixture
def two_node_slurm(tmp_path, monkeypatch):
    """A Slurm cluster whose two nodes are the two simulated hosts of tests/rigs/twohosts.py."""
    from tests.rigs.twohosts import rig_or_skip

    rigs_slurm.require_rig()
    monkeypatch.chdir(tmp_path)
    with rig_or_skip(sshd=False) as hosts:
        rig = SlurmRig.start(cpus=1, hosts=hosts)
        try:
            with rig.activated():
                yield rig, hosts
        finally:
            rig.teardown()


def test_a_slurm_job_spans_the_two_hosts(two_node_slurm, tmp_path):
    from tests.rigs.twohosts import IFNAME

    rig, hosts = two_node_slurm
    print("\n" + rig.run("sinfo").stdout)
    assert rig.run(["sinfo", "-h", "-N", "-o", "%N %t"]).stdout.split() == [
        "rig-a", "idle", "rig-b", "idle"]
    prof = tmp_path / "two.toml"
    prof.write_text(f'launcher = "slurm"\ncontroller_ip = "{hosts.controller_ip}"\nengines = 2\n'
                    f'socket_ifname = "{IFNAME}"\n[slurm]\npartition = "{rig.partition}"\n'
                    'time = "5"\nnodes = 2\n')
    cc = cu.start(profile=prof, cluster_id=f"pytest-slurm-two-{os.getpid()}", timeout=60)
    try:
        job = engines_job(cc)
        print(rig.run("squeue").stdout + cc.ranks.table())
        nodelist = slurm.job_status(job).fields["NodeList"]
        nodes = rig.run(["scontrol", "show", "hostnames", nodelist]).stdout.split()
        assert list(cc.ranks.hosts) == nodes == ["rig-a", "rig-b"]
        # Each engine runs in its host's namespace: its route to the controller leaves from the
        # host's own address, and rank 1's node rank and address are host b's.
        addresses = [hosts.host(name).address for name in ("a", "b")]
        assert [info.addr for info in cc.ranks] == addresses
        assert [(info.node_rank, info.local_rank) for info in cc.ranks] == [(0, 0), (1, 0)]
        assert cc.ranks.master_addr == addresses[0]
        assert cc.run(engine.getenv, "GLOO_SOCKET_IFNAME") == [IFNAME, IFNAME]
    finally:
        cu.stop()
    assert rig.wait_job(int(job), timeout=15) == "CANCELLED"


def test_unit6_batch_script_runs_on_two_nodes_and_every_rank_ends_equal(two_node_slurm, tmp_path):
    """Unit 6's batch script, from the course's Slurm profile changed only where the rig
    differs, on two nodes: the rendezvous on the first node, one torchrun per node, gloo over
    the hosts' link."""
    from tests.rigs.twohosts import IFNAME

    rig, hosts = two_node_slurm
    data = tomllib.loads((Path(__file__).parents[1] / "profiles" / "slurm.toml").read_text())
    data.update(controller_ip=hosts.controller_ip, socket_ifname=IFNAME, engines=2)
    data["slurm"].update(partition=rig.partition, nodes=2, cpus_per_engine=1,
                         gpus_per_engine=0, time="5")
    text = make_sbatch_script(profile_from_dict(data, name="slurm-two"),
                              script_args=["--steps", "3", "--backend", "gloo"])
    check = check_sbatch_script(text, expect={"nodes": "2", "--nnodes": "2",
                                              "--nproc-per-node": "1"})
    assert check.ok, check.errors
    script = write_sbatch_script(tmp_path / "ddp2.sbatch", text)
    t0 = time.perf_counter()
    job = int(rig.run(["sbatch", "--parsable", str(script)], cwd=tmp_path).stdout.split(";")[0])
    out = tmp_path / f"course-ddp-{job}.out"
    fields = finished_job(rig, job, out, timeout=300)
    log = out.read_text()
    print(f"\njob {job} in {time.perf_counter() - t0:.1f} s (sbatch to end): " + " ".join(
        f"{k}={fields.get(k)}" for k in ("JobState", "ExitCode", "NodeList", "NumNodes"))
        + f"\n{log}")
    head = re.search(r"^job \d+: 2 node\(s\) \((\S+)\) x 1 process\(es\), "
                     r"rendezvous on (\S+):(\d+)$", log, re.M)
    assert head and head[2] == "rig-a", log
    ranks = sorted((json.loads(line) for line in log.splitlines() if line.startswith("{")),
                   key=lambda r: r["rank"])
    assert [r["rank"] for r in ranks] == [0, 1], log
    # One rank on each node, each on its own host; equal weights after the all_reduces.
    assert sorted(r["node_rank"] for r in ranks) == [0, 1]
    assert sorted(r["host"] for r in ranks) == ["rig-a", "rig-b"]
    assert ranks[0]["master"].split(":")[0] in ("rig-a", hosts.host("a").address)
    for r in ranks:
        assert (r["world_size"], r["local_rank"], r["steps"]) == (2, 0, 3)
        assert (r["backend"], r["replica_spread"]) == ("gloo", 0.0)
    assert len({r["checksum"] for r in ranks}) == 1, ranks


def test_unit6_learners_batch_lines_run_on_two_nodes(two_node_slurm, tmp_path):
    """Unit 6, exercise 5 as the notebook solves it: its SBATCH_LINES around the course's
    script, running its train_ddp.py, submitted to the two-node Slurm cluster; run again, the
    job resumes from the checkpoint rank 0 saved."""
    import nbformat

    from course_utils.checks import graduation
    from tests.rigs.twohosts import IFNAME

    rig, hosts = two_node_slurm
    nb = nbformat.read(Path(__file__).parents[1] / "notebooks" / "06_two_hosts.ipynb", 4)
    sol = {c.metadata["nbgrader"]["grade_id"]: re.sub(r"### (BEGIN|END) SOLUTION\n", "", c.source)
           for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution")}
    (tmp_path / "train_ddp.py").write_text(sol["ex3-solution"].split("\n", 1)[1])
    ns: dict = {}
    exec(sol["ex5-solution"], ns)
    assert graduation.batch_problems(ns["SBATCH_LINES"]) == []
    data = tomllib.loads((Path(__file__).parents[1] / "profiles" / "slurm.toml").read_text())
    data.update(controller_ip=hosts.controller_ip, socket_ifname=IFNAME, engines=2)
    data["slurm"].update(partition=rig.partition, nodes=2, cpus_per_engine=1,
                         gpus_per_engine=0, time="5")
    prof = profile_from_dict(data, name="slurm-two")
    ckpt = tmp_path / "ckpt.pt"
    said = graduation.sbatch_test_only(graduation.batch_script(ns["SBATCH_LINES"], prof))
    assert said is not None and said[0], said
    logs = []
    for steps in (3, 6):
        text = graduation.batch_script(ns["SBATCH_LINES"], prof,
                                       ["--steps", str(steps), "--checkpoint", str(ckpt)])
        script = write_sbatch_script(tmp_path / f"learner{steps}.sbatch", text)
        job = int(rig.run(["sbatch", "--parsable", str(script)], cwd=tmp_path)
                  .stdout.split(";")[0])
        out = tmp_path / f"course-ddp-{job}.out"
        fields = finished_job(rig, job, out, timeout=300)
        logs.append(out.read_text())
        print(f"\njob {job}: {fields.get('JobState')} on {fields.get('NodeList')}\n{logs[-1]}")
    runs = [graduation.ScriptRun(argvs=[["sbatch"]], returncodes=[0], stdout=[log],
                                 stderr=[""]) for log in logs]
    assert graduation.run_problems(runs[0], world=2, steps=3) == []
    assert graduation.run_problems(runs[1], world=2, steps=6, resumed_from=3) == []
    assert [(s["rank"], s["local_rank"]) for s in runs[0].events("start")] == [(0, 0), (1, 0)]
