"""A real one-node SLURM cluster for tests: private ``munged``, ``slurmctld`` and ``slurmd``.

Everything lives in one throwaway directory under ``/tmp/course-slurm-rig/``: munge key, socket,
seed and log, ``slurm.conf``, state save location, spool, pid and log files. Both daemons listen
on free ports of 127.0.0.1 only, and the node is this machine's short hostname with
``NodeAddr=127.0.0.1``. The system munge and slurm (if any) are never touched: slurm reaches our
``munged`` through ``AuthInfo=socket=...`` and clients find the cluster through ``SLURM_CONF``.

Accounting is not configured (``AccountingStorageType=accounting_storage/none``): ``sacct``
answers "Slurm accounting storage is disabled". Finished jobs stay visible to ``scontrol`` and
``squeue`` for ``MinJobAge`` seconds, which is what :meth:`SlurmRig.job_state` reads.

With ``hosts=`` a two-host rig (tests/rigs/twohosts.py), the cluster has one ``slurmd`` per
simulated host instead, each in its host's network namespace (node ``rig-a`` at the host's bridge
address, ...): a job with ``--nodes=2`` spans both "hosts". ``slurmctld`` then runs in the first
host's namespace (a head node that is also a compute node); the daemons bind to any address,
and a namespace has only its bridge address (and its own loopback). Each slurmd (and so each
job step) also has the node's name as its host name and an ``/etc/hosts`` naming both nodes,
so node names resolve as on a real cluster.

Use it through the session fixture :func:`slurm_rig` (import it into a test module), or by hand::

    rig = SlurmRig.start()
    try:
        print(rig.run("sinfo").stdout)
    finally:
        rig.teardown()

``python -m tests.rigs.slurm`` brings a cluster up, prints its environment and waits for Enter.
Needs root and the Debian packages in :data:`PACKAGES`; they are installed only when ``CI=true``
or ``COURSE_TEST_INSTALL=1``; otherwise the fixture skips and prints the command to run (under
``CI=true`` a rig that cannot be built fails: :func:`tests.rigs.common.unavailable`).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import re
import secrets
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest

from course_utils import procs
from course_utils.cluster.kernel.exposure import listening_table
from tests.rigs.common import (
    RigError,
    RigUnavailable,
    apt_install,
    install_allowed,
    install_command,
    unavailable,
)

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
"""Debian packages the rig needs."""

BINARIES = ("munged", "munge", "slurmctld", "slurmd", "sinfo", "srun", "sbatch", "squeue",
            "scancel", "scontrol")
"""Programs the rig runs; one missing means the packages are missing."""

INSTALL_COMMAND = install_command(PACKAGES)
"""What to run (as root) to get the packages."""

BASE = Path(tempfile.gettempdir()) / "course-slurm-rig"
"""Parent of every run directory; leftovers of crashed runs are cleaned from here."""

MARKER = "COURSE_SLURM_RIG"
"""Environment variable set to the run directory in each daemon (inherited by ``slurmstepd``)."""

TERMINAL_STATES = frozenset({
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
    "BOOT_FAIL", "DEADLINE",
})
"""Job states after which a job never runs again."""

_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

T = TypeVar("T")


# ---------------------------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------------------------

def which(name: str) -> str | None:
    """Path of program ``name``, looking in the sbin directories too (daemons live there)."""
    path = os.environ.get("PATH", "") + os.pathsep + _SYSTEM_PATH
    return shutil.which(name, path=path)


def missing_programs(names: Sequence[str] = BINARIES) -> list[str]:
    """The programs of ``names`` that are not installed."""
    return [name for name in names if which(name) is None]


def ensure_packages(timeout: float = 900.0) -> None:
    """Make sure the slurm and munge programs exist, installing :data:`PACKAGES` if allowed.

    Raises :class:`RigUnavailable` (not root, or installing not allowed) with the command to run,
    and :class:`RigError` when ``apt-get`` itself fails.
    """
    if os.geteuid() != 0:
        raise RigUnavailable("the SLURM rig needs root (slurmd starts jobs as their user); "
                             f"run the tests as root, e.g. in CI: {INSTALL_COMMAND}")
    missing = missing_programs()
    if not missing:
        return
    if not install_allowed():
        raise RigUnavailable(f"SLURM rig: {', '.join(missing)} not installed. Enable: "
                             f"{INSTALL_COMMAND}  # as root")
    apt_install(PACKAGES, timeout=timeout)
    still = missing_programs()
    if still:
        raise RigError(f"after installing {' '.join(PACKAGES)}, still missing: {still}",
                       "check that the packages provide these programs on this distribution")


def wait_until(check: Callable[[], T | None], timeout: float, what: str,
               on_timeout: Callable[[], str] = lambda: "", interval: float = 0.2) -> T:
    """Call ``check`` until it returns something truthy (returned); RigError after ``timeout`` s.

    ``on_timeout`` supplies the diagnostics (e.g. daemons' logs) put into the error.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise RigError(f"timed out after {timeout:.0f} s waiting for {what}",
                           "read the log tails below; the rig directory is removed at teardown",
                           on_timeout())
        time.sleep(interval)


def marked_processes(root: Path) -> list[int]:
    """Pids of the processes of the run in ``root``: marked daemons and ``slurmstepd``s, and
    all their descendants (job tasks)."""
    entry = f"{MARKER}={root}".encode()
    pids = procs.all_pids()
    found = {pid for pid in pids if pid != os.getpid() and procs.environ_has(pid, entry)}
    parents = {pid: procs.parent(pid) for pid in pids}
    grew = True
    while grew:
        new = {pid for pid, ppid in parents.items() if ppid in found and pid not in found}
        found |= new
        grew = bool(new)
    return sorted(found)


def kill_processes(pids: Sequence[int], grace: float = 3.0) -> None:
    """SIGTERM ``pids``, then SIGKILL those still alive after ``grace`` seconds."""
    alive = list(pids)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while alive and time.monotonic() < deadline:
            for pid in alive:
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(pid, os.WNOHANG)  # reap our own children
            alive = [pid for pid in alive if procs.pid_alive(pid)]
            if alive:
                time.sleep(0.05)
        if not alive:
            return


def owner_alive(owner_file: Path) -> bool:
    """Whether the process recorded in ``owner_file`` (``"pid starttime"``) still runs."""
    try:
        pid_text, start = owner_file.read_text().split()
    except (OSError, ValueError):
        return False
    return procs.start_time(int(pid_text)) == start


def clean_stale(base: Path = BASE) -> list[Path]:
    """Kill the processes of, and remove, run directories whose owner process died.

    Returns the directories removed. Runs of live processes (another test session) are kept.
    """
    removed = []
    if not base.is_dir():
        return removed
    for root in sorted(base.iterdir()):
        if not root.is_dir() or owner_alive(root / "owner"):
            continue
        kill_processes(marked_processes(root))
        shutil.rmtree(root, ignore_errors=True)
        removed.append(root)
    return removed


#: Where the daemons' ports are picked: below the ports the course picks and the workshop's
#: learner blocks (20000 up), whose firewall refuses a block to all but its learner: a slurmd
#: picked there was cut off from slurmctld (CI: "Unable to contact slurm controller").
DAEMON_PORTS = range(15000, 20000)


def daemon_ports(count: int) -> list[int]:
    """``count`` distinct ports of :data:`DAEMON_PORTS` that nothing listens on here."""
    picked: list[int] = []
    for port in random.SystemRandom().sample(DAEMON_PORTS, min(200, len(DAEMON_PORTS))):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        picked.append(port)
        if len(picked) == count:
            return picked
    raise RigError(f"no {count} free ports in {DAEMON_PORTS.start}-{DAEMON_PORTS.stop - 1}")


def parse_job_record(line: str) -> tuple[str, str]:
    """``(state, reason)`` from a one-line ``scontrol -o show job`` record."""
    state = re.search(r"\bJobState=(\S+)", line)
    reason = re.search(r"\bReason=(\S+)", line)
    return (state.group(1) if state else "UNKNOWN", reason.group(1) if reason else "None")


def listening_addresses(port: int) -> list[str]:
    """IPv4/IPv6 addresses (hex as in /proc/net/tcp*) with a socket listening on ``port``."""
    return [address for address, p, _ in listening_table() if p == port]


# ---------------------------------------------------------------------------------------------
# The rig
# ---------------------------------------------------------------------------------------------

_SLURM_CONF = """\
# Throwaway cluster of the course's test rig ({root}).
ClusterName=courserig
SlurmctldHost={host}({ctld_addr})
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/munge.socket
{communication}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
PlugStackConfig={root}/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
SlurmctldTimeout=10
SlurmdTimeout=10
MessageTimeout=5
InactiveLimit=0
KillWait=2
MinJobAge=600
{node_lines}
PartitionName={partition} Nodes={node_list} Default=YES MaxTime=30 State=UP
"""


def _short_hostname() -> str:
    return socket.gethostname().split(".")[0]


@dataclass
class SlurmRig:
    """A running cluster. Build with :meth:`start`; always end with :meth:`teardown`."""

    root: Path
    conf: Path
    partition: str
    node: str
    """The (first) node's name: this machine's short hostname on a one-node rig."""
    cpus: int
    """CPUs of each node."""
    ctld_port: int
    slurmd_port: int
    env: dict[str, str]
    """Variables clients need (``SLURM_CONF``); :meth:`client_env` is a whole environment."""
    nodes: dict[str, tuple[str | None, str]] = field(default_factory=dict)
    """Node name -> (network namespace or None, address its slurmd listens on)."""
    ctld_addr: str = "127.0.0.1"
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    accounting: bool = False
    """No accounting storage: ``sacct`` says "Slurm accounting storage is disabled"."""
    gpus: int = 0
    """Fake GPUs per node (GRES ``gpu``): character devices ``mknod``-made under ``dev/<node>/``."""
    shards: int = 0
    """GRES ``shard`` per node (Slurm's GPU sharing; spread over the node's fake GPUs)."""
    _down: bool = False

    # -- building -----------------------------------------------------------------------------

    @classmethod
    def start(cls, cpus: int = 2, partition: str = "debug", timeout: float = 30.0,
              hosts: object | None = None, gpus: int = 0, shards: int = 0) -> SlurmRig:
        """Start munged, slurmctld and slurmd in a fresh directory; wait until the node is idle.

        ``hosts``: a built ``TwoHostRig`` (tests/rigs/twohosts.py); then there is one node per
        host (``rig-a`` ...), each with ``cpus`` CPUs and its slurmd in the host's namespace.
        ``gpus``: fake GPUs per node as GRES (``Gres=gpu:N``; gres.conf ``File=`` lines name
        character devices made with ``mknod``, major 195 as NVIDIA's; ``AutoDetect=off``). Slurm
        hands them out and sets ``CUDA_VISIBLE_DEVICES``; without cgroups nothing enforces it.
        ``shards``: as many ``shard`` GRES per node too (requests of ``--gres=shard:1``).
        Cleans leftovers of crashed runs first. On any failure everything made is removed and a
        :class:`RigError` with the daemons' log tails is raised.
        """
        missing = missing_programs()
        if missing:
            raise RigError(f"SLURM rig: {', '.join(missing)} not installed",
                           f"as root: {INSTALL_COMMAND}")
        clean_stale()
        BASE.mkdir(mode=0o755, exist_ok=True)
        os.chmod(BASE, 0o755)  # munged wants every directory up to its socket searchable
        root = Path(tempfile.mkdtemp(prefix=f"run-{os.getpid()}-", dir=BASE))
        os.chmod(root, 0o755)
        (root / "owner").write_text(f"{os.getpid()} {procs.start_time(os.getpid())}\n")
        if hosts is None:
            nodes: dict[str, tuple[str | None, str]] = {_short_hostname(): (None, "127.0.0.1")}
            ctld_addr = "127.0.0.1"
        else:
            nodes = {f"rig-{h.name}": (h.netns, h.address) for h in hosts.hosts.values()}
            ctld_addr = next(iter(nodes.values()))[1]  # slurmctld runs on the first host
        node = next(iter(nodes))
        ctld_port, slurmd_port = daemon_ports(2)
        conf = root / "slurm.conf"
        rig = cls(root=root, conf=conf, partition=partition, node=node, cpus=cpus,
                  ctld_port=ctld_port, slurmd_port=slurmd_port, env={"SLURM_CONF": str(conf)},
                  nodes=nodes, ctld_addr=ctld_addr, gpus=gpus, shards=shards)
        atexit.register(rig.teardown)
        try:
            rig._write_files()
            rig._start_daemons(timeout)
        except BaseException:
            rig.teardown()  # RigErrors already carry the log tails
            raise
        return rig

    def _write_files(self) -> None:
        for sub in ("munge", "state", "spool", "log", "jobs", *(f"spool/{n}" for n in self.nodes)):
            (self.root / sub).mkdir(mode=0o755)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        (self.root / "plugstack.conf").write_text("")
        gres = (f" Gres=gpu:{self.gpus}" + (f",shard:{self.shards}" if self.shards else "")
                if self.gpus else "")
        node_lines = "\n".join(
            f"NodeName={name} NodeAddr={addr} NodeHostname={name if netns else _short_hostname()} "
            f"CPUs={self.cpus}{gres} State=UNKNOWN" for name, (netns, addr) in self.nodes.items())
        if self.gpus:
            node_lines = f"GresTypes=gpu{',shard' if self.shards else ''}\n" + node_lines
            self._make_gpus()
        if any(netns for netns, _ in self.nodes.values()):
            # Each namespaced node gets this as its /etc/hosts (see _start_daemons).
            (self.root / "hosts").write_text("127.0.0.1 localhost\n" + "".join(
                f"{addr} {name}\n" for name, (_, addr) in self.nodes.items()))
        # One node: bind where this machine's name resolves (loopback). Hosts in namespaces:
        # bind to any address (a namespace has only its own), as the name resolves to loopback.
        one = len(self.nodes) == 1 and next(iter(self.nodes.values()))[0] is None
        communication = "CommunicationParameters=NoInAddrAny,NoCtldInAddrAny" if one else ""
        self.conf.write_text(_SLURM_CONF.format(
            root=self.root, host=_short_hostname(), ctld_addr=self.ctld_addr,
            communication=communication,
            ctld_port=self.ctld_port, slurmd_port=self.slurmd_port, node_lines=node_lines,
            node_list=",".join(self.nodes), partition=self.partition))

    def _make_gpus(self) -> None:
        lines = ["AutoDetect=off"]
        for name in self.nodes:
            folder = self.root / "dev" / name
            folder.mkdir(parents=True)
            for i in range(self.gpus):
                os.mknod(folder / f"nvidia{i}", 0o666 | stat.S_IFCHR, os.makedev(195, i))
            files = f"nvidia[0-{self.gpus - 1}]" if self.gpus > 1 else "nvidia0"
            lines.append(f"NodeName={name} Name=gpu File={folder / files}")
            if self.shards:
                lines.append(f"NodeName={name} Name=shard Count={self.shards}")
        (self.root / "gres.conf").write_text("\n".join(lines) + "\n")

    def _spawn(self, name: str, cmd: list[str]) -> None:
        env = dict(self.client_env(), **{MARKER: str(self.root)})
        env["PATH"] = env.get("PATH", "") + os.pathsep + _SYSTEM_PATH
        with open(self.root / "log" / f"{name}.console", "wb") as console:
            self.procs[name] = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT,
                env=env, cwd=self.root, start_new_session=True)

    def _check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RigError(f"{name} exited with status {proc.returncode} while starting",
                               f"read {name}'s log below", self.logs())

    def _start_daemons(self, timeout: float) -> None:
        munge = self.root / "munge"
        self._spawn("munged", [
            which("munged") or "munged", "--foreground", "--num-threads=4",
            f"--key-file={munge / 'munge.key'}", f"--socket={munge / 'munge.socket'}",
            f"--pid-file={munge / 'munged.pid'}", f"--seed-file={munge / 'munged.seed'}",
            f"--log-file={self.root / 'log' / 'munged.log'}"])

        def munge_ready() -> bool:
            self._check_alive()
            done = subprocess.run([which("munge") or "munge", "-n", "-S",
                                   str(munge / "munge.socket")],
                                  capture_output=True, timeout=10, check=False)
            return done.returncode == 0

        wait_until(munge_ready, min(timeout, 10.0), "munged to answer on its socket", self.logs)
        def inside(netns: str | None) -> list[str]:
            # nsenter, not `ip netns exec`: that remounts /sys, and slurmd needs the cgroup fs.
            return ["nsenter", f"--net=/run/netns/{netns}"] if netns else []

        head = next(iter(self.nodes.values()))[0]
        self._spawn("slurmctld", [*inside(head), which("slurmctld") or "slurmctld", "-D", "-f",
                                  str(self.conf)])
        for name, (netns, _) in self.nodes.items():
            # A node in a namespace also gets a host name and an /etc/hosts of its own (UTS and
            # mount namespaces), as a real cluster's nodes have: every node resolves every
            # node's name to its address, which torchrun's rendezvous relies on. Its jobs
            # inherit both.
            own = ["unshare", "--mount", "--uts", "--propagation", "private", "sh", "-c",
                   'mount --bind "$1" /etc/hosts && hostname "$2" && shift 2 && exec "$@"',
                   "node-setup", str(self.root / "hosts"), name] if netns else []
            self._spawn(f"slurmd-{name}", [*inside(netns), *own, which("slurmd") or "slurmd",
                                           "-D", "-f", str(self.conf), "-N", name])

        def nodes_idle() -> bool:
            self._check_alive()
            done = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False, timeout=10)
            states = dict(line.split() for line in done.stdout.splitlines() if line.strip())
            return done.returncode == 0 and states == dict.fromkeys(self.nodes, "idle")

        wait_until(nodes_idle, timeout, f"node(s) {', '.join(self.nodes)} to be idle in `sinfo`",
                   self.logs)

    # -- using --------------------------------------------------------------------------------

    def client_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """A whole environment for slurm clients: ``base`` (default os.environ) without inherited
        ``SLURM_*`` job variables, plus :attr:`env`."""
        source = os.environ if base is None else base
        env = {k: v for k, v in source.items() if not k.startswith("SLURM_")}
        env.update(self.env)
        return env

    @contextlib.contextmanager
    def activated(self) -> Iterator[SlurmRig]:
        """Point this process's ``os.environ`` (and so every subprocess, e.g. ipyparallel's
        ``sbatch``) at the rig; the previous environment is restored on exit."""
        saved = dict(os.environ)
        try:
            os.environ.clear()
            os.environ.update(self.client_env(saved))
            yield self
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def run(self, cmd: str | Sequence[str], timeout: float = 30.0, check: bool = True,
            cwd: Path | str | None = None) -> subprocess.CompletedProcess[str]:
        """Run a client command (``"srun -n2 hostname"`` or a list) against the rig.

        With ``check``, a non-zero exit raises :class:`RigError` with its output and log tails.
        """
        args = shlex.split(cmd) if isinstance(cmd, str) else list(cmd)
        try:
            done = subprocess.run(args, env=self.client_env(), capture_output=True, text=True,
                                  timeout=timeout, cwd=cwd or self.root / "jobs", check=False)
        except subprocess.TimeoutExpired as exc:
            raise RigError(f"`{shlex.join(args)}` did not finish within {timeout:.0f} s",
                           "read the daemons' logs below", self.logs()) from exc
        if check and done.returncode != 0:
            raise RigError(f"`{shlex.join(args)}` exited {done.returncode}:\n"
                           f"{done.stdout}{done.stderr}", "read the daemons' logs below",
                           self.logs())
        return done

    def sbatch(self, script_text: str, *args: str, timeout: float = 30.0) -> int:
        """Submit ``script_text`` (``#!/bin/bash`` added if it has no shebang) with extra
        ``sbatch`` arguments; the job runs in ``<root>/jobs``. Returns the job id."""
        if not script_text.startswith("#!"):
            script_text = "#!/bin/bash\n" + script_text
        jobs = self.root / "jobs"
        script = jobs / f"script-{secrets.token_hex(4)}.sh"
        script.write_text(script_text)
        done = self.run(["sbatch", "--parsable", f"--chdir={jobs}", *args, str(script)],
                        timeout=timeout)
        return int(done.stdout.strip().split(";")[0])

    def job_record(self, job_id: int) -> str:
        """The one-line ``scontrol -o show job`` record ('' once slurm forgot the job)."""
        done = self.run(["scontrol", "-o", "show", "job", str(job_id)], check=False)
        return done.stdout.strip() if done.returncode == 0 else ""

    def job_state(self, job_id: int) -> tuple[str, str]:
        """``(state, reason)`` of a job, e.g. ``("PENDING", "Resources")``;
        ``("UNKNOWN", "None")`` when slurm no longer knows it."""
        return parse_job_record(self.job_record(job_id))

    def wait_job(self, job_id: int, timeout: float = 30.0) -> str:
        """Wait until the job reaches a final state (:data:`TERMINAL_STATES`) and return it."""

        def final() -> str | None:
            state, _ = self.job_state(job_id)
            return state if state in TERMINAL_STATES or state == "UNKNOWN" else None

        return wait_until(final, timeout, f"job {job_id} to finish",
                          lambda: self.job_record(job_id) + "\n" + self.logs(), interval=0.25)

    def wait_reason(self, job_id: int, timeout: float = 15.0) -> tuple[str, str]:
        """Wait until the scheduler gave a job a reason (not ``None``); ``(state, reason)``."""

        def reason() -> tuple[str, str] | None:
            state, why = self.job_state(job_id)
            return (state, why) if why != "None" or state != "PENDING" else None

        return wait_until(reason, timeout, f"job {job_id} to get a reason",
                          lambda: self.job_record(job_id))

    def job_output(self, job_id: int) -> Path:
        """Path of the job's standard output file (from ``scontrol``)."""
        found = re.search(r"\bStdOut=(\S+)", self.job_record(job_id))
        if not found:
            raise RigError(f"slurm does not know job {job_id} any more",
                           "read the output before MinJobAge (600 s) passes")
        return Path(found.group(1))

    def cancel(self, job_id: int) -> None:
        """``scancel`` one job."""
        self.run(["scancel", str(job_id)])

    def pids(self) -> list[int]:
        """Processes of this run still alive: daemons, ``slurmstepd``s and job tasks."""
        return marked_processes(self.root)

    def logs(self, lines: int = 30) -> str:
        """Tails of the daemons' logs (what a failure shows)."""
        parts = []
        log_dir = self.root / "log"
        for name in ("munged", "slurmctld", *(f"slurmd-{n}" for n in self.nodes)):
            for path in (log_dir / f"{name}.log", log_dir / f"{name}.console"):
                with contextlib.suppress(OSError):
                    text = path.read_text(errors="replace").splitlines()[-lines:]
                    if text:
                        parts.append(f"--- {path.name} (last {len(text)} lines) ---")
                        parts.extend(text)
                        break
        return "\n".join(parts)

    # -- stopping -----------------------------------------------------------------------------

    def teardown(self) -> None:
        """Cancel jobs, stop the daemons, kill anything left of the run, remove the directory.

        Safe to call twice and after a failed start.
        """
        if self._down:
            return
        self._down = True
        ctld = self.procs.get("slurmctld")
        if ctld is not None and ctld.poll() is None:
            with contextlib.suppress(Exception):
                queued = self.run(["squeue", "-h", "-o", "%A"], check=False, timeout=5)
                ids = queued.stdout.split()
                if ids:
                    self.run(["scancel", *ids], check=False, timeout=5)
                    with contextlib.suppress(RigError):
                        wait_until(self._queue_empty, 5.0, "jobs to end")
        for name in (*(f"slurmd-{n}" for n in self.nodes), "slurmctld", "munged"):
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
        for _ in range(3):  # a slurmstepd forked while slurmd stopped may show up late
            left = marked_processes(self.root)
            if not left:
                break
            kill_processes(left)
            time.sleep(0.1)
        shutil.rmtree(self.root, ignore_errors=True)
        atexit.unregister(self.teardown)

    def _queue_empty(self) -> bool:
        done = self.run(["squeue", "-h", "-o", "%A"], check=False, timeout=5)
        return done.returncode == 0 and not done.stdout.strip()


def require_rig() -> None:
    """In a test: install the packages if allowed, else skip with the reason (fail in CI)."""
    try:
        ensure_packages()
    except RigUnavailable as exc:
        unavailable(str(exc))


@pytest.fixture(scope="session")
def slurm_rig() -> Iterator[SlurmRig]:
    """Session-wide one-node cluster (2 CPUs, partition ``debug``), removed at session end.

    Skips with the reason where the rig cannot be built, except under ``CI=true``, where it fails.
    """
    require_rig()
    rig = SlurmRig.start()
    try:
        yield rig
    finally:
        rig.teardown()


if __name__ == "__main__":
    manual = SlurmRig.start()
    try:
        print(manual.run("sinfo").stdout)
        print(f"export SLURM_CONF={manual.conf}")
        input("Cluster up; press Enter to tear it down. ")
    finally:
        manual.teardown()
