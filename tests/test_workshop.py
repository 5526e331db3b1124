"""The workshop (issue 23): the workshop file, the files ``course workshop`` writes from it, the
queue message, and ``course workshop check`` on a real Slurm cluster over the two simulated
hosts with fake GPUs and real OS users (tests/rigs/workshop.py)."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import pytest
from traitlets.config import Config

from course_utils.cli import main as course
from course_utils.cluster.launchers import slurm_queue
from course_utils.cluster.launchers.slurm import JobStatus, job_status, parse_job
from course_utils.cluster.ports import free_port
from course_utils.cluster.profiles import load_profile
from course_utils.workshop import check, hub, render
from course_utils.workshop.plan import WorkshopError, load_workshop, workshop_from_dict
from tests.rigs import slurm as rigs_slurm

pytestmark = pytest.mark.timeout(1200)  # the rig tests start a hub and 4 labs on 2 cores
EXAMPLE = Path(__file__).parents[1] / "workshops" / "example.toml"


def _hosts(*gpus: int) -> list[dict]:
    return [{"name": f"gpu{i + 1}", "address": f"10.0.0.{i + 1}", "gpus": g}
            for i, g in enumerate(gpus)]


# ---- the workshop file ----------------------------------------------------------------------
def test_the_example_file_reads_and_says_how_many_learners_fit():
    ws = load_workshop(EXAMPLE)
    assert [h.name for h in ws.hosts] == ["gpu1", "gpu2"] and ws.hub.name == "gpu1"
    assert ws.learners == ("alice", "bob", "carol", "dave", "erin")
    assert (ws.capacity, ws.queued, ws.ranks_per_learner) == (8, 0, 2)
    crowded = workshop_from_dict({"learners": 20, "gpus_per_learner": 2, "hosts": _hosts(8, 6)})
    assert crowded.learners[0] == "learner01" and len(crowded.learners) == 20
    assert (crowded.capacity, crowded.queued, crowded.ranks_per_learner) == (3, 17, 4)
    shared = workshop_from_dict({"learners": 20, "shards_per_gpu": 2, "hosts": _hosts(8, 8)})
    assert (shared.capacity, shared.queued) == (16, 4)


@pytest.mark.parametrize("data, cause, fix", [
    ({"learners": 3}, "names no [[hosts]]", "[[hosts]]"),
    ({"learners": 3, "hosts": [{"name": "a", "address": "gpu-one", "gpus": 1}]},
     "is not an IP address", "address on the workshop's interface"),
    ({"learners": 3, "hosts": [{"name": "a", "address": "10.0.0.1", "gpus": 0}]},
     "`gpus` must be 1 or more", "nvidia-smi -L"),
    ({"learners": 3, "gpus_per_learner": 3, "hosts": _hosts(2, 8)},
     "fewer GPUs than one learner needs", "shards_per_gpu"),
    ({"learners": ["Alice Smith"], "hosts": _hosts(1)}, "not valid user names", "OS user"),
    ({"learners": ["ann", "ann"], "hosts": _hosts(1)}, "named twice", "once"),
    ({"hosts": _hosts(1)}, "`learners` is None", "a count"),
    ({"learners": 2, "hosts": _hosts(1), "hub": {"host": "gpu9"}}, "not one of the [[hosts]]",
     "gpu1"),
    ({"learners": 2, "hosts": _hosts(1), "time": "4 hours"}, "not a Slurm time", "HH:MM:SS"),
    ({"learners": 2, "hosts": [{"name": "a", "address": "10.0.0.1", "gpus": 1, "gpu": 2}]},
     "unknown key(s) ['gpu']", "name, address, gpus"),
    ({"learners": 2, "hosts": _hosts(1), "gpu_per_learner": 2},
     "the workshop file: unknown key(s) ['gpu_per_learner']", "gpus_per_learner"),
    ({"learners": 2, "hosts": _hosts(1), "hub": {"ssl_certificate": "/x.pem"}},
     "[hub]: unknown key(s) ['ssl_certificate']",
     "one of: host, lab_start_timeout, max_memory, max_processes"),
    ({"learners": 2, "hosts": _hosts(1), "hub": "gpu1"}, "[hub] is not a table", "TOML table"),
    ({"learners": 2, "hosts": _hosts(1), "hub": {"ssl_cert": "/etc/ssl/hub.pem"}},
     "needs both ssl_cert and ssl_key", "ssl_key = "),
    ({"learners": 2, "hosts": _hosts(1), "hub": {"ssl_cert": "hub.pem", "ssl_key": "hub.key"}},
     "as absolute paths", "/etc/ssl/hub.pem"),
])
def test_a_wrong_workshop_file_names_the_key_and_the_fix(data, cause, fix):
    with pytest.raises(WorkshopError) as caught:
        workshop_from_dict(data)
    assert cause in caught.value.cause and fix in caught.value.fix, caught.value


def test_a_missing_or_broken_file_says_so(tmp_path):
    with pytest.raises(WorkshopError, match="cannot read the workshop file"):
        load_workshop(tmp_path / "nope.toml")
    (tmp_path / "bad.toml").write_text("learners = [\n")
    with pytest.raises(WorkshopError, match="not valid TOML"):
        load_workshop(tmp_path / "bad.toml")


def test_the_check_without_any_slurm_conf_says_where_to_set_it(monkeypatch, capsys):
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.setattr(check, "DEFAULT_SLURM_CONF", "/nowhere/slurm.conf")
    ws = workshop_from_dict({"learners": 2, "hosts": _hosts(1),
                             "hub": {"host": "gpu1", "port": free_port()}})
    lines = {line.name: line for line in check.run_checks(ws, token="", emit=print)}
    said = capsys.readouterr().out
    assert "Traceback" not in said and lines["slurm"].status == "FAIL", said
    assert ("set slurm_conf in the workshop file" in lines["slurm"].fix
            or "slurm-client" in lines["slurm"].fix), lines["slurm"]
    failed = sorted(name for name, line in lines.items() if line.status == "FAIL")
    # no firewall here, no hub; the sandbox's line follows this machine's bubblewrap
    expected = ["hub", "ports closed to others", "slurm"]
    assert failed == sorted(expected + ["grading sandbox"] * (shutil.which("bwrap") is None)), lines
    own = workshop_from_dict({"learners": 2, "hosts": _hosts(1), "slurm_conf": "/nowhere.conf"})
    line = check.run_checks(own, token="", emit=print)[0]
    assert "the workshop file's slurm_conf names /nowhere.conf" in line.detail, line
    assert "SLURM_CONF" not in os.environ  # restored after the checks


def test_a_check_that_breaks_inside_is_one_line_not_a_traceback(monkeypatch):
    def broken(ws):
        raise KeyError("NodeName")

    monkeypatch.setattr(check, "check_hub", broken)
    monkeypatch.setattr(check, "CHECKS", [broken])
    monkeypatch.setattr(check, "NAMES", {broken: "hub"})
    line = check.run_checks(workshop_from_dict({"learners": 1, "hosts": _hosts(1)}),
                            token="", emit=print)[0]
    assert line.status == "FAIL" and "KeyError" in line.detail and "course doctor" in line.fix


# ---- what `course workshop` writes ----------------------------------------------------------
def test_course_workshop_writes_slurm_gres_profile_and_a_hub_config_that_loads(tmp_path, capsys):
    args = ["workshop", str(EXAMPLE), "--out", str(tmp_path / "out"),
            "--course", str(tmp_path / "course")]
    assert course(args) == 1  # no student release yet: the hub would have nothing to copy
    said = capsys.readouterr()
    assert "release is missing" in said.err or "release is missing" in said.out
    assert f"course release {tmp_path / 'course'}" in said.err + said.out
    (tmp_path / "course" / "release").mkdir(parents=True)
    assert course(args) == 0
    said = capsys.readouterr().out
    assert "learners at once: 5 of 5 (GPUs for 8)" in said and "course workshop check" in said
    out = tmp_path / "out"
    conf = (out / "slurm-workshop.conf").read_text()
    assert "GresTypes=gpu\n" in conf and "SelectType=select/cons_tres" in conf
    assert "NodeName=gpu2 NodeAddr=10.0.0.2 CPUs=32 Gres=gpu:8 State=UNKNOWN" in conf
    assert "PartitionName=workshop Nodes=gpu1,gpu2 MaxTime=04:00:00 State=UP" in conf
    assert "TaskPlugin=task/cgroup,task/affinity" in conf  # fencing, with cgroup.conf beside
    assert "MaxTRESPerUser=gres/gpu=2" in conf and "Replace, do not add" in conf
    assert "ConstrainDevices=yes" in (out / "cgroup.conf").read_text()
    assert "NodeName=gpu1 Name=gpu File=/dev/nvidia[0-7]" in (out / "gres.conf").read_text()
    prof = load_profile(out / "learner-profile.toml")
    assert (prof.launcher, prof.engines, prof.controller_ip, prof.socket_ifname) == (
        "slurm", 2, "10.0.0.1", "eth1")
    assert (prof.slurm.partition, prof.slurm.nodes, prof.slurm.gpus_per_engine) == (
        "workshop", 2, 1)
    assert "--ntasks-per-node=1" in prof.slurm.options
    token = out / render.CHECK_TOKEN_FILE
    assert stat.S_IMODE(token.stat().st_mode) == 0o600 and len(token.read_text().strip()) == 64
    c = Config()
    exec(compile((out / "jupyterhub_config.py").read_text(), "jupyterhub_config.py", "exec"),
         {"get_config": lambda: c})
    assert c.JupyterHub.bind_url == "http://10.0.0.1:8000"
    assert c.JupyterHub.hub_bind_url.startswith("http://127.0.0.1:")  # the rest on loopback
    assert c.ConfigurableHTTPProxy.api_url.startswith("http://127.0.0.1:")
    assert c.Authenticator.allowed_users == ["alice", "bob", "carol", "dave", "erin"]
    assert c.Spawner.environment["COURSE_PROFILE"] == str((out / "learner-profile.toml").resolve())
    # each learner's own block of ports (JupyterHub calls the value with their spawner) ...
    ports_of = c.Spawner.environment["COURSE_PORTS"]
    assert [ports_of(type("S", (), {"user": type("U", (), {"name": who})})())
            for who in ("alice", "erin")] == ["20000-20099", "20400-20499"]
    # ... closed to the others by the firewall each host loads
    wall = (out / "firewall.nft").read_text()
    assert 'tcp dport 20100-20199 meta skuid != "bob" reject with tcp reset' in wall
    assert wall.count("reject with tcp reset") == 5 and "delete table inet course_workshop" in wall
    if shutil.which("nft"):  # the file parses (names checked: users of this machine)
        for i, who in enumerate(("alice", "bob", "carol", "dave", "erin")):
            wall = wall.replace(f'"{who}"', f'"{("root", "daemon", "bin", "sys", "nobody")[i]}"')
        (tmp_path / "wall.nft").write_text(wall)
        parsed = subprocess.run(["nft", "-c", "-f", str(tmp_path / "wall.nft")],
                                capture_output=True, text=True, timeout=30, check=False)
        assert parsed.returncode == 0, parsed.stderr
    assert c.JupyterHub.services[0]["api_token"] == token.read_text().strip()
    assert check.find_token(out) == token.read_text().strip()
    assert callable(c.Spawner.pre_spawn_hook)
    # The labs run in the learners' environment: the course's code, none of the source.
    env = out / "learner-env"
    assert c.Spawner.cmd[1:] == ["--nproc=4096", "--", str(env / "bin" / "python"), "-m",
                                 "jupyterhub.singleuser"] and c.Spawner.cmd[0].endswith("prlimit")
    assert c.Spawner.environment["PATH"].startswith(f"{env / 'bin'}:")
    # ... with JupyterLab in it (without these the hub's /user/<name>/lab is a 404), and the
    # learner's page config (nbgrader's instructor tools hidden, as in `course lab`)
    assert (env / "etc/jupyter/jupyter_server_config.d/jupyterlab.json").is_file()
    assert (env / "share/jupyter/lab/static").is_dir()
    page = json.loads((env / "etc/jupyter/labconfig/page_config.json").read_text())
    assert page["disabledExtensions"]["@jupyter/nbgrader:create-assignment"] is True
    assert "--LabApp.news_url=None" in c.Spawner.args
    probe = subprocess.run(
        [str(env / "bin" / "python"), "-c",
         "import json, course_utils, jupyterhub.singleuser\n"
         "from course_utils.assignments import lessons\n"
         "print(json.dumps([course_utils.__file__, str(lessons.NOTEBOOK_DIR),"
         " lessons.NOTEBOOK_DIR.exists()]))"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, check=True)
    package, notebooks, there = json.loads(probe.stdout.strip().splitlines()[-1])
    assert package.startswith(str(env)) and notebooks.startswith(str(env)) and not there
    # A learner's terminal on the hub finds `course`: the lab's server, as the hub starts it
    # (its environment, no JUPYTER_CONFIG_PATH), runs terminals as no login shell, which would
    # reset PATH from /etc/profile, so they keep Spawner.environment's PATH (env's bin first).
    terminals = subprocess.run(
        [str(env / "bin" / "python"), "-c",
         "import json\nfrom jupyter_server.serverapp import ServerApp\n"
         "app = ServerApp()\napp.load_config_file()\nprint(json.dumps(app.terminado_settings))"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, check=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("JUPYTER")})
    shell = json.loads(terminals.stdout.strip().splitlines()[-1])["shell_command"]
    assert len(shell) == 1 and "-l" not in shell, shell
    found = subprocess.run([*shell, "-c", "command -v course"], capture_output=True, text=True,
                           timeout=30, env={"PATH": c.Spawner.environment["PATH"],
                                            "HOME": str(tmp_path)}, check=False)
    assert found.stdout.strip() == str(env / "bin" / "course"), found
    assert not [p for p in env.rglob("*.ipynb")]  # no notebook at all, let alone a solution
    work = tmp_path / "work"
    (work / "00_cluster_tour.ipynb").parent.mkdir()
    shutil.copy(release_copy(tmp_path), work / "00_cluster_tour.ipynb")
    said = subprocess.run([str(env / "bin" / "course"), "solution", "0", "ex1", "--workdir",
                           str(work)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert said.returncode == 1 and "carries no solutions" in said.stderr, said.stderr
    assert "solutions come from your instructor" in said.stderr


def release_copy(tmp_path: Path) -> Path:
    """Unit 0 as a learner holds it, its visible tests run (so `course solution` may answer)."""
    import nbformat

    from course_utils.assignments.release import release
    from course_utils.notebook_cells import is_test_cell

    rel = release(tmp_path / "rel", units=[0])
    path = rel.units[0].release
    nb = nbformat.read(path, 4)
    for cell in nb.cells:
        if is_test_cell(cell):
            cell.execution_count = 1
    nbformat.write(nb, str(path))
    return path


def test_course_workshop_collect_lists_who_had_nothing_and_refuses_a_wrong_folder(
        tmp_path, capsys):
    assert course(["workshop", "collect", str(EXAMPLE), "--course", str(tmp_path / "no")]) == 1
    err = capsys.readouterr().err
    assert "is not a course folder" in err and "Fix: pass --course" in err
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "nbgrader_config.py").write_text("")
    assert course(["workshop", "collect", str(EXAMPLE), "--course", str(tmp_path / "c"),
                   "--unit", "0"]) == 0
    out = capsys.readouterr().out  # the example's learners are no users of this machine
    assert "alice: nothing to collect" in out and "course grade" in out
    assert course(["workshop", "collect"]) == 1
    assert "needs the workshop file" in capsys.readouterr().err


def test_collect_follows_no_link_and_closes_the_copies(tmp_path, monkeypatch):
    from course_utils.workshop import collect

    home = tmp_path / "home"
    (home / "course" / "unit0").mkdir(parents=True)
    (home / "course" / "unit0" / "00_mine.ipynb").write_text('{"mine": 1}')
    secret = tmp_path / "neighbour.ipynb"
    secret.write_text("a neighbour's work")
    (home / "course" / "unit0" / "01_theirs.ipynb").symlink_to(secret)
    (tmp_path / "theirs" / "unit1").mkdir(parents=True)
    (tmp_path / "theirs" / "unit1" / "x.ipynb").write_text("theirs")
    (home / "course" / "unit1").symlink_to(tmp_path / "theirs" / "unit1")
    me = pwd.getpwuid(os.getuid())
    fake = pwd.struct_passwd((me.pw_name, "x", me.pw_uid, me.pw_gid, "", str(home), "/bin/sh"))
    monkeypatch.setattr(collect.pwd, "getpwnam", lambda name: fake)
    course_dir = tmp_path / "c"
    course_dir.mkdir()
    (course_dir / "nbgrader_config.py").write_text("")
    got = collect.collect_work(workshop_from_dict({"learners": ["ann"], "hosts": _hosts(1)}),
                               course_dir)
    names = [p.name for p in got.notebooks["ann"]]
    assert names == ["00_mine.ipynb"], names  # neither link was followed
    copy = course_dir / "submitted" / "ann" / "unit0" / "00_mine.ipynb"
    assert copy.read_text() == '{"mine": 1}'
    assert stat.S_IMODE(copy.stat().st_mode) == 0o600
    assert stat.S_IMODE((course_dir / "submitted").stat().st_mode) == 0o700


def test_shared_gpus_become_shard_gres():
    ws = workshop_from_dict({"learners": 9, "shards_per_gpu": 2, "hosts": _hosts(2, 2)})
    assert "GresTypes=gpu,shard" in render.slurm_lines(ws)
    assert "Gres=gpu:2,shard:4" in render.slurm_lines(ws)
    assert "NodeName=gpu1 Name=shard Count=4" in render.gres_conf(ws)
    assert '"--gres=shard:1"' in render.learner_profile(ws)
    assert "gpus_per_engine = 0" in render.learner_profile(ws)
    assert "--gres=shard:1" in check.learner_step(ws)


def test_course_workshop_reports_a_bad_file_without_a_traceback(tmp_path, capsys):
    (tmp_path / "w.toml").write_text("learners = 2\n")
    assert course(["workshop", str(tmp_path / "w.toml"), "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "course workshop: the file names no [[hosts]]" in err and "Fix:" in err
    assert "Traceback" not in err


# ---- the queue message ----------------------------------------------------------------------
RECORDS = [
    "JobId=41 JobName=learner-engines UserId=ann(1001) GroupId=ann(1001) JobState=RUNNING "
    "Reason=None Partition=debug RunTime=00:12:03 TimeLimit=01:00:00 "
    "StartTime=2026-12-02T10:00:00 EndTime=2026-12-02T11:00:00 NodeList=rig-a,rig-b "
    "NumNodes=2 NumTasks=4 TRES=cpu=4,node=2,billing=4 TresPerTask=gres:gpu:1",
    "JobId=42 JobName=learner-engines UserId=ben(1002) GroupId=ben(1002) JobState=RUNNING "
    "Reason=None Partition=debug RunTime=00:02:00 TimeLimit=00:30:00 "
    "StartTime=2026-12-02T10:10:00 EndTime=2026-12-02T10:40:00 NodeList=rig-a,rig-b "
    "AllocTRES=cpu=2,node=2,billing=2,gres/gpu=2",
    "JobId=43 JobName=other UserId=zed(1009) JobState=RUNNING Reason=None Partition=debug "
    "RunTime=00:01:00 EndTime=2026-12-02T10:20:00 NodeList=rig-a AllocTRES=cpu=1,node=1",
    "JobId=44 JobName=learner-engines UserId=cat(1003) JobState=PENDING Reason=Resources "
    "Partition=debug TRES=cpu=2,node=2,billing=2,gres/gpu=2",
    "JobId=45 JobName=learner-engines UserId=dan(1004) JobState=PENDING Reason=Priority "
    "Partition=debug TRES=cpu=2,node=2,billing=2,gres/gpu=2",
]


def test_a_queued_learner_is_told_who_holds_which_gpus_and_how_long():
    jobs = [parse_job(r) for r in RECORDS]
    msg = slurm_queue.queue_message(jobs[4], jobs, now=datetime(2026, 12, 2, 10, 14, 3))
    print(msg)
    lines = msg.splitlines()
    assert lines[0] == ("Your engines wait in Slurm's queue: job 45, reason Priority, number 2 "
                        "in line for partition debug.")
    # soonest to end first; the job without GPUs (zed) is not a holder
    assert lines[2] == ("  ben  job 42: 2 GPUs on rig-a,rig-b, running 00:02:00, "
                        "at most 0:25:57 left")
    assert lines[3] == ("  ann  job 41: 4 GPUs on rig-a,rig-b, running 00:12:03, "
                        "at most 0:45:57 left")
    assert "zed" not in msg and "within 0:25:57" in lines[4] and "cu.stop()" in lines[4]
    assert "No running job holds GPUs" in slurm_queue.queue_message(jobs[3], jobs[2:])


def test_a_service_listening_in_a_learners_block_is_named_with_the_span_to_leave():
    """The firewall refuses a block's ports to all but its learner: any other listener there (a
    Slurm daemon did, in this suite's rig) breaks for everyone. A real socket, read back from
    /proc/net/tcp as the check reads it."""
    from course_utils.cluster.kernel.exposure import listening_table
    from course_utils.workshop.check_as_learner import block_squatters

    ws = workshop_from_dict({"learners": ["nobody-x", "nobody-y"],
                             "hosts": [{"name": "x", "address": "10.0.0.1", "gpus": 1}]})
    low, high = ws.port_block("nobody-y")
    with contextlib.ExitStack() as stack:
        for port in range(low, high + 1):
            sock = stack.enter_context(socket.socket())
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            sock.listen()
            break
        found = block_squatters(ws, listening_table())
    print(found)
    assert f"port {port} of nobody-y's block is held by uid {os.getuid()}" in found
    assert block_squatters(ws, listening_table("  sl  local_address rem_address   st\n")) == []
    listed = f"   0: 0100007F:{port:04X} 00000000:0000 0A 0:0 00:0 0 {os.getuid()} 0 1"
    connected = listening_table(listed.replace(" 0A ", " 01 "))  # connected, not listening
    assert block_squatters(ws, connected) == []


FENCED = {"TaskPlugin": "task/cgroup,task/affinity", "ProctrackType": "proctrack/cgroup",
          "AccountingStorageEnforce": "associations,limits,qos"}


@pytest.mark.parametrize("change, named", [
    ({}, None),
    ({"TaskPlugin": "task/affinity"}, "TaskPlugin=task/affinity: a learner's ranks can open"),
    ({"ProctrackType": "proctrack/linuxproc"}, "ProctrackType=proctrack/linuxproc"),
    ({"AccountingStorageEnforce": "associations"}, "AccountingStorageEnforce=associations)"),
    ({"cgroup": "ConstrainCores=yes\nConstrainDevices=no\n"}, "lacks ConstrainDevices=yes"),
    ({"QoS": "N/A"}, "partition QoS=N/A"),
])
def test_fencing_names_each_missing_line_and_passes_a_fenced_cluster(change, named):
    from course_utils.workshop.check_setup import fencing_gaps

    config = {**FENCED, **{k: v for k, v in change.items() if k in FENCED}}
    cgroup = change.get("cgroup", "# beside slurm.conf\nConstrainCores=yes\nconstraindevices=Yes\n")
    gaps = fencing_gaps(config, cgroup, {"PartitionName": "workshop",
                                         "QoS": change.get("QoS", "workshop")})
    assert gaps == [] if named is None else len(gaps) == 1 and named in gaps[0], gaps


def _tls_pair(folder: Path, address: str, name: str = "hub") -> tuple[Path, Path]:
    """A self-signed certificate for ``address`` (openssl, as an instructor would make one)
    and its key, 0600."""
    cert, key = folder / f"{name}.pem", folder / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", f"/CN={address}", "-addext", f"subjectAltName=IP:{address}",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True,
                   timeout=60)
    key.chmod(0o600)
    return cert, key


def test_tls_is_a_warning_without_a_pair_and_checks_the_pair_it_is_given(tmp_path):
    from course_utils.workshop.check_setup import check_tls

    plain = workshop_from_dict({"learners": 2, "hosts": _hosts(1)})
    warned = check_tls(plain)
    assert warned.status == "WARN" and "plain http (http://10.0.0.1:8000)" in warned.detail
    assert "ssl_cert and ssl_key under [hub]" in warned.text()  # a WARN shows its fix
    cert, key = _tls_pair(tmp_path, "10.0.0.1")
    other_cert, _ = _tls_pair(tmp_path, "10.0.0.1", "other")

    def with_pair(c: Path, k: Path):
        return workshop_from_dict({"learners": 2, "hosts": _hosts(1),
                                   "hub": {"ssl_cert": str(c), "ssl_key": str(k)}})

    good = with_pair(cert, key)
    assert good.hub_url == "https://10.0.0.1:8000"
    assert check_tls(good).status == "PASS", check_tls(good)
    config = render.hub_config(good, tmp_path / "p.toml", tmp_path / "release", tmp_path)
    assert f"c.JupyterHub.ssl_key = {json.dumps(str(key))}" in config
    assert 'bind_url = "https://10.0.0.1:8000"' in config
    assert "ssl_key" not in render.hub_config(plain, tmp_path / "p.toml", tmp_path, tmp_path)
    mismatched = check_tls(with_pair(other_cert, key))
    assert mismatched.status == "FAIL" and "are not a pair" in mismatched.detail, mismatched
    key.chmod(0o644)
    opened = check_tls(good)
    assert opened.status == "FAIL" and opened.fix == f"chmod 600 {key}", opened
    key.unlink()
    assert "cannot be read here" in check_tls(good).detail


def test_overlapping_rigs_close_the_folders_only_when_the_last_one_leaves(tmp_path):
    from tests.rigs.workshop import reachable_by_all

    inner = tmp_path / "closed" / "env"
    inner.mkdir(parents=True)
    (tmp_path / "closed").chmod(0o700)
    state = tmp_path / "state.json"
    mode = lambda: stat.S_IMODE((tmp_path / "closed").stat().st_mode)  # noqa: E731
    first = reachable_by_all(str(inner), state=state)
    assert str(tmp_path / "closed") in first.__enter__() and mode() == 0o701
    second = reachable_by_all(str(inner), state=state)
    second.__enter__()
    first.__exit__(None, None, None)  # the rig that opened it leaves first
    assert mode() == 0o701  # the other rig still runs: still open
    second.__exit__(None, None, None)
    assert mode() == 0o700  # the last one left: restored


# ---- on the rig: Slurm over the two hosts, fake GPUs, OS users -------------------------------
@pytest.fixture(scope="module")
def rig():
    from tests.rigs.twohosts import rig_or_skip
    from tests.rigs.workshop import workshop_rig

    rigs_slurm.require_rig()
    with rig_or_skip(sshd=False) as hosts, workshop_rig(hosts) as built:
        yield built


def _lines(ws, **kw):
    said: list[str] = []
    lines = check.run_checks(ws, token="", emit=said.append, **kw)
    print("\n".join(said))
    return {line.name: line for line in lines}


def test_workshop_check_passes_on_the_good_rig_in_seconds(rig):
    t0 = time.monotonic()
    lines = _lines(rig.workshop())
    took = time.monotonic() - t0
    print(f"workshop check took {took:.1f} s")
    for name in ("slurm", "nodes", "gres", "partition", "a learner's ranks",
                 "same users, shared homes"):
        assert lines[name].status == "PASS", lines[name]
    assert re.fullmatch(r"rig-a: GPUs \['\d'\], rig-b: GPUs \['\d'\]",
                        lines["a learner's ranks"].detail)
    # No hub runs on this rig: the check says so with the fix, and skips the spawn.
    assert lines["hub"].status == "FAIL" and "jupyterhub -f" in lines["hub"].fix
    assert lines["a learner spawns"].status == "SKIP"
    # The rig fences nothing (no cgroups in a container, no slurmdbd): each gap is named.
    fence = lines["fencing and limits"]
    print(fence.text())
    assert fence.status == "FAIL" and "TaskPlugin=task/none" in fence.detail, fence
    assert "ProctrackType=proctrack/linuxproc" in fence.detail
    assert "ConstrainDevices=yes" in fence.detail and "partition QoS=N/A" in fence.detail
    assert "slurm-workshop.conf" in fence.fix and str(rig.slurm.conf) in fence.fix
    if shutil.which("bwrap"):
        assert lines["grading sandbox"].status == "PASS", lines["grading sandbox"]
    assert took < 60, took  # bounded: every Slurm call has its timeout


def test_workshop_check_names_each_fault_and_its_fix(rig, monkeypatch):
    more = rig.workshop(hosts=[{"name": n, "address": a, "gpus": 8}
                               for n, (_, a) in rig.slurm.nodes.items()])
    gres = _lines(more)["gres"]
    assert gres.status == "FAIL" and "rig-a has {'gpu': 4, " in gres.detail
    assert "the file says {'gpu': 8}" in gres.detail
    assert "gres.conf" in gres.fix
    wrong_part = _lines(rig.workshop(partition="gpus"))
    part = wrong_part["partition"]
    assert part.status == "FAIL" and "no partition 'gpus'" in part.detail
    assert "PartitionName" in part.fix
    assert "`partition` in the workshop file" in wrong_part["a learner's ranks"].fix
    renamed = rig.workshop(hosts=[{"name": "gpu-x", "address": "10.0.0.9", "gpus": 4}])
    nodes = _lines(renamed)["nodes"]
    assert nodes.status == "FAIL" and "['gpu-x'] are not Slurm nodes" in nodes.detail
    monkeypatch.setenv("SLURM_CONF", str(rig.slurm.root / "nowhere.conf"))
    missing = _lines(rig.workshop(slurm_conf=""))["slurm"]
    assert missing.status == "FAIL" and "nowhere.conf, which does not exist" in missing.detail
    assert _lines(rig.workshop())["slurm"].status == "PASS"  # the file's slurm_conf wins
    wrong_in_file = _lines(rig.workshop(slurm_conf=str(rig.slurm.root / "gone.conf")))["slurm"]
    assert "the workshop file's slurm_conf names" in wrong_in_file.detail, wrong_in_file
    # slurmctld not answering: the same cluster's file with the controller on a closed port
    wrong = rig.slurm.root / "wrong-port.conf"
    wrong.write_text(re.sub(r"(?m)^SlurmctldPort=\d+", f"SlurmctldPort={free_port()}",
                            rig.slurm.conf.read_text()))
    t0 = time.monotonic()
    down = _lines(rig.workshop(slurm_conf=str(wrong)))
    print(f"with slurmctld unreachable the check took {time.monotonic() - t0:.1f} s")
    assert down["slurm"].status == "FAIL" and "DOWN" in down["slurm"].detail, down["slurm"]
    assert "slurmctld" in down["slurm"].fix
    assert down["gres"].status == "SKIP" and "\n" not in down["slurm"].detail


def test_the_sources_check_fails_while_a_learner_can_read_the_checkout(rig):
    from course_utils.workshop.learner_env import build_learner_env, source_places
    from tests.rigs.workshop import closed_to_others

    base = Path(tempfile.mkdtemp(prefix="course-learner-env-"))
    try:
        base.chmod(0o755)  # learners run its Python
        env = build_learner_env(base).parent.parent
        # compiled where it was built: learners cannot write the package's cache themselves
        assert list(env.glob("lib/python*/site-packages/course_utils/__pycache__/cli.*.pyc"))
        ws = rig.workshop()
        opened = [p for p in source_places() if p.stat().st_mode & 0o005 == 0o005]
        if opened:  # a checkout readable by all, as this one usually is
            line = check.check_sources(ws, env)
            print(line.text())
            assert line.status == "FAIL" and f"{ws.learners[0]} can read" in line.detail
            assert "chmod o-rwx" in line.fix
        with closed_to_others(source_places()):
            line = check.check_sources(ws, env)
        print(line.text())
        assert line.status == "PASS", line
        assert check.check_sources(ws, None).status == "SKIP"
        # the course folder as `course release` and grading leave it, with the umask's modes
        course_dir = base / "course"
        for sub in ("source/unit0", "release/unit0", "submitted/ann/unit0"):
            (course_dir / sub).mkdir(parents=True, mode=0o755)
        for name in ("nbgrader_config.py", "gradebook.db", "source/unit0/a.ipynb"):
            (course_dir / name).write_text("{}")
            (course_dir / name).chmod(0o644)
        for sub in ("", "source", "source/unit0", "release", "submitted"):
            (course_dir / sub).chmod(0o755)
        opened = check.check_course_folder(ws, env, course_dir)
        print(opened.text())
        assert opened.status == "FAIL" and "gradebook.db" in opened.detail, opened
        assert "source" in opened.detail and "submitted" in opened.detail
        done = subprocess.run(opened.fix.split(" (")[0], shell=True, check=False)
        assert done.returncode == 0  # the fix is a command that runs as written
        closed = check.check_course_folder(ws, env, course_dir)
        print(closed.text())
        assert closed.status == "PASS", closed
        assert check.check_course_folder(ws, env, base / "nowhere").status == "FAIL"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _all_running(jobs: list[str], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while any(job_status(j).state != "RUNNING" for j in jobs):
        assert time.monotonic() < deadline, [job_status(j) for j in jobs]
        time.sleep(0.3)


@pytest.fixture(autouse=True)
def _queue_left_empty(request):
    """After each test on the rig, no learner's job is left: a test that failed half-way
    does not leave the next one without GPUs."""
    yield
    if "rig" in request.fixturenames:
        request.getfixturevalue("rig").cancel_all()


def _reason_given(job: str, timeout: float = 30.0) -> JobStatus:
    """The job's status once Slurm's scheduler has looked at it (right after sbatch a pending
    job's reason is still ``None``)."""
    deadline = time.monotonic() + timeout
    while (status := job_status(job)).state == "PENDING" and status.reason == "None":
        if time.monotonic() > deadline:
            break
        time.sleep(0.3)
    return status


def test_learners_get_distinct_gpus_and_the_next_one_is_queued_with_the_holders(rig):
    ws = rig.workshop()
    assert (ws.capacity, ws.queued) == (4, 1)
    *holders, fifth = (rig.submit_as(user, ws) for user in rig.learners)
    _all_running(holders)
    waiting = _reason_given(fifth)
    assert (waiting.state, waiting.reason) == ("PENDING", "Resources"), waiting
    homes = [Path(pwd.getpwnam(u).pw_dir) for u in rig.learners[:4]]
    outs: dict[str, list[str]] = {}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(outs) < 4:
        for job, home in zip(holders, homes, strict=True):
            out = home / f"learner-engines-{job}.out"
            if out.exists() and len(out.read_text().split("\n")) > 2:
                outs[job] = out.read_text().split("\n")[:2]
        time.sleep(0.3)
    print(outs)
    per_node = [dict(line.split() for line in lines) for lines in outs.values()]
    assert [sorted(p) for p in per_node] == [["rig-a", "rig-b"]] * 4
    for node in ("rig-a", "rig-b"):  # on each host, the four learners hold four GPUs
        assert sorted(p[node] for p in per_node) == ["0", "1", "2", "3"], per_node
    msg = slurm_queue.queue_message(waiting)
    print(msg)
    assert f"job {fifth}, reason Resources, number 1 in line" in msg
    for user, job in zip(rig.learners[:4], holders, strict=True):
        assert re.search(rf"{user}\s+job {job}: 2 GPUs on rig-a,rig-b, running 00:00:\d\d, "
                         r"at most 0:0[45]:\d\d left", msg), msg
    rig.cancel_all()


def test_shared_gpus_let_every_learner_run_at_once(rig):
    """``shards_per_gpu = 2``: the same four GPUs per host hold eight learners' ranks (Slurm's
    ``shard`` GRES), so all five learners run at once, none queued."""
    ws = rig.workshop(shards_per_gpu=2)
    assert (ws.capacity, ws.queued) == (8, 0)
    lines = _lines(ws)
    assert lines["gres"].status == "PASS", lines["gres"]
    assert lines["a learner's ranks"].status == "PASS", lines["a learner's ranks"]
    try:
        jobs = [rig.submit_as(user, ws) for user in rig.learners]
        _all_running(jobs)
        print({j: job_status(j).state for j in jobs})
    finally:
        rig.cancel_all()


class _Spawner:
    """What JupyterHub hands the hook: the spawner, with its user."""

    def __init__(self, name: str) -> None:
        self.user = type("User", (), {"name": name})()


def _release(files: int = 1) -> Path:
    """A student release every learner can read (as ``course workshop`` leaves one)."""
    base = Path(tempfile.mkdtemp(prefix="course-release-"))
    base.chmod(0o755)
    unit = base / "unit0"
    unit.mkdir(mode=0o755)
    for i in range(files):
        (unit / f"{i:03d}.ipynb").write_text("{}")
        (unit / f"{i:03d}.ipynb").chmod(0o644)
    return base


def test_the_hub_hook_gives_a_learner_their_own_closed_copy_of_the_release(rig):
    release = _release()
    entry = pwd.getpwnam(rig.learners[0])
    home = Path(entry.pw_dir)
    try:
        hub.provision(release)(_Spawner(entry.pw_name))
        copy = home / hub.WORK_FOLDER / "unit0" / "000.ipynb"
        assert copy.read_text() == "{}" and copy.stat().st_uid == entry.pw_uid
        assert stat.S_IMODE(home.stat().st_mode) == 0o700  # other learners cannot read it
        copy.write_text('{"mine": 1}')
        hub.provision(release)(_Spawner(entry.pw_name))  # a second login keeps the work
        assert copy.read_text() == '{"mine": 1}'
        with pytest.raises(Exception, match="is not a user of this host"):
            hub.provide_folder("cw-nobody-here", release)
        shutil.rmtree(home / hub.WORK_FOLDER)
        release.chmod(0o700)  # the copy runs as the learner: a release they cannot read fails
        with pytest.raises(Exception, match=r"chmod -R a\+rX"):
            hub.provision(release)(_Spawner(entry.pw_name))
    finally:  # the hub's tests give this learner the real release
        shutil.rmtree(home / hub.WORK_FOLDER, ignore_errors=True)
        shutil.rmtree(release, ignore_errors=True)


#: A learner's process that, once the hook has made ``~/course``, swaps it for a symlink to
#: a folder of root's (the race a root hook that copies and chowns by path loses).
_SWAP = """
import os, sys, time
work, target = sys.argv[1:3]
end = time.monotonic() + 20
while time.monotonic() < end:
    if os.path.isdir(work) and not os.path.islink(work):
        try:
            os.rename(work, work + ".moved")
            os.symlink(target, work)
            print("swapped")
        except OSError as err:
            print("failed", err)
        break
    time.sleep(0.0005)
"""


def test_a_learner_who_swaps_their_folder_for_a_symlink_redirects_nothing(rig):
    release = _release(files=400)  # a copy long enough for the swap to land inside it
    entry = pwd.getpwnam(rig.learners[1])
    home = Path(entry.pw_dir)
    work = home / hub.WORK_FOLDER
    target = Path(tempfile.mkdtemp(prefix="course-roots-"))  # root's, 0700
    shutil.rmtree(work, ignore_errors=True)
    swapper = subprocess.Popen(["runuser", "-u", entry.pw_name, "--", "python3", "-c", _SWAP,
                                str(work), str(target)], stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(0.3)
        try:
            hub.provision(release)(_Spawner(entry.pw_name))
        except Exception as err:  # the copy, as the learner, cannot write through the link
            print("the hook said:", err)
        said = swapper.communicate(timeout=30)[0]
        print("learner's process:", said.strip())
        assert "swapped" in said
        assert list(target.iterdir()) == []  # nothing written through the link
        assert target.stat().st_uid == 0 and stat.S_IMODE(target.stat().st_mode) == 0o700
    finally:
        swapper.kill()
        for path in (work, Path(str(work) + ".moved")):
            if path.is_symlink():
                path.unlink()
            shutil.rmtree(path, ignore_errors=True)
        shutil.rmtree(release, ignore_errors=True)
        shutil.rmtree(target, ignore_errors=True)


def test_a_learners_cu_start_waits_in_the_queue_with_the_message_then_gets_a_gpu_per_host(
        rig, tmp_path, capfd):
    import course_utils as cu
    from course_utils.cluster.engines import engine
    from course_utils.cluster.launchers.slurm import SlurmJobError
    from tests.rigs.twohosts import IFNAME

    ws = rig.workshop(interface=IFNAME)
    # The learners' profile as `course workshop` writes it; on the rig the learner's kernel is
    # this test, in the root namespace, so the controller binds to the rigs' gateway address.
    text = render.learner_profile(ws)
    assert f'controller_ip = "{ws.hub.address}"' in text
    prof = tmp_path / "learner-profile.toml"
    prof.write_text(text.replace(f'controller_ip = "{ws.hub.address}"',
                                 f'controller_ip = "{rig.hosts.controller_ip}"'))
    holders = [rig.submit_as(user, ws) for user in rig.learners[:4]]
    _all_running(holders)
    t0 = time.monotonic()
    with pytest.raises(SlurmJobError) as caught:
        cu.start(profile=prof, cluster_id=f"pytest-ws-{os.getpid()}", timeout=6)
    took = time.monotonic() - t0
    err = capfd.readouterr().err
    print(err, f"\ncu.start() gave up after {took:.1f} s:\n{caught.value}")
    assert err.count("Your engines wait in Slurm's queue") == 1, err  # told once, at once
    assert "The GPUs are held by:" in err and "cu.start() waits for them" in err
    assert "still PENDING, reason Resources" in str(caught.value)
    for user in rig.learners[:4]:
        assert f"{user}  job " in str(caught.value)
    rig.cancel_all()
    cc = cu.start(profile=prof, cluster_id=f"pytest-ws-{os.getpid()}", timeout=60)
    try:
        print(cc.ranks.table())
        assert list(cc.ranks.hosts) == ["rig-a", "rig-b"]
        gpus = cc.run(engine.getenv, "CUDA_VISIBLE_DEVICES")
        assert all(g in ("0", "1", "2", "3") for g in gpus), gpus  # one fake GPU each
    finally:
        cu.stop()


def test_a_leaked_job_is_freed_by_the_instructor_or_by_the_learners_own_cu_stop(
        rig, tmp_path, monkeypatch, capsys):
    import course_utils as cu
    from course_utils.cluster.launchers.slurm import job_name
    from course_utils.workshop import jobs

    ws = rig.workshop()
    left = rig.submit_as(rig.learners[0], ws)  # a learner who went home with their GPUs
    cid = f"pytest-leak-{os.getpid()}"
    mine = rig.submit_as("root", ws, name=job_name(cid))  # a start of "mine" that died
    _all_running([left, mine])
    held = {j.learner: j.job_id for j in jobs.learner_jobs(ws)}
    assert held == {rig.learners[0]: left}, held
    assert jobs.release(ws, rig.learners[0]) == [left]
    assert job_status(left).state in ("CANCELLED", "COMPLETING", "UNKNOWN"), job_status(left)
    assert jobs.release(ws, rig.learners[0]) == []  # nothing left: says so, no error
    with pytest.raises(WorkshopError, match="not a learner of this workshop"):
        jobs.release(ws, "mallory")
    # the learner's own cu.stop(), in a kernel that never learned its job, finds it by name
    prof = tmp_path / "learner-profile.toml"
    prof.write_text(render.learner_profile(ws))
    monkeypatch.setenv("COURSE_PROFILE", str(prof))
    monkeypatch.setenv("COURSE_CLUSTER_ID", cid)
    cu.stop()
    assert f"cancelled Slurm job {mine}" in capsys.readouterr().out
    deadline = time.monotonic() + 15
    while job_status(mine).state == "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert job_status(mine).state != "RUNNING"


@contextlib.contextmanager
def firewall_loaded(rig, nft_file: Path):
    """``firewall.nft`` loaded in both hosts' network namespaces (where the learners' labs and
    engines run; never in this machine's own, where other tests pick ports too)."""
    from tests.rigs.common import apt_install, install_allowed, unavailable

    if shutil.which("nft") is None and install_allowed():
        apt_install(["nftables"], timeout=600)
    if shutil.which("nft") is None:
        unavailable("nftables (nft) is not installed", "apt-get install -y nftables  # as root")
    hosts = [rig.hosts.host(h) for h in ("a", "b")]
    try:
        for h in hosts:
            done = rig.hosts.run(h, ["nft", "-f", str(nft_file)], check=False)
            assert done.returncode == 0, done.stderr
        yield
    finally:
        for h in hosts:
            rig.hosts.run(h, ["nft", "delete", "table", "inet", render.FIREWALL_TABLE],
                          check=False)


#: A learner's torch store (as the course starts one), with a key only its ranks should read.
STORE = """
import datetime, sys, time
import torch.distributed as dist
store = dist.TCPStore(sys.argv[1], int(sys.argv[2]), None, True,
                      datetime.timedelta(seconds=60), wait_for_workers=False)
store.set("rank0_addr", "the owner's value")
print("listening", flush=True)
time.sleep(90)
"""
#: Another process that connects to it, reads the key and plants one.
INTRUDER = """
import datetime, sys
import torch.distributed as dist
try:
    c = dist.TCPStore(sys.argv[1], int(sys.argv[2]), None, False, datetime.timedelta(seconds=4))
    print("read:", c.get("rank0_addr").decode())
    c.set("planted", "x")
    print("planted")
except Exception as exc:
    print("refused:", type(exc).__name__)
"""


def test_a_learner_cannot_reach_anothers_torch_store_once_the_firewall_is_loaded(
        rig, tmp_path):
    from tests.rigs.workshop import reachable_by_all

    ws = rig.workshop()
    ann, ben = rig.learners[:2]
    low, high = ws.port_block(ann)
    assert (low, high) == (20000, 20099) and ws.port_block(ben)[0] == 20100
    nft = tmp_path / "firewall.nft"
    nft.write_text(render.firewall_nft(ws))
    a, b = rig.hosts.host("a"), rig.hosts.host("b")
    python = sys.executable

    def as_user(user: str, host, code: str, *args: str, timeout: float = 60):
        return rig.hosts.run(host, ["runuser", "-u", user, "--", python, "-c", code, *args],
                             timeout=timeout, check=False).stdout.strip()

    with reachable_by_all(sys.prefix, os.path.realpath(sys.executable)):
        owner = rig.hosts.popen(a, ["runuser", "-u", ann, "--", python, "-c", STORE,
                                    a.address, str(low + 7)],
                                stdout=subprocess.PIPE, text=True)
        try:
            assert owner.stdout.readline().strip() == "listening"
            before = as_user(ben, b, INTRUDER, a.address, str(low + 7))
            print("without the firewall, ben from host b:", before)
            assert "read: the owner's value" in before and "planted" in before
            with firewall_loaded(rig, nft):
                seen = {f"{who} from {h.name}": as_user(who, h, INTRUDER, a.address, str(low + 7))
                        for who, h in ((ben, b), (ben, a), (ann, b))}
            print(seen)
            assert seen[f"{ben} from b"].startswith("refused")
            assert seen[f"{ben} from a"].startswith("refused")
            assert "planted" in seen[f"{ann} from b"]  # the owner's own ranks still reach it
        finally:
            owner.kill()
            owner.wait()


def test_a_hub_given_a_tls_pair_serves_https_and_the_check_trusts_it_only_once_told(
        rig, tmp_path, monkeypatch):
    """``[hub] ssl_cert``/``ssl_key``: the real hub (in host b's namespace) serves its login
    over https with the pair; ``course workshop check`` passes TLS, and its hub check names a
    certificate this host does not trust (a self-signed one) until told of it."""
    import secrets

    from tests.rigs.common import RigUnavailable, unavailable
    from tests.rigs.hub import proxy_command, running_hub

    try:
        proxy_command()
    except RigUnavailable as exc:
        unavailable(str(exc))
    b = rig.hosts.host("b")
    cert, key = _tls_pair(tmp_path, b.address)
    ws = rig.workshop(hub={"host": "rig-b", "ssl_cert": str(cert), "ssl_key": str(key)})
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "check-token").write_text(secrets.token_hex(32))
    config = tmp_path / "jupyterhub_config.py"
    config.write_text(render.hub_config(ws, tmp_path / "p.toml", tmp_path / "release", state))
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # this host trusts the pair's certificate
    with running_hub(config, b.netns, ws.hub_url, tmp_path / "hub.log"):
        trusted = check.check_hub(ws)
        monkeypatch.delenv("SSL_CERT_FILE")
        untrusted = check.check_hub(ws)
    from course_utils.workshop.check_setup import check_tls

    print(trusted.text(), untrusted.text(), sep="\n")
    assert trusted.status == "PASS" and f"at https://{b.address}:8000" in trusted.detail
    assert untrusted.status == "FAIL" and "does not trust" in untrusted.detail, untrusted
    assert "SSL_CERT_FILE" in untrusted.fix and b.address in untrusted.fix
    assert check_tls(ws).status == "PASS"


# ---- the hub: real JupyterHub, learners through its REST API ---------------------------------
GUIDE = Path(__file__).parents[1] / "docs" / "instructor.md"


def runbook() -> list[str]:
    """The commands of the guide's "The day in commands" block, in order, comments dropped."""
    after = GUIDE.read_text().split("**The day in commands.**", 1)[1]
    block = after.split("```sh\n", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]


def test_the_guides_runbook_lists_the_days_commands_that_course_parses():
    from course_utils.cli import build_parser

    steps = runbook()
    print("\n".join(steps))
    assert [s.split()[:2] for s in steps] == [
        ["course", "release"], ["course", "workshop"], ["nft", "-f"], ["jupyterhub", "-f"],
        ["course", "workshop"], ["course", "workshop"], ["course", "grade"]]
    for step in steps:
        if step.startswith("course "):
            build_parser().parse_args(shlex.split(step)[1:])  # exits on a wrong option


def _run_step(step: str, cwd: Path) -> str:
    """One runbook line as an instructor types it, `course` being this environment's."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    done = subprocess.run(shlex.split(step), cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    return done.stdout + done.stderr


def _check_lines(out: str) -> list[check.Line]:
    """`course workshop check`'s printed lines, back as Line objects."""
    found = re.findall(r"^\[(PASS|FAIL|WARN|SKIP)\] ([^:]+): (.*?)(?: -> fix: (.*))?$", out,
                       re.MULTILINE)
    return [check.Line(name, status, detail, fix) for status, name, detail, fix in found]



@pytest.fixture(scope="module")
def running(rig):
    """The hub of `course workshop`'s config, in host a's namespace, the learners' release
    being unit 0's student version, the checkout's notebooks closed to others as an
    instructor's are; yields (workshop, the check service's token, the folder of both)."""
    from course_utils.workshop.learner_env import source_places
    from tests.rigs.common import RigUnavailable, require_bwrap, unavailable
    from tests.rigs.hub import proxy_command, running_hub
    from tests.rigs.twohosts import IFNAME
    from tests.rigs.workshop import closed_to_others, toml_text

    try:
        proxy_command()  # installs it from npm where allowed
    except RigUnavailable as exc:
        unavailable(str(exc))
    require_bwrap()  # the check's grading sandbox line (installed where allowed)
    # Not under pytest's tmp folders (0700): the learners read their profile from here.
    base = Path(tempfile.mkdtemp(prefix="course-workshop-"))
    base.chmod(0o755)
    (base / "workshop.toml").write_text(toml_text(rig.workshop_data(interface=IFNAME)))
    release_step, workshop_step, nft_step, hub_step = runbook()[:4]
    said = _run_step(release_step, base)  # the guide's commands, as they stand
    assert (base / "course" / "release" / "unit0").is_dir(), said
    said = _run_step(workshop_step, base)
    assert (base / "workshop" / "jupyterhub_config.py").is_file(), said
    ws = load_workshop(base / "workshop.toml")
    netns = rig.hosts.host("a").netns
    nft_file, hub_config = (base / shlex.split(s)[2] for s in (nft_step, hub_step))
    try:
        with (closed_to_others(source_places()), firewall_loaded(rig, nft_file),
              running_hub(hub_config, netns, ws.hub_url, base / "hub.log")):
            yield ws, check.find_token(base / "workshop"), base
    finally:
        shutil.rmtree(base, ignore_errors=True)


#: ``check_firewall`` run inside a host's namespace (where the rig loaded the firewall).
FIREWALL_CHECK = """
import sys
from pathlib import Path
from course_utils.workshop.check_as_learner import check_firewall
from course_utils.workshop.plan import workshop_from_dict
ws = workshop_from_dict({"learners": sys.argv[2:],
                         "hosts": [{"name": "x", "address": "10.0.0.1", "gpus": 1}]})
print(check_firewall(ws, Path(sys.argv[1])).text())
"""


def test_workshop_check_passes_with_the_hub_and_a_test_learner_spawns(rig, running):
    ws, token, base = running
    said = _run_step(runbook()[4], base)  # the guide's `course workshop check ...`
    print(said)
    lines = _check_lines(said)
    assert said.rstrip().endswith(f"failed (of {len(lines)} checks)"), said
    by_name = {line.name: line for line in lines}
    # the firewall is loaded where the learners run (the hosts' namespaces), not in this one
    wall = by_name.pop("ports closed to others")
    nft = f"nft -f {base / 'workshop' / 'firewall.nft'}"
    assert wall.status == "FAIL" and nft in wall.fix, wall
    assert by_name.pop("fencing and limits").status == "FAIL"  # no cgroups on the rig: above
    assert by_name.pop("TLS").status == "WARN"  # this hub serves http (https: its own test)
    assert [line.status for line in by_name.values()] == ["PASS"] * 12, said
    assert by_name["lab memory"].detail == (  # the rig's [hub] max_memory = "2G"
        f"each learner's lab and kernels share 2.0 GiB (course-labs/<learner>, "
        f"memory.limit_in_bytes = {2 << 30})"), by_name["lab memory"]
    assert "cannot read" in lines[5].detail and lines[5].name == "sources hidden"
    assert lines[6].name == "course folder closed"  # `course release` closed it
    inside = rig.hosts.run("a", [sys.executable, "-c", FIREWALL_CHECK, str(base / "workshop"),
                                 *ws.learners], timeout=60).stdout.strip()
    print(inside)
    assert inside.startswith("[PASS] ports closed to others: 5 learners' blocks"), inside
    assert re.search(r"'s lab was ready in \d+\.\d s \(stopped again\)$",
                     by_name["a learner spawns"].detail), by_name["a learner spawns"]


def _lesson_run(lab, notebook: Path) -> list[str]:
    """Every code cell of the learner's unit 0 in their kernel; the lesson cells that failed
    (solution and test cells fail on the student version by design)."""
    import nbformat

    from course_utils.notebook_cells import is_solution_cell, is_test_cell

    failed = []
    for cell in nbformat.read(notebook, 4).cells:
        if cell.cell_type != "code":
            continue
        _, err = lab.run(cell.source, timeout=180)
        graded = is_solution_cell(cell) or is_test_cell(cell)
        if ("Error" in err or "Traceback" in err) and not graded:
            failed.append(f"{cell.metadata.get('nbgrader', {}).get('grade_id')}: {err[-300:]}")
    return failed


PROBE = """
import course_utils as cu
from course_utils.cluster import engine
cluster = cu.start()
print("HOSTS", list(cluster.ranks.hosts))
print("GPUS", cluster.run(engine.getenv, "CUDA_VISIBLE_DEVICES"))
"""
ALL_REDUCE = """%%px
import torch
import torch.distributed as dist
t = torch.tensor([rank + 1.0])
dist.all_reduce(t)
print(f"SUM {t.item():.0f}")
"""


def test_four_learners_at_once_hold_both_hosts_gpus_while_one_runs_unit0(rig, running):
    """Four learners log in at once and hold ranks on both hosts, each with GPUs nobody else
    holds. Unit 0 runs whole for one of them, so its hang cell's ``cu.restart()`` (a new Slurm
    job) happens while the others start and all_reduce; the other three run the probe and the
    all_reduce (unit 0 through the hub runs whole again in Chromium, below).
    ``COURSE_BENCH_SERIAL=1`` first runs one learner alone, for the guide's login-to-ranks
    figure (a benchmark, not a timed test)."""
    import threading

    from tests.rigs.hub import LearnerLab

    ws, token, _ = running
    labs = [LearnerLab(ws.hub_url, user, token) for user in rig.learners]
    report: dict[str, dict] = {}

    def learner(lab: LearnerLab, whole_unit: bool) -> None:
        t0 = time.monotonic()
        lab.login()
        ready = lab.start_lab()
        lab.start_kernel()
        home = Path(pwd.getpwnam(lab.user).pw_dir)
        failed = (_lesson_run(lab, home / "course" / "unit0" / "00_cluster_tour.ipynb")
                  if whole_unit else None)
        probe, _ = lab.run(PROBE)  # unit 0 ends with cu.stop(): a fresh cluster
        lab.run("cu.start_torch()")
        summed, err = lab.run(ALL_REDUCE)
        report[lab.user] = {"lab ready s": round(ready, 1), "failed": failed, "probe": probe,
                            "total s": round(time.monotonic() - t0, 1),
                            "sum": (summed + err)[-400:], "stray": lab.stray[-4:]}

    together_labs, whole = labs[:4], 1  # unit 0 whole for one learner
    if os.environ.get("COURSE_BENCH_SERIAL"):  # one learner alone first, for the guide
        t0 = time.monotonic()
        learner(labs[0], True)
        print(f"one learner alone, login to ranks and unit 0: {time.monotonic() - t0:.1f} s")
        together_labs = labs[1:4]
    threads = [threading.Thread(target=learner, args=(lab, i < whole))
               for i, lab in enumerate(together_labs)]
    t1 = time.monotonic()
    for th in threads:
        th.start()
    for th in threads:
        th.join(600)
    together = time.monotonic() - t1
    print(json.dumps(report, indent=1))
    print(f"{len(together_labs)} learners at once, login to ranks (one running unit 0 whole, "
          f"four holding GPUs): {together:.1f} s")
    assert len(report) == 4, report
    alone = bool(os.environ.get("COURSE_BENCH_SERIAL"))
    assert sum(r["failed"] is not None for r in report.values()) == 1 + alone, report
    gpus_per_host: dict[str, list[str]] = {"rig-a": [], "rig-b": []}
    for user, r in report.items():
        assert r["failed"] in ([], None), (user, r["failed"])
        assert "HOSTS ['rig-a', 'rig-b']" in r["probe"], r
        assert r["sum"].count("SUM 3") == 2, r  # 1 + 2 on both ranks
        gpus = re.search(r"GPUS \['(\d)', '(\d)'\]", r["probe"])
        gpus_per_host["rig-a"].append(gpus[1])
        gpus_per_host["rig-b"].append(gpus[2])
    for host, gpus in gpus_per_host.items():  # four learners, four different GPUs per host
        assert sorted(gpus) == ["0", "1", "2", "3"], (host, gpus)
    # A fifth learner, while the four hold every GPU: queued, told who holds what.
    fifth = labs[4]
    fifth.login()
    fifth.start_lab()
    fifth.start_kernel()
    out, err = fifth.run("import course_utils as cu\ntry:\n    cu.start(timeout=10)\n"
                         "except Exception as exc:\n    print(type(exc).__name__)")
    print(err)
    assert "SlurmJobError" in out, (out, err)
    assert err.count("Your engines wait in Slurm's queue") == 1 and "reason Resources" in err
    for user in rig.learners[:4]:
        assert re.search(rf"{user}\s+job \d+: 2 GPUs on rig-a,rig-b", err), err
    # Learner A cannot read learner B's work.
    other = pwd.getpwnam(rig.learners[1]).pw_dir
    out, err = labs[0].run(f"import os\ntry:\n    os.listdir({other!r})\n"
                           "except PermissionError as exc:\n    print('DENIED', exc.errno)")
    assert "DENIED 13" in out, (out, err)
    # Learner A's hung collective (rank 0 alone in an all_reduce) leaves B's cells running.
    hang = threading.Thread(target=lambda: report.__setitem__("hang", labs[0].run(HANG)))
    hang.start()
    time.sleep(3)
    t2 = time.monotonic()
    out, err = labs[1].run(ALL_REDUCE)
    b_took = time.monotonic() - t2
    assert hang.is_alive() and out.count("SUM 3") == 2, (out, err)
    hang.join(120)
    print(f"while A's collective hung, B's all_reduce took {b_took:.1f} s; A got "
          f"{report['hang'][0].strip()}")
    assert "HUNG ClusterTimeout" in report["hang"][0], report["hang"]
    # A fork bomb in B's lab stops at B's process limit (the hub's prlimit), and B's own
    # cluster still answers after it.
    bomb, err = labs[1].run(FORK_BOMB)
    print(bomb.strip())
    assert re.search(r"^NPROC 300 forked \d+ then BlockingIOError", bomb, re.M), (bomb, err)
    out, err = labs[1].run(ALL_REDUCE)
    assert out.count("SUM 3") == 2, (out, err)
    # B's lab, kernel and what they start share B's memory group (the hub's [hub] max_memory,
    # 2G here): a child that takes 3 GiB is ended by the OOM killer there; B's kernel and A's
    # answer after it.
    hog, err = labs[1].run(MEMORY_HOG)
    print(hog.strip())
    assert re.search(rf"^GROUP /course-labs/{rig.learners[1]} HOG ended by -9$", hog, re.M), (
        hog, err)
    out, err = labs[0].run(MEMORY_HOG.replace("3 << 30", "1 << 20"))
    assert re.search(rf"^GROUP /course-labs/{rig.learners[0]} HOG ended by 0$", out, re.M), (
        out, err)
    for lab in labs[:4]:
        lab.run("cu.stop()")


#: A learner's memory hog, in a child of their kernel: which memory group the kernel is in,
#: and how the child ended.
MEMORY_HOG = """
import os, subprocess, sys
from course_utils.workshop.lab_limits import group_of
done = subprocess.run([sys.executable, "-c", "b = b'x' * (3 << 30)"], timeout=120)
print("GROUP", group_of(os.getpid()), "HOG ended by", done.returncode)
"""


HANG = """
def only_rank0_reduces():
    import torch
    import torch.distributed as dist
    t = torch.ones(1)
    if dist.get_rank() == 0:
        dist.all_reduce(t)
    return t.item()

from course_utils.errors import ClusterTimeout
try:
    cluster.run(only_rank0_reduces, timeout=15)
except ClusterTimeout:
    print("HUNG ClusterTimeout")
"""


#: A learner's fork bomb, in a small child of their kernel (it inherits the lab's limit):
#: children that sleep until a fork fails, then all killed.
FORK_BOMB = r'''
import subprocess, sys
code = """
import os, resource, signal, time
soft = resource.getrlimit(resource.RLIMIT_NPROC)[0]
kids, said = [], "no limit reached"
try:
    for _ in range(2000):
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        kids.append(pid)
except OSError as exc:
    said = type(exc).__name__
for pid in kids:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
print("NPROC", soft, "forked", len(kids), "then", said)
"""
print(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                     timeout=120).stdout)
'''


#: The hostile learner's cell after unit 0's set-up (tests/submissions.py's probe start).
HOSTILE = r'''
_try("read ann's notebook", lambda: open("ANN").read(16))
_try("list submissions", lambda: os.listdir(os.path.join(root, "submitted")) or 1 / 0)
_try("write beside gradebook", lambda: open(os.path.join(root, "pwned.txt"), "w").write("x"))
'''


def test_the_instructor_collects_every_learners_unit0_and_grades_it_sandboxed_in_two_jobs(
        rig, running):
    import copy

    from course_utils.assignments.lessons import NOTEBOOK_DIR
    from course_utils.assignments.release import read_nb
    from course_utils.instructor.autograde import grade
    from course_utils.workshop.collect import collect_work
    from tests.rigs.common import require_bwrap
    from tests.rigs.hub import LearnerLab
    from tests.rigs.twohosts import IFNAME
    from tests.submissions import (
        PROBE_PREAMBLE,
        insert_after,
        probe_verdicts,
        solved,
        swap_helpers,
    )

    require_bwrap()
    ws, token, base = running
    course = base / "course"
    unit0 = "00_cluster_tour.ipynb"
    full = solved(read_nb(course / "release" / "unit0" / unit0), read_nb(NOTEBOOK_DIR / unit0))
    ann, ben, cat, dan = rig.learners[:4]
    ann_copy = Path(pwd.getpwnam(ann).pw_dir) / "course" / "unit0" / unit0
    probes = PROBE_PREAMBLE + HOSTILE.replace("ANN", str(ann_copy))
    hand_in = {ann: full,                                     # right: full marks
               ben: None,                                     # the release as it came
               cat: swap_helpers(copy.deepcopy(full)),        # swaps the helpers ex2 calls
               dan: insert_after(copy.deepcopy(full), "setup", probes)}
    for user, nb in hand_in.items():  # each saves through their own lab, as a browser does
        lab = LearnerLab(ws.hub_url, user, token)
        lab.login()
        lab.start_lab()
        if nb is not None:
            lab.save(f"unit0/{unit0}", nb)
    assert ann_copy.stat().st_uid == pwd.getpwnam(ann).pw_uid  # written by ann's own lab
    from course_utils.cli import build_parser

    collect, graded = (build_parser().parse_args(shlex.split(s)[1:]) for s in runbook()[5:7])
    assert (collect.file, collect.rest, collect.unit) == ("collect", ["workshop.toml"], [0])
    assert (base / collect.course).resolve() == course == (base / graded.submissions).resolve()
    got = collect_work(rig.workshop(learners=rig.learners[:4], interface=IFNAME), course,
                       collect.unit)
    print(got.table())
    assert sorted(got.notebooks) == sorted(hand_in) and got.missing == []
    t0 = time.monotonic()
    res = grade(course, course=course, units=graded.unit, jobs=graded.jobs, sandbox=True,
                cell_timeout=180)
    took = time.monotonic() - t0
    print(res.table())
    print(f"course grade --jobs 2 --sandbox: {len(res.notebooks)} notebooks in {took:.1f} s")
    if os.environ.get("COURSE_BENCH_SERIAL"):  # the same class in one job, for the note
        t1 = time.monotonic()
        serial = grade(course, course=course, units=[0], jobs=1, sandbox=True, cell_timeout=180)
        print(f"course grade --jobs 1 --sandbox: {time.monotonic() - t1:.1f} s; same scores: "
              f"{[g.score for g in serial.notebooks] == [g.score for g in res.notebooks]}")
    score = {g.student: g for g in res.notebooks}
    assert (score[ann].score, score[ann].max_score) == (6, 6), score[ann]
    assert score[ben].score == 0, score[ben]
    assert score[cat].score == 4, score[cat]  # ex2-test did not run: its helpers were swapped
    why = {q.question: q.reason for q in score[cat].questions}
    assert why["ex2-test"].startswith("ReplacedHelper"), why
    # dan's attempts were denied, the notebook still earned its marks, and the grader noted it
    tried = probe_verdicts(read_nb(course / "autograded" / dan / "unit0" / unit0))
    print(tried, score[dan].notes)
    assert tried == {"read ann's notebook": "DENIED", "list submissions": "DENIED",
                     "write beside gradebook": "DENIED"}, tried
    assert score[dan].score == 6 and not (course / "pwned.txt").exists()
    note = "; ".join(score[dan].notes)
    assert note.startswith("tried what the sandbox denies: ") and str(ann_copy) in note, note


def test_a_learner_logs_in_in_chromium_and_runs_unit0_through_the_hub(rig, running):
    """The login page, the lab the hub spawns, and unit 0 run from its Run menu, in headless
    Chromium, as a learner at the workshop does (their ranks on both hosts, through Slurm)."""
    from course_utils.assignments.lessons import NOTEBOOK_DIR
    from course_utils.assignments.release import read_nb
    from tests.rigs import browser
    from tests.rigs.hub import LearnerLab
    from tests.submissions import solved

    browser.require_chromium()
    ws, token, base = running
    user = rig.learners[4]
    password = rig.set_password(user)
    unit0 = "00_cluster_tour.ipynb"
    with browser.headless_chromium(allow_hosts=[ws.hub.address]) as driver:
        t0 = time.monotonic()
        driver.get(f"{ws.hub_url}/hub/login")
        browser.wait_for(driver, "#username_input", 60, "the hub's login page")
        browser.screenshot(driver, "workshop-1-login")
        driver.find_element("css selector", "#username_input").send_keys(user)
        driver.find_element("css selector", "#password_input").send_keys(password)
        driver.find_element("css selector", "#login_submit").click()
        browser.wait_for(driver, lambda d: f"/user/{user}/lab" in d.current_url
                         and d.find_elements("css selector", "#jp-main-dock-panel"), 420,
                         "the learner's JupyterLab after login")
        print(f"login page to the learner's lab: {time.monotonic() - t0:.1f} s")
        browser.screenshot(driver, "workshop-2-lab")
        lab = LearnerLab(ws.hub_url, user, token)
        lab.login()
        # Render every cell (JupyterLab skips off-screen ones), as the learner's own setting.
        code, _ = hub_call_lab(lab, "/lab/api/settings/@jupyterlab/notebook-extension:tracker",
                               {"raw": json.dumps({"windowingMode": "none"})})
        assert code in (200, 204), code
        release = base / "course" / "release" / "unit0" / unit0
        lab.save(f"unit0/{unit0}", solved(read_nb(release), read_nb(NOTEBOOK_DIR / unit0)))
        driver.get(f"{ws.hub_url}/user/{user}/lab/tree/unit0/{unit0}?reset")
        browser.wait_for(driver, lambda d: d.find_elements(
            "css selector", f"{browser.NOTEBOOK_PANEL_CSS} .jp-Notebook .jp-Cell"), 120,
            "unit 0 to show its cells")
        browser.wait_kernel_idle(driver, 180)
        t1 = time.monotonic()
        cells = browser.run_all_cells(driver, timeout=420)
        print(f"unit 0, Run All Cells through the hub: {time.monotonic() - t1:.1f} s")
        browser.scroll_to_cell(driver, -1)
        browser.screenshot(driver, "workshop-3-unit0-end")
        assert browser.problems(cells) == [], "\n".join(browser.problems(cells))
        hello = next(c for c in cells
                     if c.source.startswith("%%px") and "rank {rank} of" in c.source)
        for r, host in enumerate(("rig-a", "rig-b")):  # one rank on each host
            assert re.search(rf"\[rank {r}, engine \d+\] rank {r} of 2 on {host}",
                             hello.text), hello.text


def hub_call_lab(lab, path: str, body: dict) -> tuple[int, dict]:
    """PUT ``body`` to ``path`` of the learner's lab server (not its /api)."""
    from course_utils.workshop.check import hub_call

    return hub_call(f"{lab.hub_url}/user/{lab.user}{path}", lab.token, "PUT", body, 60)
