"""The engines' Slurm job while ``cu.start()`` waits for it: stuck, ended, or in the queue,
and then who holds the GPUs it waits for, and for how long (a workshop with more learners
than GPUs).

:func:`engines_problem` is the hook of the wait for engines (launching.py). A job that
waits in the queue (:data:`QUEUED_REASONS`) gets :func:`queue_message` printed once, in the
learner's cell; when the wait runs out, the error ends with it too. The holders come from one
``scontrol -o show jobs`` (every job, one line each), parsed like
:func:`course_utils.cluster.launchers.slurm.parse_job`; nothing here needs accounting (``sacct``).
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from ipyparallel.cluster.launcher import SlurmEngineSetLauncher

from .slurm import (
    POLL_S,
    JobStatus,
    SlurmError,
    SlurmJobError,
    job_error,
    job_status,
    parse_job,
    run_command,
)

if TYPE_CHECKING:
    import ipyparallel as ipp

#: Pending reasons that clear by themselves once other jobs end: the job is in the queue.
#: (Right after submission the reason is "None" until the scheduler looked at the job.)
QUEUED_REASONS = frozenset({"Resources", "Priority"})


@dataclass(frozen=True)
class Holder:
    """A running job that holds GPUs (or GPU shards)."""

    job_id: str
    user: str
    gpus: str          # "2 GPUs", "1 GPU shard"
    nodes: str
    run_time: str
    left: str          # "3:47:57" or "?" (no time limit)


_GRES = re.compile(r"(?:gres[:/])?(gpu|shard)(?::[\w.-]+)?[:=](\d+)")


def _count(text: str) -> dict[str, int]:
    return {kind: int(n) for kind, n in _GRES.findall(text or "")}


def _gpus(fields: dict[str, str]) -> str:
    """``"2 GPUs"`` held by a job: from its TRES (``gres/gpu=2``, when accounting counts GPUs),
    else from what it asked per job, per node or per task (``TresPerTask=gres:gpu:1``)."""
    counts = _count(fields.get("AllocTRES", "")) or _count(fields.get("TRES", ""))
    if not counts:
        for key, times in (("TresPerJob", "1"), ("TresPerNode", fields.get("NumNodes", "1")),
                           ("TresPerTask", fields.get("NumTasks", "1"))):
            per = _count(fields.get(key, ""))
            if per:
                n = int(times) if times.isdigit() else 1
                counts = {k: v * n for k, v in per.items()}
                break
    for kind, word in (("gpu", "GPU"), ("shard", "GPU shard")):
        if counts.get(kind):
            n = counts[kind]
            return f"{n} {word}{'s' if n != 1 else ''}"
    return ""


def _left(end: str, now: datetime) -> str:
    try:
        seconds = int((datetime.fromisoformat(end) - now).total_seconds())
    except ValueError:
        return "?"
    seconds = max(0, seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def holders(jobs: list[JobStatus], now: datetime | None = None,
            partition: str | None = None) -> list[Holder]:
    """The running jobs of ``jobs`` that hold GPUs, soonest to end first."""
    now = now or datetime.now()
    found = []
    for job in jobs:
        f = job.fields
        gpus = _gpus(f)
        if job.state != "RUNNING" or not gpus:
            continue
        if partition and f.get("Partition") != partition:
            continue
        user = f.get("UserId", "?").split("(")[0]
        found.append(Holder(job.job_id, user, gpus, f.get("NodeList", "?"),
                            f.get("RunTime", "?"), _left(f.get("EndTime", ""), now)))
    return sorted(found, key=lambda h: (h.left == "?", h.left.zfill(12)))


def all_jobs(timeout: float = 10.0) -> list[JobStatus]:
    """Every job Slurm knows now (empty when it does not answer)."""
    try:
        text = run_command(["scontrol", "-o", "show", "jobs"], timeout=timeout, check=False)
    except SlurmError:
        return []
    return [parse_job(line) for line in text.splitlines() if line.startswith("JobId=")]


def place_in_line(job: JobStatus, jobs: list[JobStatus]) -> int:
    """1 for the first pending job of its partition, 2 for the next ..."""
    ahead = [j for j in jobs if j.state == "PENDING" and j.partition == job.partition
             and j.job_id.isdigit() and job.job_id.isdigit() and int(j.job_id) < int(job.job_id)]
    return len(ahead) + 1


def queue_message(job: JobStatus, jobs: list[JobStatus] | None = None,
                  now: datetime | None = None) -> str:
    """What a learner reads while their engines' job waits: the job, its place in line, and
    who holds the GPUs for how long (at most: each job's time limit)."""
    jobs = all_jobs() if jobs is None else jobs
    held = holders(jobs, now, job.partition)
    lines = [f"Your engines wait in Slurm's queue: job {job.job_id}, reason {job.reason}, "
             f"number {place_in_line(job, jobs)} in line for partition {job.partition}."]
    if held:
        lines.append("The GPUs are held by:")
        width = max(len(h.user) for h in held)
        lines += [f"  {h.user:<{width}}  job {h.job_id}: {h.gpus} on {h.nodes}, running "
                  f"{h.run_time}, at most {h.left} left" for h in held]
        lines.append(f"The first GPUs come free within {held[0].left} (the time limit), "
                     "sooner when a learner runs cu.stop().")
    else:
        lines.append("No running job holds GPUs in this partition: the job should start soon.")
    return "\n".join(lines)


_last_poll: dict[str, float] = {}
_told: set[str] = set()  # jobs whose queue message was printed


def _slurm_engine_sets(cl: ipp.Cluster) -> list[SlurmEngineSetLauncher]:
    return [es for es in cl.engines.values()
            if isinstance(es, SlurmEngineSetLauncher) and es.job_id and es.state != "after"]


def engines_problem(cl: ipp.Cluster, registered: int, n: int, timed_out: bool
                    ) -> SlurmJobError | None:
    """Hook of the wait for engines (launching.py): the error to raise for a Slurm job
    stuck in the queue or ended, None to keep waiting (and for clusters without Slurm).

    Looks at each job at most every :data:`~course_utils.cluster.launchers.slurm.POLL_S`
    seconds, and always once timed out. A job in the queue is told once (:func:`queue_message`).
    """
    for es in _slurm_engine_sets(cl):
        now = time.monotonic()
        if not timed_out and now - _last_poll.get(es.job_id, 0.0) < POLL_S:
            continue
        _last_poll[es.job_id] = now
        submitted = getattr(es, "submitted_at", None)
        waited = now - submitted if submitted is not None else 0.0
        status = job_status(es.job_id)
        queued = status.state == "PENDING" and status.reason in QUEUED_REASONS
        if queued and es.job_id not in _told:
            _told.add(es.job_id)
            print(queue_message(status) + "\ncu.start() waits for them (at most "
                  "$COURSE_START_TIMEOUT s) ...", file=sys.stderr, flush=True)
        problem = job_error(status, registered, n, waited, timed_out)
        if problem is not None:
            if queued:
                problem = SlurmJobError(f"{problem.cause}\n{queue_message(status)}", problem.fix)
            return problem
    return None
