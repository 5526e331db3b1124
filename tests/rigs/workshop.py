"""The workshop rig: the two simulated hosts (tests/rigs/twohosts.py), a Slurm cluster with one
``slurmd`` in each and fake GPUs as GRES (tests/rigs/slurm.py, ``gpus=``), and real OS users
for the learners, every part removed afterwards (also when a test fails).

The learners are OS users named ``cw<pid>-<name>`` (so two runs never share one), made with
``useradd -m`` and removed with ``userdel -r``; leftovers of a crashed run are removed the next
time (:func:`remove_stale_users`). The hub on top is tests/rigs/hub.py.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from course_utils import procs
from course_utils.workshop import lab_limits
from course_utils.workshop.plan import Workshop, workshop_from_dict
from tests.rigs.common import RigError
from tests.rigs.slurm import SlurmRig

USER_PREFIX = "cw"
GPUS_PER_HOST = 4


def remove_stale_users() -> list[str]:
    """Remove the learners of rigs whose process is gone, and their labs' memory groups; their
    names."""
    gone = []
    for entry in pwd.getpwall():
        m = re.match(rf"^{USER_PREFIX}(\d+)-", entry.pw_name)
        if m and not procs.pid_alive(int(m[1])):
            subprocess.run(["userdel", "-r", "-f", entry.pw_name], capture_output=True,
                           check=False, timeout=30)
            gone.append(entry.pw_name)
    groups = lab_limits.memory_controller()
    for group in groups[0].glob(f"{USER_PREFIX}*-*") if groups else []:
        m = re.match(rf"^{USER_PREFIX}(\d+)-", group.name)
        if m and not procs.pid_alive(int(m[1])):
            _remove_group(group, wait=0)
    return gone


def _remove_group(group: Path, wait: float = 5.0) -> None:
    """Remove a lab's memory group once the processes just killed in it are gone."""
    deadline = time.monotonic() + wait
    while group.exists():
        try:
            group.rmdir()
        except OSError:
            if time.monotonic() > deadline:
                return
            time.sleep(0.1)


@contextlib.contextmanager
def os_users(names: Sequence[str]) -> Iterator[list[str]]:
    """OS users for ``names`` (``cw<pid>-<name>``), with homes; removed on exit."""
    if shutil.which("useradd") is None:
        raise RigError("useradd is missing", "apt-get install -y passwd")
    remove_stale_users()
    made: list[str] = []
    try:
        for name in names:
            user = f"{USER_PREFIX}{os.getpid()}-{name}"
            done = subprocess.run(["useradd", "-m", "-s", "/bin/sh", user],
                                  capture_output=True, text=True, timeout=30, check=False)
            if done.returncode != 0:
                raise RigError(f"useradd {user} failed: {done.stderr.strip()}")
            made.append(user)
        yield made
    finally:
        groups = lab_limits.memory_controller()
        for user in made:
            subprocess.run(["pkill", "-KILL", "-u", user], capture_output=True, check=False,
                           timeout=30)
            subprocess.run(["userdel", "-r", "-f", user], capture_output=True, check=False,
                           timeout=30)
            if groups:
                _remove_group(groups[0] / user)


REACHABLE_STATE = Path("/run/lock/course-reachable.json")
"""The modes :func:`reachable_by_all` changed and how many rigs hold them (rigs may overlap)."""


@contextlib.contextmanager
def _state(path: Path) -> Iterator[dict]:
    """The shared state under an exclusive lock; written back on exit."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            state = json.loads(path.read_text()) if path.exists() else {}
        except ValueError:
            state = {}
        state.setdefault("holders", 0)
        state.setdefault("modes", {})
        yield state
        path.write_text(json.dumps(state))


@contextlib.contextmanager
def reachable_by_all(*paths: str, state: Path = REACHABLE_STATE) -> Iterator[list[str]]:
    """Let every user traverse (``o+x``, not read) the folders above ``paths``, so learners
    can run the course's Python (here under ``/root/.pyenv``). The last rig to leave restores
    the modes (two rigs may overlap: the first to leave must not close what the other needs).
    On a real workshop host, install the course's environment where learners can read it."""
    with _state(state) as st:
        for path in paths:
            folder = os.path.realpath(path)
            while folder != "/":
                mode = stat.S_IMODE(os.stat(folder).st_mode)
                if not mode & stat.S_IXOTH:
                    os.chmod(folder, mode | stat.S_IXOTH)
                    st["modes"].setdefault(folder, mode)
                folder = os.path.dirname(folder)
        st["holders"] += 1
        opened = sorted(st["modes"])
    try:
        yield opened
    finally:
        with _state(state) as st:
            st["holders"] = max(0, st["holders"] - 1)
            if st["holders"] == 0:
                for folder, mode in st["modes"].items():
                    with contextlib.suppress(OSError):
                        os.chmod(folder, mode)
                st["modes"] = {}


@contextlib.contextmanager
def closed_to_others(paths: Sequence[Path]) -> Iterator[None]:
    """``chmod o-rwx`` on ``paths`` while the rig runs (root's tests still read them): the
    checkout here is world-readable, an instructor's on a workshop host is not."""
    modes = {}
    for path in paths:
        modes[path] = stat.S_IMODE(path.stat().st_mode)
        path.chmod(modes[path] & ~0o007)
    try:
        yield
    finally:
        for path, mode in modes.items():
            with contextlib.suppress(OSError):
                path.chmod(mode)


@dataclass
class WorkshopRig:
    """A built rig: the Slurm cluster over the two hosts and the learners' users."""

    slurm: SlurmRig
    learners: list[str]
    hosts: object = None
    """The two-host rig (tests/rigs/twohosts.py) the nodes run in."""
    jobs: list[str] = field(default_factory=list)

    def workshop(self, **overrides: object) -> Workshop:
        """The workshop file that describes this rig (``overrides`` change it)."""
        return workshop_from_dict(self.workshop_data(**overrides))

    def workshop_data(self, **overrides: object) -> dict:
        """:meth:`workshop`'s file as data (:func:`toml_text` writes it out)."""
        data: dict = {"learners": self.learners, "partition": self.slurm.partition,
                      "time": "10", "slurm_conf": str(self.slurm.conf),
                      # 2 shared cores: a generous start; few processes and little memory
                      # each, so that a test can reach the limits
                      "hub": {"lab_start_timeout": 400, "max_processes": 300,
                              "max_memory": "2G"},
                      "hosts": [
                          {"name": n, "address": a, "gpus": GPUS_PER_HOST}
                          for n, (_, a) in self.slurm.nodes.items()]}
        data.update(overrides)
        return data

    def submit_as(self, user: str, ws: Workshop, seconds: int = 300,
                  name: str = "learner-engines") -> str:
        """A job ``name`` of ``user`` with a learner's request (one GPU on every host); its
        id."""
        cmd = ["runuser", "-u", user, "--", "env", f"SLURM_CONF={self.slurm.conf}", "sbatch",
               "--parsable", f"--partition={ws.partition}", f"--nodes={len(ws.hosts)}",
               f"--ntasks-per-node={ws.gpus_per_learner}",
               f"--gres=shard:{ws.gpus_per_learner}" if ws.shared else "--gpus-per-task=1",
               "--time=5",
               f"--chdir={pwd.getpwnam(user).pw_dir}", "--output=%x-%j.out",
               f"--job-name={name}",
               "--wrap", f"srun sh -c 'echo $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES'; "
                         f"sleep {seconds}"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False,
                              env=self.slurm.client_env())
        if done.returncode != 0:
            raise RigError(f"sbatch as {user} failed: {done.stderr.strip()}")
        job = done.stdout.strip().split(";")[0]
        self.jobs.append(job)
        return job

    def set_password(self, user: str) -> str:
        """Give ``user`` a fresh random password (for the hub's PAM login page); it."""
        import secrets

        password = secrets.token_urlsafe(12)
        done = subprocess.run(["chpasswd"], input=f"{user}:{password}\n", capture_output=True,
                              text=True, timeout=30, check=False)
        if done.returncode != 0:
            raise RigError(f"chpasswd for {user} failed: {done.stderr.strip()}")
        return password

    def cancel_all(self, timeout: float = 60.0) -> None:
        """Cancel every job of the learners (those submitted here and those their labs' engines
        asked for) and wait until Slurm holds none: the next test starts with every GPU free."""
        self.jobs.clear()
        for user in self.learners:
            self.slurm.run(["scancel", f"--user={user}"], check=False)
        deadline = time.monotonic() + timeout
        while True:
            left = self.slurm.run(["squeue", "-h", f"--user={','.join(self.learners)}",
                                   "-o", "%i %u %T"], check=False).stdout.strip()
            if not left:
                return
            if time.monotonic() > deadline:
                raise RigError(f"Slurm still holds jobs {timeout:g} s after scancel:\n{left}")
            time.sleep(0.3)


def toml_text(data: dict) -> str:
    """A workshop file's data as TOML: keys of plain values, then ``[hub]``, then each
    ``[[hosts]]`` (the shapes a workshop file has)."""
    def line(key: str, value: object) -> str:
        return f"{key} = {json.dumps(value)}"  # JSON's strings, ints and lists are TOML's

    plain = [line(k, v) for k, v in data.items() if not isinstance(v, dict) and k != "hosts"]
    hub = ["", "[hub]", *(line(k, v) for k, v in data.get("hub", {}).items())]
    hosts = [text for h in data.get("hosts", [])
             for text in ("", "[[hosts]]", *(line(k, v) for k, v in h.items()))]
    return "\n".join([*plain, *hub, *hosts]) + "\n"


@contextlib.contextmanager
def workshop_rig(hosts: object, learners: Sequence[str] = ("ann", "ben", "cat", "dan", "eve")
                 ) -> Iterator[WorkshopRig]:
    """Slurm with :data:`GPUS_PER_HOST` fake GPUs on each of ``hosts`` and OS users."""
    # shards too: a workshop file with shards_per_gpu = 2 shares the same fake GPUs
    slurm = SlurmRig.start(cpus=2 * GPUS_PER_HOST, hosts=hosts, gpus=GPUS_PER_HOST,
                           shards=2 * GPUS_PER_HOST)  # a CPU for each shard's rank
    try:
        with (os_users(learners) as users, slurm.activated(),
              reachable_by_all(sys.base_prefix, sys.prefix)):
            rig = WorkshopRig(slurm, users, hosts)
            try:
                yield rig
            finally:
                rig.cancel_all()
    finally:
        slurm.teardown()
