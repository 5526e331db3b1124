"""``course doctor --profile <slurm profile>``: is Slurm ready to run the course's engines?

Checks in order, each failure naming its fix; later checks are skipped once one fails:

1. ``slurm commands``: sinfo, srun, sbatch, squeue, scancel and scontrol are installed;
2. ``scheduler``: ``sinfo`` answers (slurmctld is up and reachable, munge works);
3. ``partition``: the profile's partition exists and is up (default: Slurm's default one);
4. ``engine request``: ``sbatch --test-only`` accepts the engines' job as the profile asks it
   (tasks, CPUs/GPUs per engine, time, account) and says when and where it would start;
5. ``tiny job``: ``srun -n1 true`` runs within a bounded time.

:func:`profile_checks` then starts the engines with the profile (a real Slurm job) and runs
a gloo all_reduce on them (:func:`course_utils.instructor.doctor.check_cluster`).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator

from ..cluster.launchers import slurm
from ..cluster.profiles import ClusterProfile, load_profile
from ..errors import CourseError
from .doctor import Check, check_cluster, check_python, version_check

PROGRAMS = ("sinfo", "srun", "sbatch", "squeue", "scancel", "scontrol")
"""Slurm client programs the course runs."""


def _missing(programs: tuple[str, ...] = PROGRAMS) -> list[str]:
    return [p for p in programs if shutil.which(p) is None]


def check_commands() -> Check:
    missing = _missing()
    if missing:
        return Check("slurm commands", False, f"not installed: {', '.join(missing)}",
                     "run this on the cluster's login node, or load Slurm (`module load "
                     "slurm`); Debian/Ubuntu: apt-get install slurm-client")
    return Check("slurm commands", True, ", ".join(PROGRAMS) + " found")


def check_scheduler(timeout: float = 15.0) -> tuple[Check, list[str]]:
    """``sinfo`` answers; also returns its partition lines ``"name* up nodes state"``."""
    try:
        out = slurm.run_command(["sinfo", "-h", "-o", "%P %a %D %t"], timeout=timeout)
    except slurm.SlurmError as exc:
        return Check("scheduler", False, f"sinfo: {exc.cause}", exc.fix), []
    lines = [line for line in out.splitlines() if line.strip()]
    if not lines:
        return Check("scheduler", False, "sinfo answers but lists no partition",
                     "ask the cluster's admins: Slurm has no partition for you"), []
    names = sorted({line.split()[0] for line in lines})
    return Check("scheduler", True, f"sinfo answers; partitions: {', '.join(names)}"), lines


def check_partition(prof: ClusterProfile, sinfo_lines: list[str]) -> tuple[Check, str]:
    """The profile's partition exists and is up; returns the partition's name ('' if not).

    ``sinfo_lines`` are ``sinfo -h -o "%P %a %D %t"`` lines: one per partition and node state,
    the default partition marked ``*``.
    """
    rows = [line.split() for line in sinfo_lines if len(line.split()) == 4]
    names = sorted({row[0].rstrip("*") for row in rows})
    default = next((row[0].rstrip("*") for row in rows if row[0].endswith("*")), "")
    asked = prof.slurm.partition if prof.slurm else None
    want = asked or default
    listing = ", ".join(names)
    if not want:
        return Check("partition", False, "the profile names no partition and Slurm has no "
                     "default one", f"set [slurm] partition to one of: {listing}"), ""
    mine = [row for row in rows if row[0].rstrip("*") == want]
    if not mine:
        return Check("partition", False, f"{want!r} does not exist; Slurm has: {listing}",
                     f"set [slurm] partition in profile {prof.name!r} to one of: {listing}"), ""
    avail = sorted({row[1] for row in mine})
    if avail != ["up"]:
        return Check("partition", False, f"{want!r} is {'/'.join(avail)}",
                     f"pick another partition (`sinfo -s`), or ask the admins why {want!r} "
                     "is not up"), ""
    nodes = sum(int(row[2]) for row in mine if row[2].isdigit())
    states = ", ".join(f"{row[2]} {row[3]}" for row in mine)
    which = "" if asked else " (Slurm's default)"
    return Check("partition", True, f"{want!r}{which} is up: {nodes} node(s) ({states})"), want


def _request_args(prof: ClusterProfile, partition: str, engines: int) -> list[str]:
    opts = [o for o in slurm.sbatch_options(prof.slurm) if not o.startswith("--partition=")]
    return [f"--partition={partition}", f"--ntasks={engines}", *opts]


def check_request(prof: ClusterProfile, partition: str, engines: int,
                  timeout: float = 15.0) -> Check:
    """``sbatch --test-only`` accepts the engines' job (nothing is submitted)."""
    name = "engine request"
    wanted = _request_args(prof, partition, engines)
    try:  # sbatch --test-only gives its verdict on stderr, with exit status 0 or 1
        res = subprocess.run(["sbatch", "--test-only", *wanted, "--wrap", "true"],
                             capture_output=True, text=True, timeout=timeout,
                             stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        return Check(name, False, f"sbatch --test-only did not answer within {timeout:g} s",
                     "the scheduler is slow or down: `scontrol ping`")
    said = " ".join((res.stderr + res.stdout).split())
    if res.returncode != 0 or "to start at" not in said:
        return Check(name, False, f"Slurm refuses `{' '.join(wanted)}`: {said or 'no output'}",
                     slurm.explain(said))
    return Check(name, True, f"`{' '.join(wanted)}` fits: {said.split('sbatch: ', 1)[-1]}")


def check_tiny_job(prof: ClusterProfile, partition: str, timeout: float = 60.0) -> Check:
    """``srun -n1 true`` runs within ``timeout`` s (``--immediate`` bounds its wait in the
    queue, ``--time=1`` its run)."""
    name = "tiny job"
    spec = prof.slurm
    extra = [f"--account={spec.account}"] if spec and spec.account else []
    extra += [f"--qos={spec.qos}"] if spec and spec.qos else []
    wait = max(5, int(timeout) - 5)
    args = ["srun", f"--partition={partition}", "--ntasks=1", "--time=1",
            f"--immediate={wait}", *extra, "true"]
    t0 = time.perf_counter()
    try:
        slurm.run_command(args, timeout=timeout)
    except slurm.SlurmError as exc:
        if "immediate" in exc.cause.lower() or "unable to allocate" in exc.cause.lower():
            return Check(name, False, f"`srun -n1 true` got no CPU within {wait} s",
                         f"the partition is full: `squeue -p {partition}`; try again later")
        return Check(name, False, exc.cause, exc.fix)
    return Check(name, True, f"`{' '.join(args)}` ran in {time.perf_counter() - t0:.1f} s")


def slurm_checks(prof: ClusterProfile, engines: int, timeout: float = 60.0) -> Iterator[Check]:
    """The Slurm checks in order; stops after the first failure (later ones depend on it)."""
    check = check_commands()
    yield check
    if not check.ok:
        return
    check, lines = check_scheduler(timeout=min(timeout, 15.0))
    yield check
    if not check.ok:
        return
    check, partition = check_partition(prof, lines)
    yield check
    if not check.ok:
        return
    check = check_request(prof, partition, engines, timeout=min(timeout, 15.0))
    yield check
    if not check.ok:
        return
    yield check_tiny_job(prof, partition, timeout=min(timeout, 60.0))


def profile_checks(profile: str | ClusterProfile, engines: int = 2, timeout: float = 60,
                   tf: bool = False) -> Iterator[Check]:
    """``course doctor --profile``: Python and packages, the profile's own checks (Slurm's,
    for a slurm profile), then its engines for real with a gloo all_reduce (and, with ``tf``,
    a parameter server). The profile's ``engines`` wins over ``engines``."""
    try:
        prof = load_profile(profile)
    except CourseError as exc:
        yield Check("profile", False, exc.cause, exc.fix)
        return
    yield Check("profile", True, f"{prof.name} (launcher {prof.launcher})")
    basics = [check_python(), version_check("ipyparallel", "ipyparallel", (9,)),
              version_check("torch", "torch", (2, 4))]
    yield from basics
    n = prof.engine_count(None) or engines
    ready = True
    if prof.launcher == "slurm":
        for check in slurm_checks(prof, n, timeout):
            ready = ready and check.ok
            yield check
    if not (ready and all(c.ok for c in basics)):
        yield Check("cluster", False, "skipped: a check above failed", "fix it, then rerun")
        return
    yield from check_cluster(n, timeout, tf=tf, profile=prof)
