"""The checks of ``course workshop check`` about the hosts' set-up beyond Slurm's basics: Slurm
fences a job to the GPUs it was given and limits how many GPUs one learner may hold (the lines
``course workshop`` writes into ``slurm-workshop.conf`` and ``cgroup.conf``), the hub's TLS
(learners type their passwords into it), and the grader's sandbox (bubblewrap) on this host."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

from ..cluster.launchers.slurm import SlurmError, parse_job, run_command
from .check_line import Line
from .plan import Workshop

#: Where Slurm's clients look for their configuration when ``SLURM_CONF`` is not set.
DEFAULT_SLURM_CONF = "/etc/slurm/slurm.conf"


def slurm_config() -> dict[str, str]:
    """``scontrol show config`` as key -> value."""
    out = {}
    for line in run_command(["scontrol", "show", "config"], timeout=15).splitlines():
        key, sep, value = line.partition(" = ")
        if sep:
            out[key.strip()] = value.strip()
    return out


def fencing_gaps(config: dict[str, str], cgroup_conf: str, partition: dict[str, str]
                 ) -> list[str]:
    """What is missing for a learner's job to be held to its share: ``config`` from
    :func:`slurm_config`, ``cgroup_conf`` the text of cgroup.conf ("" when there is none),
    ``partition`` the workshop partition's ``scontrol show partition`` fields."""
    gaps = []
    task = config.get("TaskPlugin", "?")
    if "task/cgroup" not in task:
        gaps.append(f"TaskPlugin={task}: a learner's ranks can open every GPU of their host")
    track = config.get("ProctrackType", "?")
    if track != "proctrack/cgroup":
        gaps.append(f"ProctrackType={track}: a job's processes can outlive it")
    said = {k.lower(): v.lower() for k, v in  # Slurm reads its keys in any case
            re.findall(r"^\s*(Constrain\w+)\s*=\s*(\S+)", cgroup_conf, re.M | re.I)}
    if said.get("constraindevices") != "yes":
        gaps.append("cgroup.conf lacks ConstrainDevices=yes")
    enforce = config.get("AccountingStorageEnforce", "none")
    qos = partition.get("QoS", "N/A")
    if qos in ("", "N/A") or not {"limits", "qos"} & set(enforce.split(",")):
        gaps.append(f"no QOS limit per learner (partition QoS={qos}, AccountingStorageEnforce="
                    f"{enforce}): one learner can queue jobs for every GPU")
    return gaps


def check_fencing(ws: Workshop) -> Line:
    name = "fencing and limits"
    conf = Path(os.environ.get("SLURM_CONF") or DEFAULT_SLURM_CONF)
    try:
        cgroup_conf = (conf.parent / "cgroup.conf").read_text()
    except OSError:
        cgroup_conf = ""
    try:
        text = run_command(["scontrol", "-o", "show", "partition", ws.partition], timeout=15)
    except SlurmError:  # no such partition: the partition check names it and its fix
        text = ""
    partition = parse_job(text).fields
    gaps = fencing_gaps(slurm_config(), cgroup_conf, partition)
    if gaps:
        return Line(name, "FAIL", "; ".join(gaps),
                    "merge the fencing and QOS lines of <out>/slurm-workshop.conf into "
                    f"{conf} and <out>/cgroup.conf beside it (docs/instructor.md, workshop "
                    "step 2), then restart slurmctld and every slurmd")
    return Line(name, "PASS", f"jobs fenced to their GPUs (task/cgroup, ConstrainDevices), "
                f"partition {ws.partition} under QOS {partition.get('QoS')}")


def check_sandbox(ws: Workshop) -> Line:
    """``course grade`` runs each learner's notebook under bubblewrap: it must start here."""
    from ..errors import CourseError
    from ..instructor.sandbox import bwrap, sandbox_argv

    name = "grading sandbox"
    try:
        exe = bwrap()
    except CourseError as exc:
        return Line(name, "FAIL", exc.cause, exc.fix)
    with tempfile.TemporaryDirectory() as tmp:
        argv = sandbox_argv(hide=[], writable=[tmp], readable=[], env={}, cwd=tmp)
        try:
            done = subprocess.run([*argv, "true"], capture_output=True, text=True,
                                  timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            done = subprocess.CompletedProcess([], 1, "", str(exc))
    if done.returncode != 0:
        return Line(name, "FAIL", f"{exe} cannot start a sandbox here: "
                    f"{(done.stderr.strip().splitlines() or ['?'])[-1]}",
                    "let unprivileged user namespaces run (sysctl kernel.unprivileged_userns_clone"
                    "=1; on Ubuntu 24.04 also an AppArmor profile for bwrap), or grade as root")
    return Line(name, "PASS", f"{exe} starts a sandbox: `course grade` hides the gradebook and "
                "every other learner's work from each graded notebook")


def check_tls(ws: Workshop) -> Line:
    """The hub's certificate and key (``[hub] ssl_cert``/``ssl_key``): readable here, the key
    closed to others, the two a pair. Without them a WARN: passwords cross the network in
    clear. Whether a browser trusts the certificate is the "hub" check's (it connects)."""
    import ssl

    name = "TLS"
    if not ws.ssl_cert:
        return Line(name, "WARN", f"the hub serves the learners' login over plain http "
                    f"({ws.hub_url}): their passwords cross the network unencrypted",
                    f"set ssl_cert and ssl_key under [hub] in the workshop file (a certificate "
                    f"for {ws.hub.address}) and run `course workshop` again, or run the "
                    "workshop on a network only the class reaches")
    fix = "give [hub] ssl_cert and ssl_key of one pair, the key readable by root only"
    for path in (ws.ssl_cert, ws.ssl_key):
        if not os.access(path, os.R_OK):
            return Line(name, "FAIL", f"{path} cannot be read here (run the check on the hub "
                        "host, as root)", fix)
    mode = os.stat(ws.ssl_key).st_mode & 0o777
    if mode & 0o077:
        return Line(name, "FAIL", f"the key {ws.ssl_key} is open to others (mode {mode:o})",
                    f"chmod 600 {ws.ssl_key}")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(ws.ssl_cert, ws.ssl_key)
    except (ssl.SSLError, OSError) as exc:
        return Line(name, "FAIL", f"{ws.ssl_cert} and {ws.ssl_key} are not a pair ({exc})", fix)
    return Line(name, "PASS", f"the hub serves {ws.hub_url} with {ws.ssl_cert}")


def check_lab_memory(ws: Workshop) -> Line:
    """Each lab starts in a memory cgroup of the learner's (``[hub] max_memory``): the
    controller is mounted here and this process (root, as the hub) can make such a group."""
    from .lab_limits import CGROUP_ROOT, PARENT, memory_controller, prepare_group

    name = "lab memory"
    if not ws.max_memory:
        return Line(name, "WARN", "[hub] max_memory = 0: a learner's lab and kernels may take "
                    "all of this host's memory", 'set [hub] max_memory (e.g. "8G")')
    found = memory_controller()
    if found is None:
        return Line(name, "FAIL", f"no cgroup memory controller is mounted under {CGROUP_ROOT}",
                    "mount cgroup v2 with its memory controller (systemd hosts have it), or "
                    "set [hub] max_memory = 0 and accept the risk")
    probe = "course-check"
    try:
        procs = prepare_group(probe, ws.max_memory)
        limit = (procs.parent / found[1]).read_text().strip()
        procs.parent.rmdir()
    except OSError as exc:
        return Line(name, "FAIL", f"cannot make a learner's group under {found[0]}: {exc}",
                    "run the hub and this check as root")
    return Line(name, "PASS", f"each learner's lab and kernels share {ws.max_memory / 2**30:.1f} "
                f"GiB ({PARENT}/<learner>, {found[1]} = {limit})")
