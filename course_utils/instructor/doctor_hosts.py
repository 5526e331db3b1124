"""``course doctor --hosts PROFILE``: check every host of an SSH profile before a workshop.

One line per check and host, each failure with its fix, in bounded time (an unreachable host
costs ssh's ``ConnectTimeout``, not a hang). In order:

1. **ssh**: ``ssh HOST true`` with the profile's user, key and ssh options (all hosts at once);
2. **python**: the host's engine interpreter exists; course_utils, torch, TensorFlow and
   ipyparallel have the controller's versions (read from package metadata: nothing heavy is
   imported);
3. **gpus**: GPUs per host, and whether that is fewer than the engines the profile starts;
4. **interface**: ``socket_ifname`` exists on the host and has an IPv4 address;
5. **shared paths**: the course folder (and the profile's ``shared_paths``) is the same
   folder there: a file written here is read there (data, checkpoints, the venv path);
6. **ports**: the host reaches this machine's ``controller_ip`` on TCP ports opened for the
   check, and a candidate master port opened on the first host;
7. **all_reduce**: one process per host joins a real gloo group over the link (rank 0 on the
   first host, ``GLOO_SOCKET_IFNAME`` from the profile) and all-reduces; its time is shown.

A check that cannot run because an earlier one failed on that host is shown as ``[SKIP]``.
"""

from __future__ import annotations

import json
import secrets
import shlex
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..cluster.profiles import ClusterProfile, HostSpec, load_profile
from ..settings import course_root
from . import host_programs
from .host_programs.probe import course_version

#: ssh options the doctor adds after the profile's own: fail fast on an unreachable host.
DOCTOR_SSH = ("-o", "ConnectTimeout=5", "-o", "BatchMode=yes")
#: Distributions whose versions must match the controller's.
PACKAGES = {"torch": "torch", "tensorflow": "tensorflow", "ipyparallel": "ipyparallel"}


@dataclass
class HostCheck:
    """One line: a check on one host (or on all of them)."""

    name: str
    host: str
    status: str  # PASS, FAIL, SKIP
    detail: str
    fix: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status != "FAIL"

    def line(self) -> str:
        text = f"[{self.status}] {self.name} {self.host}: {self.detail}"
        if self.status == "FAIL" and self.fix:
            text += f" -> fix: {self.fix}"
        return text


class HostDoctor:
    """Runs the checks of one profile; :meth:`run` yields the lines as they are known."""

    def __init__(self, profile: ClusterProfile, timeout: float = 60.0,
                 emit: Callable[[str], None] = print) -> None:
        if profile.launcher != "ssh" or not profile.hosts:
            raise ValueError(f"profile {profile.name!r} is not an SSH profile with [[hosts]]")
        self.prof = profile
        self.timeout = timeout
        self.emit = emit
        self.results: list[HostCheck] = []
        self.deadline = time.monotonic() + timeout
        self.ok_hosts: list[HostSpec] = list(profile.hosts)
        self.probe: dict[str, dict[str, Any]] = {}

    # ---- plumbing ------------------------------------------------------------------------
    def left(self, cap: float) -> float:
        return max(1.0, min(cap, self.deadline - time.monotonic()))

    def add(self, c: HostCheck) -> None:
        self.results.append(c)
        self.emit(c.line())

    def ssh_argv(self, h: HostSpec, command: str) -> list[str]:
        p = self.prof
        opts = ["-F", p.ssh_config] if p.ssh_config else []
        return [*p.ssh_cmd, *opts, *p.ssh_args, *DOCTOR_SSH, p.destination(h), command]

    def ssh(self, h: HostSpec, command: str, stdin: str | None = None,
            cap: float = 30.0) -> tuple[int, str, str, float]:
        """(returncode, stdout, stderr, seconds); returncode 124 when it ran out of time."""
        t0 = time.monotonic()
        try:
            cp = subprocess.run(self.ssh_argv(h, command), input=stdin, capture_output=True,
                                text=True, timeout=self.left(cap))
            return cp.returncode, cp.stdout, cp.stderr, time.monotonic() - t0
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            return 124, out, "timed out", time.monotonic() - t0

    def each(self, hosts: Sequence[HostSpec], fn: Callable[[HostSpec], Any]) -> list[Any]:
        """``fn(host)`` for every host in parallel; results in host order."""
        results: list[Any] = [None] * len(hosts)

        def run(i: int, h: HostSpec) -> None:
            try:
                results[i] = fn(h)
            except Exception as exc:  # reported as that host's failure
                results[i] = exc

        threads = [threading.Thread(target=run, args=(i, h), daemon=True)
                   for i, h in enumerate(hosts)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(self.left(120))
        return results

    def skip(self, name: str, hosts: Sequence[HostSpec], why: str) -> None:
        for h in hosts:
            self.add(HostCheck(name, h.host, "SKIP", why))

    def python_of(self, h: HostSpec) -> str:
        return h.python or self.prof.engine_python or "python3"

    # ---- checks --------------------------------------------------------------------------
    def check_ssh(self) -> None:
        def one(h: HostSpec) -> HostCheck:
            rc, _, err, dt = self.ssh(h, "true", cap=15)
            dest = self.prof.destination(h)
            if rc == 0:
                return HostCheck("ssh", h.host, "PASS", f"{dest} answered in {dt:.2f} s",
                                 seconds=dt)
            last = (err.strip().splitlines() or [f"exit {rc}"])[-1]
            low = last.lower()
            if "refused" in low:
                fix = (f"sshd is not running (or listens elsewhere) on {h.host}: start it "
                       "(`systemctl start ssh`) or fix Port/HostName in the ssh config")
            elif "timed out" in low or rc == 124 or "no route" in low or "unreachable" in low:
                fix = (f"{h.host} does not answer on the network: check it is up, its cable/"
                       "link and the route from here (ping its address)")
            elif "permission denied" in low:
                fix = (f"the key is not accepted for {dest}: ssh-copy-id, or set user/"
                       "ssh_config (IdentityFile) in the profile")
            elif "host key" in low:
                fix = "accept the host's key once (ssh it by hand) or fix known_hosts"
            else:
                fix = f"run `{' '.join(self.ssh_argv(h, 'true'))}` by hand and fix what it says"
            return HostCheck("ssh", h.host, "FAIL", f"{dest}: {last} ({dt:.1f} s)", fix,
                             seconds=dt)

        checks = self.each(self.prof.hosts, one)
        for c in checks:
            self.add(c)
        self.ok_hosts = [h for h, c in zip(self.prof.hosts, checks, strict=True) if c.ok]
        bad = [h for h in self.prof.hosts if h not in self.ok_hosts]
        for name in ("python", "gpus", "interface", "shared paths", "ports"):
            self.skip(name, bad, "ssh failed")

    def check_probe(self, listen_ports: list[int], marker: str, shared: dict[str, str]) -> None:
        """python, versions, gpus, interface, shared paths, controller ports: one ssh per host."""
        connect = [f"{self.prof.controller_ip}:{p}" for p in listen_ports]
        args = json.dumps({"packages": PACKAGES, "shared": shared, "marker": marker,
                           "connect": connect, "timeout": 3})
        here = local_versions()

        def one(h: HostSpec) -> tuple[int, str, str, float]:
            return self.ssh(h, f"{shlex.quote(self.python_of(h))} - {shlex.quote(args)}",
                            stdin=host_programs.source("probe"), cap=40)

        for h, res in zip(self.ok_hosts, self.each(self.ok_hosts, one), strict=True):
            rc, out, err, dt = res if isinstance(res, tuple) else (1, "", repr(res), 0.0)
            py = self.python_of(h)
            if "@@PROBE" not in out:
                last = (err.strip().splitlines() or [f"exit {rc}"])[-1]
                missing = rc == 127 or "not found" in last or "No such file" in last
                self.add(HostCheck(
                    "python", h.host, "FAIL",
                    f"{py}: {'not found' if missing else last}",
                    f"set python for {h.host} in the profile to the course venv's interpreter "
                    f"there (here: {sys.executable}); install the course at the same path on "
                    "every host" if missing else "run the probe by hand: ssh HOST PYTHON -V"))
                self.skip("gpus", [h], "python failed")
                self.skip("interface", [h], "python failed")
                self.skip("shared paths", [h], "python failed")
                self.skip("ports", [h], "python failed")
                continue
            info = json.loads(out.split("@@PROBE", 1)[1].strip().splitlines()[0])
            self.probe[h.host] = info
            self.add(self._versions(h, py, info, here))
            self.add(self._gpus(h, info))
            self.add(self._interface(h, info))
            self.add(self._shared(h, info))
            self.add(self._ports(h, info, connect))

    def _versions(self, h: HostSpec, py: str, info: dict[str, Any],
                  here: dict[str, str | None]) -> HostCheck:
        theirs = info["versions"]
        diff = [f"{k} {theirs.get(k)} (here {v})" for k, v in here.items()
                if (theirs.get(k) or "").split(" at ")[0] != (v or "").split(" at ")[0]]
        detail = (f"{py} (Python {info['python']}): " + ", ".join(
            f"{k} {str(theirs.get(k)).split(' at ')[0]}" for k in here))
        if diff:
            return HostCheck("python", h.host, "FAIL", detail + "; differs: " + "; ".join(diff),
                             "install the same versions on every host: the course venv "
                             "(`pip install -e '.[test]'`) at the same path everywhere")
        return HostCheck("python", h.host, "PASS", detail + " (same as here)")

    def _gpus(self, h: HostSpec, info: dict[str, Any]) -> HostCheck:
        gpus = int(info.get("gpus", 0))
        if gpus == 0:
            return HostCheck("gpus", h.host, "PASS",
                             f"0 GPUs for {h.engines} engine(s): backend gloo on CPU")
        if gpus < h.engines:
            return HostCheck("gpus", h.host, "FAIL",
                             f"{gpus} GPU(s) for {h.engines} engines: ranks would share a GPU",
                             f"set engines = {gpus} for {h.host} (one engine per GPU)")
        return HostCheck("gpus", h.host, "PASS",
                         f"{gpus} GPU(s) for {h.engines} engine(s): one GPU per local rank")

    def _interface(self, h: HostSpec, info: dict[str, Any]) -> HostCheck:
        name = self.prof.socket_ifname
        ifs = info.get("interfaces", {})
        if not name:
            return HostCheck("interface", h.host, "PASS",
                             "no socket_ifname in the profile: gloo/NCCL pick an interface "
                             "themselves (set it when hosts have several)")
        listing = ", ".join(f"{k} {'/'.join(v) or '-'}" for k, v in ifs.items())
        if name not in ifs:
            return HostCheck("interface", h.host, "FAIL",
                             f"socket_ifname {name!r} does not exist (it has: {listing})",
                             "set socket_ifname to the interface of the shared link on every "
                             "host (`ip -4 addr`); hosts need the same name")
        if not ifs[name]:
            return HostCheck("interface", h.host, "FAIL", f"{name} has no IPv4 address",
                             f"bring {name} up with an address on the shared link")
        return HostCheck("interface", h.host, "PASS", f"{name} {', '.join(ifs[name])}")

    def _shared(self, h: HostSpec, info: dict[str, Any]) -> HostCheck:
        bad = {p: v for p, v in info.get("shared", {}).items() if v is not True}
        paths = ", ".join(info.get("shared", {}))
        if bad:
            detail = "; ".join(f"{p}: {'no such folder' if v == 'missing' else 'not the same'}"
                               for p, v in bad.items())
            return HostCheck("shared paths", h.host, "FAIL", detail,
                             "mount the course folder (data, checkpoints) at the same path on "
                             "every host (NFS home), or copy data there and keep checkpoints "
                             "on rank 0's host")
        return HostCheck("shared paths", h.host, "PASS", f"{paths}: the same folder as here")

    def _ports(self, h: HostSpec, info: dict[str, Any], connect: list[str]) -> HostCheck:
        res = info.get("ports", {})
        bad = {a: r for a, r in res.items() if r != "ok"}
        if bad:
            return HostCheck("ports", h.host, "FAIL",
                             "cannot reach the controller at " + "; ".join(
                                 f"{a} ({r})" for a, r in bad.items()),
                             f"let the hosts reach {self.prof.controller_ip} on TCP (firewall: "
                             "allow the course's ports from the hosts' subnet) and check "
                             "controller_ip is this machine's address on the shared link")
        return HostCheck("ports", h.host, "PASS", f"reaches controller ports {', '.join(connect)}")

    def check_master_port(self) -> tuple[str, int] | None:
        """A listener on the first host's link address; every host must connect to it."""
        first = self.prof.hosts[0]
        hosts = [h for h in self.ok_hosts if h.host in self.probe]
        if first not in hosts:
            self.skip("master port", self.prof.hosts, f"first host {first.host} failed above")
            return None
        addr = self._link_addr(first)
        if addr is None:
            self.skip("master port", hosts, f"{first.host} has no address on the interface")
            return None
        argv = self.ssh_argv(first, f"{shlex.quote(self.python_of(first))} - {addr} "
                                    f"{self.left(20):.0f} {len(hosts)}")
        listener = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, text=True)
        try:
            listener.stdin.write(host_programs.source("listen"))
            listener.stdin.close()
            line = _readline(listener, self.left(15))
            if not line.startswith("@@PORT"):
                self.skip("master port", hosts, "could not open a port on the first host")
                return None
            port, spare = int(line.split()[1]), int(line.split()[2])
            target = f"{addr}:{port}"
            code = ("import socket,sys;socket.create_connection((sys.argv[1],int(sys.argv[2])),"
                    "timeout=3).close()")

            def one(h: HostSpec) -> tuple[int, str, str, float]:
                return self.ssh(h, f"{shlex.quote(self.python_of(h))} -c {shlex.quote(code)} "
                                   f"{addr} {port}", cap=15)

            for h, res in zip(hosts, self.each(hosts, one), strict=True):
                rc, _, err, _ = res if isinstance(res, tuple) else (1, "", repr(res), 0)
                if rc == 0:
                    self.add(HostCheck("master port", h.host, "PASS", f"reaches {target}"))
                else:
                    last = (err.strip().splitlines() or [f"exit {rc}"])[-1]
                    self.add(HostCheck("master port", h.host, "FAIL",
                                       f"cannot reach {target} on {first.host}: {last}",
                                       f"allow TCP between the hosts on the shared link "
                                       f"(firewall on {first.host}), check the route"))
            return addr, spare
        finally:
            try:
                listener.wait(timeout=5)
            except subprocess.TimeoutExpired:
                listener.kill()
                listener.wait(timeout=5)

    def _link_addr(self, h: HostSpec) -> str | None:
        ifs = self.probe.get(h.host, {}).get("interfaces", {})
        name = self.prof.socket_ifname
        if name and ifs.get(name):
            return ifs[name][0]
        return h.address

    def check_all_reduce(self, master: tuple[str, int] | None,
                         nbytes: int = 4 * 2**20) -> None:
        bad = [c.host for c in self.results if c.status == "FAIL"]
        if bad or master is None:
            self.add(HostCheck("all_reduce", "all hosts", "SKIP",
                               f"fix the failures above first ({', '.join(sorted(set(bad)))})"))
            return
        addr, port = master  # a port the first host just had free
        env = {"OMP_NUM_THREADS": "1"}
        if self.prof.socket_ifname:
            env["GLOO_SOCKET_IFNAME"] = self.prof.socket_ifname
        world = len(self.prof.hosts)
        pg_timeout = max(5.0, min(15.0, self.left(60) - 10))

        def one(i: int) -> tuple[int, str, str, float]:
            h = self.prof.hosts[i]
            a = json.dumps({"rank": i, "world": world, "master": f"{addr}:{port}", "env": env,
                            "timeout": pg_timeout, "nbytes": nbytes})
            return self.ssh(h, f"{shlex.quote(self.python_of(h))} - {shlex.quote(a)}",
                            stdin=host_programs.source("all_reduce"),
                            cap=pg_timeout + 40)

        t0 = time.monotonic()
        results = self.each([HostSpec(str(i), 1) for i in range(world)],
                            lambda hs: one(int(hs.host)))
        wall = time.monotonic() - t0
        want = world * (world + 1) / 2
        outs = []
        for h, res in zip(self.prof.hosts, results, strict=True):
            rc, out, err, _ = res if isinstance(res, tuple) else (1, "", repr(res), 0)
            if "@@AR" in out:
                outs.append(json.loads(out.split("@@AR", 1)[1].strip().splitlines()[0]))
            else:
                last = (err.strip().splitlines() or [f"exit {rc}"])[-1]
                self.add(HostCheck("all_reduce", h.host, "FAIL", last[-300:],
                                   "see the checks above; run `course doctor --hosts` again"))
                return
        sums = [o["sum"] for o in outs]
        ok = all(s == want for s in sums) and all(o["big_ok"] for o in outs)
        secs = max(o["seconds"] for o in outs)
        gbps = nbytes / secs / 1e9 * 2 * (world - 1) / world if world > 1 else 0.0
        self.add(HostCheck(
            "all_reduce", "all hosts", "PASS" if ok else "FAIL",
            f"gloo over {self.prof.socket_ifname or 'default interface'}, rank 0 at "
            f"{addr}:{port}: sum {sums} (want {want:g}); {nbytes / 2**20:g} MiB in "
            f"{secs * 1e3:.1f} ms (busbw {gbps:.2f} GB/s); {wall:.1f} s with start-up",
            "" if ok else "report this: gloo returned a wrong sum", seconds=wall))

    def run(self) -> list[HostCheck]:
        t0 = time.monotonic()
        marker = f".course-doctor-{secrets.token_hex(4)}"
        token = secrets.token_hex(8)
        shared_paths = [str(course_root()), *self.prof.shared_paths]
        written = []
        listeners = []
        try:
            for p in shared_paths:
                try:
                    (Path(p) / marker).write_text(token)
                    written.append(Path(p) / marker)
                except OSError:
                    pass
            for _ in range(2):  # stand-ins for the controller's ports, on controller_ip only
                s = socket.socket()
                s.bind((self.prof.controller_ip or "127.0.0.1", 0))
                s.listen(16)
                listeners.append(s)
            self.check_ssh()
            if self.ok_hosts:
                self.check_probe([s.getsockname()[1] for s in listeners], marker,
                                 {p: token for p in shared_paths})
            self.check_all_reduce(self.check_master_port())
        finally:
            for s in listeners:
                s.close()
            for f in written:
                f.unlink(missing_ok=True)
        self.elapsed = time.monotonic() - t0
        return self.results


def _readline(p: subprocess.Popen, timeout: float) -> str:
    box: list[str] = []
    t = threading.Thread(target=lambda: box.append(p.stdout.readline()), daemon=True)
    t.start()
    t.join(timeout)
    return box[0].strip() if box else ""


def local_versions() -> dict[str, str | None]:
    """The controller's own versions, read the way the probe reads them on a host."""
    import importlib.metadata as md

    out: dict[str, str | None] = {"course_utils": course_version()}
    for label, dist in PACKAGES.items():
        try:
            out[label] = md.version(dist)
        except md.PackageNotFoundError:
            out[label] = None
    return out


def run_host_checks(profile: str | ClusterProfile, timeout: float = 90.0,
                    emit: Callable[[str], None] = print) -> list[HostCheck]:
    """Run every check of ``course doctor --hosts`` and print one line each."""
    prof = load_profile(profile)
    doc = HostDoctor(prof, timeout=timeout, emit=emit)
    results = doc.run()
    failed = [c for c in results if c.status == "FAIL"]
    emit(f"{len(results) - len(failed)} passed or skipped, {len(failed)} failed "
         f"in {doc.elapsed:.1f} s (profile {prof.name}, {len(prof.hosts)} hosts)")
    return results


def main(argv: Sequence[str] | None = None) -> int:  # pragma: no cover - thin CLI face
    import argparse

    ap = argparse.ArgumentParser(prog="course doctor --hosts")
    ap.add_argument("profile")
    ap.add_argument("--timeout", type=float, default=90.0)
    a = ap.parse_args(argv)
    return 1 if any(c.status == "FAIL" for c in run_host_checks(a.profile, a.timeout)) else 0
