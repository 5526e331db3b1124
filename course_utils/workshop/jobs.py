"""``course workshop jobs FILE [--release LEARNER]``: who holds the workshop's GPUs, and a way
to free a learner's (one who left, or whose start failed half-way), as docs/instructor.md's
day-of section says.

A learner's engines are one Slurm job per start (``ipengine-<cluster id>``); it holds its
GPUs until ``cu.stop()``, the kernel's end, or the workshop's time limit. Releasing cancels
every job of that learner in the workshop's partition (root may cancel anyone's job; the
learner's own ``cu.stop()`` cancels theirs).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..cluster.launchers.slurm import JobStatus, SlurmError, run_command
from ..cluster.launchers.slurm_queue import all_jobs
from .plan import Workshop, WorkshopError


@dataclass(frozen=True)
class LearnerJob:
    learner: str
    job_id: str
    state: str
    nodes: str
    run_time: str

    def text(self) -> str:
        return (f"  {self.learner}: job {self.job_id} {self.state} on {self.nodes} "
                f"for {self.run_time}")


def learner_jobs(ws: Workshop, jobs: list[JobStatus] | None = None) -> list[LearnerJob]:
    """The running and queued jobs of the workshop's learners in its partition."""
    jobs = all_jobs() if jobs is None else jobs
    out = []
    for job in jobs:
        f = job.fields
        user = f.get("UserId", "?").split("(")[0]
        if user not in ws.learners or f.get("Partition") != ws.partition:
            continue
        if job.state not in ("RUNNING", "PENDING", "CONFIGURING", "SUSPENDED"):
            continue
        out.append(LearnerJob(user, job.job_id, job.state, f.get("NodeList", "?"),
                              f.get("RunTime", "?")))
    return sorted(out, key=lambda j: (j.learner, j.job_id))


def release(ws: Workshop, learner: str) -> list[str]:
    """Cancel every job of ``learner`` in the workshop's partition; the ids that were there."""
    if learner not in ws.learners:
        raise WorkshopError(f"{learner!r} is not a learner of this workshop",
                            "name one of: " + ", ".join(ws.learners))
    held = [j.job_id for j in learner_jobs(ws) if j.learner == learner]
    if held:
        try:
            run_command(["scancel", f"--user={learner}", f"--partition={ws.partition}"],
                        timeout=15)
        except SlurmError as exc:
            raise WorkshopError(exc.cause, "run it as root (sudo course workshop jobs ...), or "
                                "as the learner: cu.stop() in their notebook") from None
    return held
