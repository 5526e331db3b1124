"""Engines as a Slurm job: the batch script, Slurm's own words, and a job stuck in the queue.

No notebook calls this module: ``COURSE_PROFILE=profiles/slurm.toml`` (docs/instructor.md)
makes the same ``cu.start()`` of ``00_cluster_tour`` keep the controller in the kernel's
process and submit the engines as one Slurm job through ipyparallel's Slurm launcher: one task
per engine, ``srun`` starts them, each engine reports ``SLURM_PROCID`` / ``SLURM_LOCALID`` /
``SLURM_NODEID`` (:func:`course_utils.cluster.engines.engine.slurm_facts`) and the rank map
follows them (:func:`course_utils.cluster.ranks.slurm_rank_map`: rank = ``SLURM_PROCID``).
``cu.stop()`` cancels the job (``scancel``).

While ``cu.start()`` waits for the engines,
:func:`course_utils.cluster.launchers.slurm_queue.engines_problem` asks Slurm about the job
(``scontrol``, at most every :data:`POLL_S` seconds) and :func:`job_error` turns what it hears
into a
:class:`SlurmJobError` naming the job id, its state and Slurm's reason, with a Fix line:

* a job pending for a reason that cannot clear by waiting (:data:`NEVER_STARTS`, e.g.
  ``PartitionConfig``: more CPUs per engine than any node has) fails at once;
* a job pending for a reason that may clear (``Resources``, ``Priority``) fails when the start
  timeout is over;
* a job that ended before its engines registered fails at once, with the end of its output.

The batch script goes to the IPython profile directory (``slurm_engine-<cluster id>.sbatch``),
not to the current directory as ipyparallel's default does.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ipyparallel.cluster.launcher import SlurmEngineSetLauncher

from ...errors import CourseError, EnginesDidNotStart

if TYPE_CHECKING:

    from ..profiles import ClusterProfile, SlurmSpec

POLL_S = 1.0
"""Seconds between two looks at a job's state while waiting for its engines."""

COMMAND_TIMEOUT_S = 30.0
"""Longest a Slurm client command (sbatch, scontrol, scancel) may take before we give up."""

TERMINAL_STATES = frozenset({
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
    "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED",
})
"""Job states after which the job's engines will never register."""

REASONS: dict[str, tuple[str, str]] = {
    # reason: (what it means, what to do)
    "PartitionConfig": (
        "the request does not fit the partition's nodes (more CPUs, GPUs or memory per engine "
        "than a node has, or more nodes than the partition has)",
        "ask for less in the profile's [slurm] table (cpus_per_engine, gpus_per_engine, nodes) "
        "or fewer engines; `sinfo -p {partition} -o '%P %D %c %G %m'` shows what a node has"),
    "PartitionTimeLimit": (
        "the time asked for is over the partition's limit",
        "lower [slurm] time in the profile; `sinfo -p {partition} -o '%P %l'` shows the limit"),
    "PartitionNodeLimit": (
        "the job asks for more nodes than the partition allows",
        "lower [slurm] nodes or the engine count in the profile"),
    "PartitionDown": ("the partition is down", "pick another partition, or ask the admins"),
    "PartitionInactive": ("the partition is inactive", "pick another partition"),
    "BadConstraints": ("the constraints can never be met",
                       "remove or fix the --constraint in [slurm] options"),
    "InvalidAccount": ("the account is invalid", "set [slurm] account to one of yours "
                       "(`sacctmgr show assoc user=$USER format=account`)"),
    "InvalidQOS": ("the QOS is invalid", "fix or remove [slurm] qos"),
    "AccountNotAllowed": ("the account may not use this partition",
                          "pick the partition your account is for, or another account"),
    "QOSNotAllowed": ("the QOS may not use this partition", "fix or remove [slurm] qos"),
    "DependencyNeverSatisfied": ("a dependency can never be satisfied",
                                 "remove the --dependency from [slurm] options"),
    "JobHeldUser": ("the job is held", "`scontrol release <job id>`, or start again"),
    "JobHeldAdmin": ("an administrator holds the job", "ask the admins"),
    "Resources": ("the nodes it needs are busy with other jobs",
                  "wait and try again, ask for less, or raise $COURSE_START_TIMEOUT to wait "
                  "longer; `squeue -p {partition}` shows what runs"),
    "Priority": ("jobs of higher priority are ahead in the queue",
                 "wait and try again, or raise $COURSE_START_TIMEOUT to wait longer"),
    "ReqNodeNotAvail": ("a node it needs is down, drained or reserved",
                        "`sinfo -p {partition} -R` says why; ask for less or another partition"),
    "Reservation": ("the job waits for its reservation to start",
                    "start later, or remove the --reservation option"),
    "BeginTime": ("the job's start time is in the future", "remove the --begin option"),
    "Dependency": ("the job waits for another job", "remove the --dependency option"),
}
"""What Slurm's pending reasons mean to a learner, and the fix; ``{partition}`` is filled in."""

NEVER_STARTS = frozenset({
    "PartitionConfig", "PartitionTimeLimit", "PartitionNodeLimit", "PartitionDown",
    "PartitionInactive", "BadConstraints", "InvalidAccount", "InvalidQOS", "AccountNotAllowed",
    "QOSNotAllowed", "DependencyNeverSatisfied", "JobHeldUser", "JobHeldAdmin",
})
"""Pending reasons that waiting does not clear: ``cu.start()`` fails at once."""

_SUBMIT_ERRORS: tuple[tuple[str, str], ...] = (
    # (substring of Slurm's message, the fix)
    ("invalid partition", "set [slurm] partition to one that `sinfo -s` lists"),
    ("invalid account", "set [slurm] account to one of yours "
                        "(`sacctmgr show assoc user=$USER format=account`)"),
    ("invalid qos", "fix or remove [slurm] qos"),
    ("invalid generic resource", "the partition has no GPUs Slurm knows of: set "
                                 "gpus_per_engine = 0 or pick a GPU partition"),
    ("requested node configuration is not available",
     "ask for fewer CPUs/GPUs per engine or fewer engines (`sinfo -o '%P %c %G'`)"),
    ("time limit", "lower [slurm] time to the partition's limit (`sinfo -o '%P %l'`)"),
    ("unable to contact slurm controller", "the scheduler does not answer: is slurmctld up "
                                           "(`scontrol ping`) and SLURM_CONF right?"),
    ("could not establish a configuration source", "Slurm finds no configuration: set "
                                                   "SLURM_CONF, or run this on a login node"),
    ("socket timed out", "the scheduler is slow or down: `scontrol ping`, then retry"),
    ("munge", "munged is not running or its key differs from the cluster's: ask the admins"),
)


class SlurmError(CourseError):
    """A Slurm command failed (not installed, no answer, or an error from the scheduler)."""


class SlurmJobError(EnginesDidNotStart):
    """The engines' Slurm job is stuck in the queue, or ended before its engines registered."""


def explain(message: str) -> str:
    """The fix for a Slurm client's error message (sbatch, srun, sinfo ...)."""
    low = message.lower()
    for needle, fix in _SUBMIT_ERRORS:
        if needle in low:
            return fix
    return ("read Slurm's message above; `course doctor --profile <your slurm profile>` checks "
            "the scheduler step by step")


def run_command(args: list[str], timeout: float = COMMAND_TIMEOUT_S,
                env: dict[str, str] | None = None, check: bool = True) -> str:
    """Run a Slurm client command; its standard output. A clear :class:`SlurmError` when the
    program is missing, does not answer within ``timeout`` s, or (with ``check``) fails."""
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env,
                              stdin=subprocess.DEVNULL, check=False)
    except FileNotFoundError:
        raise SlurmError(f"`{args[0]}` is not installed here",
                         "run this on the cluster's login node, or load Slurm "
                         "(`module load slurm`); Debian: apt-get install slurm-client") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"`{shlex.join(args)}` did not answer within {timeout:g} s",
                         "the scheduler is down or unreachable: `scontrol ping`") from None
    if check and done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip() or "no output")
        raise SlurmError(f"`{shlex.join(args)}` failed ({done.returncode}): {said}",
                         explain(said))
    return done.stdout


# ---- the batch script -----------------------------------------------------------------------
def _literal(text: str) -> str:
    """``text`` safe inside ipyparallel's template (braces doubled), on one line."""
    if "\n" in text or "\r" in text:
        raise CourseError(f"Slurm option {text!r} spans lines", "give each option on one line")
    return text.replace("{", "{{").replace("}", "}}")


def sbatch_options(spec: SlurmSpec | None) -> list[str]:
    """The profile's ``#SBATCH`` options (partition, time, CPUs/GPUs per engine, account ...)."""
    if spec is None:
        return []
    opts = []
    for flag, value in (("--partition", spec.partition), ("--time", spec.time),
                        ("--account", spec.account), ("--qos", spec.qos),
                        ("--nodes", spec.nodes), ("--cpus-per-task", spec.cpus_per_engine),
                        ("--gpus-per-task", spec.gpus_per_engine or None)):
        if value is not None:
            opts.append(f"{flag}={value}")
    return opts + list(spec.options)


def batch_template(spec: SlurmSpec | None) -> str:
    """ipyparallel's batch template for the engines' job: one task per engine, ``srun``
    starts them. ``{n}``, ``{cluster_id}``, ``{output_file}`` and ``{program_and_args}`` are
    filled in by ipyparallel."""
    lines = ["#!/bin/sh",
             "#SBATCH --export=ALL",
             "#SBATCH --job-name=ipengine-{cluster_id}",  # job_name()
             "#SBATCH --ntasks={n}",
             *(f"#SBATCH {_literal(opt)}" for opt in sbatch_options(spec)),
             "#SBATCH --output={output_file}"]
    srun = ["srun", "--kill-on-bad-exit=1"]
    if spec is not None and spec.cpus_per_engine:
        # Slurm 22.05+: srun no longer inherits the batch job's --cpus-per-task.
        srun.append(f"--cpus-per-task={spec.cpus_per_engine}")
    lines.append(" ".join(srun) + " {program_and_args}")
    return "\n".join(lines) + "\n"


class SlurmEngines(SlurmEngineSetLauncher):
    """ipyparallel's Slurm engine launcher, writing its batch script into the profile
    directory, and turning sbatch/scancel failures into :class:`SlurmError` s."""

    # How the cluster file names this class, so `course stop` can cancel the job later.
    entrypoint_name = "course_utils.cluster.launchers.slurm.SlurmEngines"

    def __init__(self, work_dir: str = ".", config: Any = None, **kwargs: Any) -> None:
        super().__init__(work_dir=work_dir, config=config, **kwargs)
        self.batch_file = str(batch_file(self.profile_dir, self.cluster_id))
        self.submitted_at: float | None = None

    def _run_command(self, command: list[str], **kwargs: Any) -> str:
        return run_command(list(command), env=kwargs.get("env"))

    def start(self, n: int = 1) -> str:
        self.submitted_at = time.monotonic()
        return super().start(n)

    def stop(self) -> str:
        if not self.job_id:  # sbatch failed: there is no job to cancel
            self.notify_stop({"job_id": "", "output": ""})
            return ""
        try:
            output = self._run_command(self.delete_command + [self.job_id])
        except SlurmError as exc:  # the job already ended: nothing to cancel
            output = str(exc)
        self.notify_stop({"job_id": self.job_id, "output": output})
        return output


def job_name(cluster_id: str) -> str:
    """The Slurm job name of a cluster's engines (``#SBATCH --job-name`` above)."""
    return f"ipengine-{cluster_id or 'default'}"


def cancel_own_jobs(cluster_id: str) -> list[str]:
    """Cancel this user's engine jobs of ``cluster_id`` (a start that died before the kernel
    knew its job, e.g. a killed kernel); the ids cancelled. Slurm lets a user cancel only
    their own jobs, and ``--user`` keeps the listing to them too."""
    import getpass

    try:
        listed = run_command(["squeue", "-h", f"--user={getpass.getuser()}",
                              f"--name={job_name(cluster_id)}", "-o", "%i"], timeout=10)
    except SlurmError:  # no Slurm here, or it does not answer: nothing we could cancel
        return []
    ids = listed.split()
    if ids:
        run_command(["scancel", *ids], timeout=15, check=False)
    return ids


def batch_file(profile_dir: str | os.PathLike[str], cluster_id: str) -> Path:
    """Where the engines' batch script is written: the IPython profile directory."""
    return Path(profile_dir) / f"slurm_engine-{cluster_id or 'default'}.sbatch"


def cluster_kwargs(prof: ClusterProfile) -> dict[str, Any]:
    """``ipyparallel.Cluster`` arguments for a slurm profile: the controller listens on the
    profile's ``controller_ip`` (in this process), the engines are a Slurm job."""
    from traitlets.config import Config

    cfg = Config()
    cfg.SlurmEngines.batch_template = batch_template(prof.slurm)
    if prof.engine_python:
        cfg.SlurmEngines.engine_cmd = [prof.engine_python, "-m", "ipyparallel.engine"]
    return {"engines": SlurmEngines, "controller_ip": prof.controller_ip,
            "controller_location": prof.controller_ip, "config": cfg}


# ---- the job's state ------------------------------------------------------------------------
@dataclass(frozen=True)
class JobStatus:
    """One ``scontrol -o show job`` record, with the fields a learner needs named."""

    job_id: str
    state: str
    reason: str
    fields: dict[str, str] = field(default_factory=dict)

    @property
    def partition(self) -> str:
        return self.fields.get("Partition", "?")

    def summary(self) -> str:
        """``"PENDING (reason PartitionConfig)"``."""
        return f"{self.state} (reason {self.reason})" if self.reason != "None" else self.state


def parse_job(record: str, job_id: str = "?") -> JobStatus:
    """A :class:`JobStatus` from a one-line ``scontrol -o show job`` record ("" -> UNKNOWN)."""
    fields: dict[str, str] = {}
    last = None
    for token in record.split():
        key, sep, value = token.partition("=")
        if sep and re.fullmatch(r"[A-Za-z][\w/:]*", key):
            fields[key] = value
            last = key
        elif last is not None:  # a value with spaces (a path, a comment)
            fields[last] += " " + token
    return JobStatus(job_id=fields.get("JobId", job_id),
                     state=fields.get("JobState", "UNKNOWN"),
                     reason=fields.get("Reason", "None"), fields=fields)


def job_status(job_id: str, timeout: float = 10.0) -> JobStatus:
    """What Slurm says about a job now; state ``UNKNOWN`` once it forgot the job."""
    try:
        record = run_command(["scontrol", "-o", "show", "job", str(job_id)], timeout=timeout)
    except SlurmError:
        record = ""
    return parse_job(record.strip().splitlines()[0] if record.strip() else "", str(job_id))


def _tail(path: str, lines: int = 15) -> str:
    try:
        text = Path(path).read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return f"(no output file {path})"
    return "\n".join(text) if text else f"(the output file {path} is empty)"


def job_error(status: JobStatus, registered: int, n: int, waited: float,
              timed_out: bool) -> SlurmJobError | None:
    """The error for a job whose engines have not all registered, or None to keep waiting."""
    job = f"Slurm job {status.job_id}"
    partition = status.partition
    reason = status.reason
    meaning, fix = REASONS.get(reason, ("", ""))
    fix = fix.format(partition=partition)
    asked = (f"asks {status.fields.get('NumTasks', '?')} tasks x "
             f"{status.fields.get('CPUs/Task', '?')} CPUs (TRES {status.fields.get('TRES', '?')})"
             f" in partition {partition}")
    if status.state == "PENDING" and (reason in NEVER_STARTS or timed_out):
        why = f": {meaning}" if meaning else ""
        when = "waiting will not help" if reason in NEVER_STARTS else f"after {waited:.0f} s"
        return SlurmJobError(
            f"{job} (the engines) is still PENDING, reason {reason}{why}; {when}. It {asked}. "
            "cu.start() cancelled the job",
            fix or "`squeue -j <id> -o %r` and `scontrol show job <id>` say more; ask for less "
                   "or raise $COURSE_START_TIMEOUT")
    if status.state in TERMINAL_STATES:
        out = status.fields.get("StdOut", "")
        return SlurmJobError(
            f"{job} (the engines) ended {status.summary()}, exit code "
            f"{status.fields.get('ExitCode', '?')}, after {registered} of {n} engines "
            f"registered. End of the job's output ({out}):\n{_tail(out)}",
            "read the output above: a missing python (engine_python in the profile) or an "
            "engine that cannot reach controller_ip are the usual causes")
    if timed_out:
        return SlurmJobError(
            f"{job} is {status.summary()} on {status.fields.get('NodeList', '?')}, but only "
            f"{registered} of {n} engines registered in {waited:.0f} s",
            "the nodes must reach the controller at the profile's controller_ip; the job's "
            f"output is in {status.fields.get('StdOut', '?')}")
    return None
