"""Two simulated hosts on this machine: network namespaces, veth links, a bridge and an sshd each.

The rig the multi-host tests (unit 6 onwards) point ipyparallel's SSH launchers at::

    root namespace (kernel, controller)
        bridge ``crig<run>br``  10.213.N.1/24   <- ``controller_ip``
          |-- veth ``crig<run>a`` == ``rig0`` in netns ``crig<run>-a``  10.213.N.2  sshd :22
          |-- veth ``crig<run>b`` == ``rig0`` in netns ``crig<run>-b``  10.213.N.3  sshd :22

* Both hosts share the file system and the hostname with the root namespace (like cloned VMs);
  tell them apart by alias and address.
* Every name carries the run id ``<pid hex>_<seq>``; a run whose pid is gone is stale and is
  removed by :func:`clean_stale` (called by every new rig), so a crashed run leaves nothing behind
  for long and parallel runs never collide.
* Nothing gets a default route: the hosts reach the bridge subnet only. Each sshd listens on its
  host's rig address only, with a host key, an authorized key and a config made for the run;
  ssh goes through :attr:`TwoHostRig.ssh_config` (``ssh -F``): ``~/.ssh`` is never read or written.
* :meth:`TwoHostRig.shape` limits the rate with ``tbf``. It adds no delay: that needs the
  ``netem`` qdisc, which the kernels of this project's machines and CI lack, and a rig feature
  CI cannot run would be tested nowhere.

Needs root, ``ip``/``tc`` (iproute2) and Debian's openssh-server; :func:`prerequisites` installs
the latter only when ``CI=true`` or ``COURSE_TEST_INSTALL=1`` (:mod:`tests.rigs.common`).
Run ``python -m tests.rigs.twohosts`` to build a rig by hand and keep it until Ctrl-C, or
``... clean`` to remove stale runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from course_utils import procs
from tests.rigs.common import (
    RigError,
    RigUnavailable,
    apt_install,
    install_allowed,
    install_command,
    unavailable,
)

PREFIX = "crig"  # every namespace, link and work directory of a rig starts with this
SUPERNET = ipaddress.ip_network("10.213.0.0/16")  # /24 subnets handed out from here
IFNAME = "rig0"  # the hosts' interface name, the same in both (a profile's socket_ifname)
SSHD = "/usr/sbin/sshd"
SFTP_SERVER = "/usr/lib/openssh/sftp-server"
PRIVSEP_DIR = Path("/run/sshd")
LOCK_FILE = Path("/run/lock/course-rig.lock")
OPENSSH_PACKAGES = ("openssh-server", "openssh-client")
INSTALL_CMD = install_command(OPENSSH_PACKAGES)
_RUN_RE = re.compile(rf"^{PREFIX}([0-9a-f]+)_(\d+)")
_seq = 0


def _new_run_id() -> str:
    """``<pid hex>_<n>``: unique on this machine while this process lives."""
    global _seq
    _seq += 1
    return f"{os.getpid():x}_{_seq}"


@dataclass(frozen=True)
class Host:
    """One simulated host."""

    name: str  # "a", "b"
    alias: str  # ssh destination in the rig's ssh_config: "rig-a"
    netns: str  # network namespace: "crig<run>-a"
    address: str  # its address on the bridge subnet
    ifname: str  # its interface inside the namespace (IFNAME)
    peer: str  # the veth end in the root namespace, a bridge port: "crig<run>a"


# --------------------------------------------------------------------------- commands


def sh(
    argv: Sequence[str], *, timeout: float = 10, check: bool = True, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` with a timeout; on failure raise RigError naming the command and its output."""
    try:
        cp = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, input=input
        )
    except subprocess.TimeoutExpired as e:
        raise RigError(f"{' '.join(argv)!r} did not finish within {timeout} s") from e
    if check and cp.returncode != 0:
        raise RigError(
            f"{' '.join(argv)!r} exited {cp.returncode}: {(cp.stderr or cp.stdout).strip()}"
        )
    return cp


def _ip_json(*args: str) -> list[dict]:
    out = sh(["ip", "-j", *args]).stdout.strip()
    return json.loads(out) if out else []


_prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here, not between fork and exec


def _die_with_parent() -> None:
    """preexec_fn: the child gets SIGTERM when the thread that started it ends (a killed run)."""
    _prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG


@contextlib.contextmanager
def _lock() -> Iterator[None]:
    """Serialise subnet allocation and stale cleanup between concurrent rigs on this machine."""
    path = LOCK_FILE if LOCK_FILE.parent.is_dir() else Path(tempfile.gettempdir()) / LOCK_FILE.name
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# --------------------------------------------------------------------------- prerequisites


def install_openssh(timeout: float = 600) -> None:
    """``apt-get install openssh-server`` without starting the system's sshd on port 22
    (:func:`tests.rigs.common.apt_install` starts no service)."""
    try:
        apt_install(OPENSSH_PACKAGES, timeout=timeout)
    except RigError as exc:
        raise RigUnavailable(exc.cause, exc.fix) from None


def prerequisites(install: bool | None = None) -> str | None:
    """Why the rig cannot be built here, or None when it can.

    Checks root, ``ip``/``tc``, ``ip netns add`` and OpenSSH. A missing OpenSSH is installed when
    ``install`` (default: ``CI=true`` or ``COURSE_TEST_INSTALL=1``); otherwise the reason names
    the command that would install it.
    """
    if os.geteuid() != 0:
        return "the two-host rig needs root (network namespaces, veth links, sshd)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` is missing; install it with: apt-get install -y iproute2"
    probe = f"{PREFIX}{_new_run_id()}-probe"
    cp = sh(["ip", "netns", "add", probe], check=False)
    sh(["ip", "netns", "del", probe], check=False)
    if cp.returncode != 0:
        return f"`ip netns add` fails here: {cp.stderr.strip()}"
    missing = [p for p in (SSHD, SFTP_SERVER) if not os.path.exists(p)]
    missing += [t for t in ("ssh", "scp", "ssh-keygen") if shutil.which(t) is None]
    if missing:
        if install if install is not None else install_allowed():
            try:
                install_openssh()
            except RigUnavailable as e:
                return str(e)
            still = prerequisites(install=False)
            return still and f"installed openssh-server, but: {still}"
        return f"OpenSSH is missing ({', '.join(missing)}). Enable: {INSTALL_CMD}  # as root"
    return None


# --------------------------------------------------------------------------- runs and leftovers


def _run_of(name: str) -> tuple[int, str] | None:
    """(pid, run id) encoded in a rig name, or None for names that are not a rig's."""
    m = _RUN_RE.match(name)
    return (int(m.group(1), 16), f"{m.group(1)}_{m.group(2)}") if m else None


def _netns_names() -> list[str]:
    return [d["name"] for d in _ip_json("netns", "list")]


def _link_names() -> list[str]:
    return [d["ifname"] for d in _ip_json("link", "show")]


def _of_run(names: list[str], run_id: str) -> list[str]:
    return [n for n in names if (_run_of(n) or (0, ""))[1] == run_id]


def _workdirs() -> list[Path]:
    return sorted(Path(tempfile.gettempdir()).glob(f"{PREFIX}*"))


def _kill_netns_processes(ns: str, grace: float = 2.0) -> None:
    """SIGTERM, then SIGKILL, every process inside namespace ``ns``; wait until they are gone."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 3.0)):
        pids = [int(p) for p in sh(["ip", "netns", "pids", ns], check=False).stdout.split()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(procs.pid_alive(p) for p in pids):
            time.sleep(0.05)


def remove_run(run_id: str) -> None:
    """Remove everything of run ``run_id``: processes, namespaces, links, work directory."""
    for ns in _of_run(_netns_names(), run_id):
        _kill_netns_processes(ns)
        sh(["ip", "netns", "del", ns], check=False)
    for pid in procs.pids_running(f"{PREFIX}{run_id}-"):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for link in _of_run(_link_names(), run_id):
        sh(["ip", "link", "del", link], check=False)
    for d in _workdirs():
        if _of_run([d.name], run_id):
            shutil.rmtree(d, ignore_errors=True)


def leftovers(run_id: str) -> list[str]:
    """What of run ``run_id`` still exists (namespaces, links, work directories, processes)."""
    left = []
    for ns in _of_run(_netns_names(), run_id):
        left.append(f"netns {ns}")
        pids = sh(["ip", "netns", "pids", ns], check=False).stdout.split()
        left += [f"process {p} in {ns}" for p in pids]
    left += [f"link {n}" for n in _of_run(_link_names(), run_id)]
    left += [f"file {d}" for d in _workdirs() if _of_run([d.name], run_id)]
    left += [f"process {p}" for p in procs.pids_running(f"{PREFIX}{run_id}-")]
    return left


def clean_stale() -> list[str]:
    """Remove the rigs of processes that are gone (crashed runs); return their run ids."""
    names = _netns_names() + _link_names() + [d.name for d in _workdirs()]
    runs = {r for r in map(_run_of, names) if r is not None}
    stale = sorted(rid for pid, rid in runs if not procs.pid_alive(pid))
    for rid in stale:
        remove_run(rid)
    return stale


def _free_subnet(prefix_len: int = 24) -> ipaddress.IPv4Network:
    """A /24 of SUPERNET that overlaps no address or route on this machine."""
    used = []
    for r in _ip_json("-4", "route", "show", "table", "all"):
        dst = r.get("dst", "")
        if dst and dst != "default":
            with contextlib.suppress(ValueError):
                used.append(ipaddress.ip_network(dst, strict=False))
    for link in _ip_json("-4", "addr", "show"):
        for a in link.get("addr_info", []):
            used.append(ipaddress.ip_network(f"{a['local']}/{a['prefixlen']}", strict=False))
    subnets = list(SUPERNET.subnets(new_prefix=prefix_len))
    start = os.getpid() % len(subnets)
    for net in subnets[start:] + subnets[:start]:
        if not any(net.overlaps(u) for u in used):
            return net
    raise RigError(f"no free /{prefix_len} left in {SUPERNET} on this machine")


# --------------------------------------------------------------------------- the rig


class TwoHostRig:
    """Two hosts in network namespaces on one bridge, each with its own sshd.

    Use as a context manager (or call :meth:`build` and :meth:`teardown`); teardown runs also when
    the body raises, and is safe to call twice.
    """

    def __init__(self, names: Sequence[str] = ("a", "b"), *, ifname: str = IFNAME,
                 sshd: bool = True) -> None:
        self.run_id = _new_run_id()
        self.tag = f"{PREFIX}{self.run_id}"
        self.names = tuple(names)
        self.ifname = ifname
        self.with_sshd = sshd
        self.user = "root"
        self.bridge = f"{self.tag}br"
        self.subnet: ipaddress.IPv4Network | None = None
        self.controller_ip = ""
        self.hosts: dict[str, Host] = {}
        self.workdir = Path()
        self._sshd: dict[str, subprocess.Popen] = {}
        self._procs: list[subprocess.Popen] = []
        self._built = False
        if len(self.bridge) > 15 or any(len(n) != 1 for n in self.names):
            raise RigError(f"names too long for Linux interfaces: {self.bridge}, {self.names}")

    # ---- paths and ssh --------------------------------------------------------

    @property
    def key(self) -> Path:
        """The client's private key (ed25519, made for the run)."""
        return self.workdir / "id_ed25519"

    @property
    def ssh_config(self) -> Path:
        """The ssh_config for ``ssh -F``/``scp -F``: aliases, user root, key, known_hosts."""
        return self.workdir / "ssh_config"

    @property
    def known_hosts(self) -> Path:
        return self.workdir / "known_hosts"

    @property
    def ssh_cmd(self) -> list[str]:
        """ssh with the rig's config: ``ssh_cmd + [alias, command]`` (ipyparallel's ``ssh_cmd``)."""
        return ["ssh", "-F", str(self.ssh_config)]

    @property
    def scp_cmd(self) -> list[str]:
        """scp with the rig's config (ipyparallel's ``scp_cmd``)."""
        return ["scp", "-F", str(self.ssh_config)]

    def host(self, h: str | Host) -> Host:
        """A host by name ("a"), alias ("rig-a"), namespace or address."""
        if isinstance(h, Host):
            return h
        for x in self.hosts.values():
            if h in (x.name, x.alias, x.netns, x.address):
                return x
        raise KeyError(f"no host {h!r} in this rig; hosts: {list(self.hosts)}")

    def ssh(self, h: str | Host, command: str, *, timeout: float = 15,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``command`` on host ``h`` over ssh."""
        return sh(self.ssh_cmd + [self.host(h).alias, command], timeout=timeout, check=check)

    # ---- commands inside a namespace -------------------------------------------

    def _exec(self, h: str | Host, cmd: str | Sequence[str]) -> list[str]:
        argv = ["sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        return ["ip", "netns", "exec", self.host(h).netns, *argv]

    def run(self, h: str | Host, cmd: str | Sequence[str], *, timeout: float = 15,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` (argv, or a string for ``sh -c``) inside host ``h``'s namespace."""
        return sh(self._exec(h, cmd), timeout=timeout, check=check)

    def popen(self, h: str | Host, cmd: str | Sequence[str], **kw) -> subprocess.Popen:
        """Start ``cmd`` inside host ``h``'s namespace; teardown stops it.

        The child gets SIGTERM when the calling thread ends (``preexec_fn=None`` turns that off):
        call it from a thread that lives as long as the rig.
        """
        kw.setdefault("preexec_fn", _die_with_parent)
        p = subprocess.Popen(self._exec(h, cmd), **kw)
        self._procs.append(p)
        return p

    # ---- build and teardown ---------------------------------------------------

    def __enter__(self) -> TwoHostRig:
        return self.build()

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    def build(self) -> TwoHostRig:
        """Make the bridge, the namespaces, links, keys and sshds. Cleans stale runs first."""
        reason = prerequisites()
        if reason:
            raise RigUnavailable(reason)
        self._built = True
        try:
            self._build()
        except BaseException:
            with contextlib.suppress(RigError):  # keep the build error; clean_stale gets the rest
                self.teardown()
            raise
        return self

    def _build(self) -> None:
        with _lock():
            clean_stale()
            self.workdir = Path(tempfile.mkdtemp(prefix=f"{self.tag}-"))
            self.subnet = _free_subnet()
            addrs = list(self.subnet.hosts())
            self.controller_ip = str(addrs[0])
            plen = self.subnet.prefixlen
            sh(["ip", "link", "add", "name", self.bridge, "type", "bridge",
                "nf_call_iptables", "0", "nf_call_ip6tables", "0", "nf_call_arptables", "0"])
            _no_ipv6(self.bridge)
            sh(["ip", "addr", "add", f"{self.controller_ip}/{plen}", "dev", self.bridge])
            sh(["ip", "link", "set", self.bridge, "up"])
        for i, name in enumerate(self.names):
            h = Host(name=name, alias=f"rig-{name}", netns=f"{self.tag}-{name}",
                     address=str(addrs[i + 1]), ifname=self.ifname, peer=f"{self.tag}{name}")
            self.hosts[name] = h
            sh(["ip", "netns", "add", h.netns])
            self.run(h, "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6; "
                        "echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6; true")
            sh(["ip", "link", "add", h.peer, "type", "veth",
                "peer", "name", h.ifname, "netns", h.netns])
            _no_ipv6(h.peer)
            sh(["ip", "link", "set", h.peer, "master", self.bridge, "up"])
            self.run(h, ["ip", "addr", "add", f"{h.address}/{plen}", "dev", h.ifname])
            self.run(h, ["ip", "link", "set", h.ifname, "up"])
            self.run(h, ["ip", "link", "set", "lo", "up"])
        if self.with_sshd:
            self._make_keys()
            for h in self.hosts.values():
                self.start_sshd(h)

    def _make_keys(self) -> None:
        keygen = ["ssh-keygen", "-q", "-t", "ed25519", "-N", ""]
        sh(keygen + ["-C", f"{self.tag} client", "-f", str(self.key)])
        (self.workdir / "authorized_keys").write_text(self.key.with_suffix(".pub").read_text())
        known, cfg = [], []
        for h in self.hosts.values():
            hk = self.workdir / f"host_key_{h.name}"
            sh(keygen + ["-C", f"{self.tag} host {h.name}", "-f", str(hk)])
            known.append(f"{h.alias},{h.address} {hk.with_suffix('.pub').read_text().strip()}")
            (self.workdir / f"sshd_config_{h.name}").write_text(self._sshd_config(h, hk))
            cfg.append(f"Host {h.alias} {h.address}\n  HostName {h.address}\n")
        self.known_hosts.write_text("\n".join(known) + "\n")
        names = " ".join(f"{h.alias} {h.address}" for h in self.hosts.values())
        cfg.append(
            f"Host {names}\n"
            f"  User {self.user}\n"
            f"  Port 22\n"
            f"  IdentityFile {self.key}\n"
            "  IdentitiesOnly yes\n"
            "  IdentityAgent none\n"
            f"  UserKnownHostsFile {self.known_hosts}\n"
            "  GlobalKnownHostsFile /dev/null\n"
            "  StrictHostKeyChecking yes\n"
            "  CheckHostIP no\n"
            "  UpdateHostKeys no\n"
            "  BatchMode yes\n"
            "  ConnectTimeout 5\n"
            "  ServerAliveInterval 5\n"
            "  ServerAliveCountMax 3\n"
            "  ControlMaster no\n"
            "  ControlPath none\n"
            "  ForwardAgent no\n"
            "  ForwardX11 no\n"
            "  LogLevel ERROR\n"
        )
        self.ssh_config.write_text("\n".join(cfg))

    def _sshd_config(self, h: Host, host_key: Path) -> str:
        return (
            f"# sshd of rig host {h.alias} ({h.netns}); made for run {self.run_id}\n"
            f"ListenAddress {h.address}:22\n"
            f"HostKey {host_key}\n"
            f"PidFile {self.workdir / f'sshd_{h.name}.pid'}\n"
            f"AuthorizedKeysFile {self.workdir / 'authorized_keys'}\n"
            "AuthenticationMethods publickey\n"
            "PubkeyAuthentication yes\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "PermitRootLogin prohibit-password\n"
            f"AllowUsers {self.user}\n"
            "UsePAM no\n"
            "StrictModes no\n"  # the keys live under /tmp, which is world-writable
            "UseDNS no\n"
            "X11Forwarding no\n"
            "AllowAgentForwarding no\n"
            "PrintMotd no\n"
            "PrintLastLog no\n"
            "MaxStartups 50:30:100\n"  # many engines start at once
            "MaxSessions 50\n"
            "LogLevel INFO\n"
            f"Subsystem sftp {SFTP_SERVER}\n"  # scp speaks SFTP; ipyparallel copies files with it
        )

    def teardown(self) -> None:
        """Remove every namespace, link, key, file and process of this run. Idempotent."""
        if not self._built:
            return
        for p in list(self._sshd.values()) + self._procs:
            if p.poll() is None:
                p.terminate()
        for p in list(self._sshd.values()) + self._procs:
            try:
                p.wait(timeout=3)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=3)
        self._sshd.clear()
        self._procs.clear()
        remove_run(self.run_id)
        left = leftovers(self.run_id)
        if left:
            raise RigError(f"teardown of rig {self.run_id} left: {', '.join(left)}")
        self._built = False

    # ---- faults -----------------------------------------------------------------

    def start_sshd(self, h: str | Host, timeout: float = 10) -> None:
        """Start host ``h``'s sshd (``-D``, logging to a file) and wait until it listens."""
        h = self.host(h)
        old = self._sshd.get(h.name)
        if old is not None and old.poll() is None:
            return
        # sshd's compiled-in privilege separation directory; Debian's service creates it at boot.
        # Shared with any system sshd, so it is made if missing and never removed.
        PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
        log = self.workdir / f"sshd_{h.name}.log"
        with open(log, "ab") as out:
            start = out.tell()
            cfg = self.workdir / f"sshd_config_{h.name}"
            p = subprocess.Popen(
                self._exec(h, [SSHD, "-D", "-e", "-f", str(cfg)]),
                stdin=subprocess.DEVNULL, stdout=out, stderr=out, preexec_fn=_die_with_parent,
            )
        self._sshd[h.name] = p
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = log.read_bytes()[start:].decode(errors="replace")
            if "Server listening on" in text:
                return
            if p.poll() is not None:
                break
            time.sleep(0.02)
        tail = log.read_bytes()[start:].decode(errors="replace").strip()[-800:]
        raise RigError(f"sshd of {h.alias} in {h.netns} did not start listening on "
                       f"{h.address}:22 within {timeout} s (exit {p.poll()}): {tail}")

    def stop_sshd(self, h: str | Host, timeout: float = 5) -> None:
        """Stop host ``h``'s listening sshd (open sessions and what they started keep running)."""
        p = self._sshd.pop(self.host(h).name, None)
        if p is not None and p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=timeout)

    def sshd_running(self, h: str | Host) -> bool:
        """Whether host ``h``'s listening sshd (started by this rig) is alive."""
        p = self._sshd.get(self.host(h).name)
        return p is not None and p.poll() is None

    def link_down(self, h: str | Host) -> None:
        """Pull host ``h``'s cable: its bridge port goes down, its interface sees no carrier."""
        sh(["ip", "link", "set", self.host(h).peer, "down"])

    def link_up(self, h: str | Host) -> None:
        """Plug host ``h``'s cable back in."""
        sh(["ip", "link", "set", self.host(h).peer, "up"])

    def shape(self, rate: str = "1gbit", hosts: Sequence[str] | None = None) -> None:
        """Shape the bridge ports towards ``hosts`` (default: all): traffic *into* each host.

        Host to host, both directions cross one shaped port, at throughput ``rate`` (tc's
        units: "1gbit", "100mbit"), with ``tbf``. Controller to host is shaped, host to
        controller is not.
        """
        bps = _bits_per_second(rate)
        burst = max(bps // 8 // 250, 32 * 1024)  # one 4 ms tick, at least 32 KiB
        qdisc = ["tbf", "rate", rate, "burst", str(burst), "latency", "100ms"]
        for name in hosts or self.names:
            sh(["tc", "qdisc", "replace", "dev", self.host(name).peer, "root", *qdisc])

    def unshape(self) -> None:
        """Remove all shaping."""
        for h in self.hosts.values():
            sh(["tc", "qdisc", "del", "dev", h.peer, "root"], check=False)

    def describe(self) -> str:
        """A few lines for logs: hosts, addresses, controller, ssh config."""
        lines = [f"rig {self.run_id}: bridge {self.bridge} controller_ip {self.controller_ip}"]
        lines += [f"  {h.alias}: {h.address} on {h.ifname} in netns {h.netns}"
                  for h in self.hosts.values()]
        lines.append(f"  ssh -F {self.ssh_config} rig-a hostname")
        return "\n".join(lines)


def _no_ipv6(ifname: str) -> None:
    """No IPv6 on a rig interface: no link-local chatter leaves for addresses we did not make."""
    with contextlib.suppress(OSError):
        Path(f"/proc/sys/net/ipv6/conf/{ifname}/disable_ipv6").write_text("1")


def _bits_per_second(rate: str) -> int:
    m = re.fullmatch(r"([\d.]+)\s*([kmg]?)(bit|bps)", rate.strip().lower())
    if not m:
        raise ValueError(f"rate {rate!r}: use tc units such as '1gbit', '100mbit', '500kbit'")
    value = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]
    return int(value * (8 if m.group(3) == "bps" else 1))


def port_open(address: str, port: int, timeout: float = 1.0) -> bool:
    """Whether a TCP connect from this (the root) namespace to ``address:port`` succeeds."""
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def rig_or_skip(**kw) -> Iterator[TwoHostRig]:
    """A built rig for a pytest fixture; skips (fails under CI=true) where none can be built."""
    try:
        rig = TwoHostRig(**kw).build()
    except RigUnavailable as e:
        unavailable(f"two-host rig unavailable: {e}")
    try:
        yield rig
    finally:
        rig.teardown()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tests.rigs.twohosts [hold|clean]``: build a rig and keep it, or clean stale."""
    args = list(sys.argv[1:] if argv is None else argv) or ["hold"]
    if args[0] == "clean":
        print("removed stale runs:", ", ".join(clean_stale()) or "none")
        return 0
    if args[0] != "hold":
        print(main.__doc__)
        return 2

    def stop(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    with TwoHostRig() as rig:
        print(rig.describe(), "\nCtrl-C (or SIGTERM) removes it.", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
