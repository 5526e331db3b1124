"""The two-host test rig (tests/rigs/twohosts.py): ssh into each host, traffic, shaping, faults.

Builds the rig once for the module; skips where it cannot be built (not root, no ``ip netns``,
no OpenSSH and installing not allowed), and fails instead under ``CI=true``.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.rigs import twohosts as th
from tests.rigs.twohosts import TwoHostRig

# The rig may first apt-get install OpenSSH (CI=true).
pytestmark = pytest.mark.timeout(1200)

ECHO_PORT = 5601
REPO = Path(__file__).resolve().parents[1]

# A TCP echo server: one thread per connection, prints "ready" once it listens.
ECHO = r"""
import socket, sys, threading
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(16)
print("ready", flush=True)
def serve(c):
    with c:
        while data := c.recv(1 << 16):
            c.sendall(data)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""

# Connect to an echo server, send `size` bytes `count` times, time each full echo; print JSON.
CLIENT = r"""
import json, socket, sys, threading, time
host, port, size, count, timeout = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
    int(sys.argv[4]), float(sys.argv[5])
try:
    c = socket.create_connection((host, port), timeout=timeout)
except OSError as e:
    print(json.dumps({"ok": False, "error": repr(e)}))
    raise SystemExit
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
c.settimeout(10)
times = []
for _ in range(count):
    t = time.perf_counter()
    sender = threading.Thread(target=c.sendall, args=(b"x" * size,))
    sender.start()
    got = 0
    while got < size:
        got += len(c.recv(1 << 16))
    sender.join()
    times.append(time.perf_counter() - t)
print(json.dumps({"ok": True, "times": times}))
"""


@pytest.fixture(scope="module")
def rig():
    with th.rig_or_skip() as r:
        yield r


@pytest.fixture(scope="module")
def echo_b(rig: TwoHostRig):
    """An echo server on host b's rig address; returns (address, port)."""
    b = rig.host("b")
    p = rig.popen(b, [sys.executable, "-c", ECHO, b.address, str(ECHO_PORT)],
                  stdout=subprocess.PIPE, text=True)
    ready, _, _ = select.select([p.stdout], [], [], 15)
    assert ready and p.stdout.readline().strip() == "ready", "echo server in b did not start"
    return b.address, ECHO_PORT


def echo_from(rig: TwoHostRig, host: str, target: tuple[str, int], size: int = 1,
              count: int = 1, timeout: float = 2.0) -> dict:
    """Run the echo client inside ``host``'s namespace; its JSON result."""
    cp = rig.run(host, [sys.executable, "-c", CLIENT, target[0], str(target[1]), str(size),
                        str(count), str(timeout)], timeout=30)
    return json.loads(cp.stdout)


def root_addresses() -> set[str]:
    """IPv4 addresses of the root namespace's own interfaces (not the rig's bridges, not lo)."""
    out = subprocess.run(["ip", "-j", "-4", "addr", "show"], capture_output=True, text=True,
                         check=True).stdout
    return {a["local"] for link in json.loads(out) for a in link.get("addr_info", [])
            if link["ifname"] != "lo" and not link["ifname"].startswith(th.PREFIX)}


def test_rate_units_and_run_names():
    assert th._bits_per_second("1gbit") == 10**9
    assert th._bits_per_second("40mbit") == 40 * 10**6
    assert th._bits_per_second("1mbps") == 8 * 10**6
    with pytest.raises(ValueError, match="tc units"):
        th._bits_per_second("fast")
    assert th._run_of("crig2ce9_12-a") == (0x2CE9, "2ce9_12")
    assert th._run_of("crig2ce9_1br") == (0x2CE9, "2ce9_1")
    assert th._of_run(["crig2ce9_1a", "crig2ce9_10a", "eth0"], "2ce9_1") == ["crig2ce9_1a"]
    assert th._run_of("eth0") is None


def test_without_root_the_rig_skips_and_under_ci_fails(monkeypatch):
    monkeypatch.setattr(th.os, "geteuid", lambda: 1000)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="needs root"):
        with th.rig_or_skip():
            pass
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI must run every rig: .*needs root"):
        with th.rig_or_skip():
            pass


def test_missing_openssh_names_the_install_command(monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("the check runs past the root check only as root")
    monkeypatch.setattr(th, "SSHD", "/nonexistent/sshd")
    reason = th.prerequisites(install=False)
    assert "/nonexistent/sshd" in reason and "apt-get install" in reason, reason
    assert "Enable: apt-get update" in reason


def test_ssh_lands_in_each_host(rig: TwoHostRig):
    outside = root_addresses()
    for name in rig.names:
        h = rig.host(name)
        out = rig.ssh(h, "hostname; ip -4 -o addr show").stdout
        lines = out.splitlines()
        assert lines[0] == socket.gethostname(), f"{h.alias}: hostname {lines[0]!r}"
        assert f"{h.ifname}    inet {h.address}/" in out, f"{h.alias} lacks {h.address}: {out}"
        leaked = [a for a in outside if a in out]
        assert not leaked, f"ssh {h.alias} ran in the root namespace? it sees {leaked}"
    # scp (SFTP subsystem) works: ipyparallel's SSH launcher copies connection files with it.
    src = rig.workdir / "scp-src.txt"
    src.write_text("hello from the controller\n")
    dst = rig.workdir / "scp-dst.txt"
    th.sh(rig.scp_cmd + ["-q", str(src), f"{rig.host('b').alias}:{dst}"])
    assert dst.read_text() == src.read_text()


def test_sshd_listens_only_on_the_rig_address(rig: TwoHostRig):
    for h in rig.hosts.values():
        out = rig.run(h, ["ss", "-Hltnp"]).stdout
        sshd = {line.split()[3] for line in out.splitlines() if '"sshd"' in line}
        assert sshd == {f"{h.address}:22"}, f"{h.alias}: sshd listens on {sshd}"
        assert th.port_open(h.address, 22), f"controller cannot reach {h.alias}:22"


def test_host_a_reaches_host_b(rig: TwoHostRig, echo_b):
    r = echo_from(rig, "a", echo_b, size=1000, count=3)
    assert r["ok"], f"a could not reach b's echo server at {echo_b}: {r}"
    assert len(r["times"]) == 3


def test_hosts_reach_the_controller_address_and_nothing_outside(rig: TwoHostRig):
    # The kernel/controller side: a listener in this (root) namespace on the bridge address.
    srv = socket.create_server((rig.controller_ip, 0))
    port = srv.getsockname()[1]

    def echo_once() -> None:
        c, _ = srv.accept()
        with c:
            c.sendall(c.recv(16))

    t = threading.Thread(target=echo_once, daemon=True)
    t.start()
    try:
        r = echo_from(rig, "b", (rig.controller_ip, port))
        assert r["ok"], f"b could not reach the controller address {rig.controller_ip}: {r}"
    finally:
        srv.close()
        t.join(timeout=5)
    for addr in root_addresses():  # no route out of a host: the machine's own addresses
        r = echo_from(rig, "a", (addr, 22), timeout=1.0)
        assert not r["ok"] and "unreachable" in r["error"], f"a reached {addr}: {r}"


def test_rate_shaping_slows_a_bulk_echo(rig: TwoHostRig, echo_b):
    size, rate = 1 << 20, "40mbit"
    expected = size * 8 / 40e6  # seconds for one direction at 40 Mbit/s: 0.21 s
    before = min(echo_from(rig, "a", echo_b, size=size, count=2)["times"])
    try:
        rig.shape(rate=rate)
        shaped = min(echo_from(rig, "a", echo_b, size=size, count=2)["times"])
    finally:
        rig.unshape()
    after = min(echo_from(rig, "a", echo_b, size=size, count=2)["times"])
    print(f"1 MiB echo a->b: {before * 1e3:.1f} ms, at {rate}: {shaped * 1e3:.1f} ms, "
          f"unshaped again: {after * 1e3:.1f} ms")
    # Lower bounds only: a rate limit cannot be beaten, while a loaded machine can make any
    # transfer slower; unshaped, the same echo must be clearly faster than shaped.
    assert shaped >= 0.8 * expected, f"at {rate} a 1 MiB echo took only {shaped:.3f} s"
    assert shaped > 2 * min(before, after), (before, shaped, after)


def test_link_down_makes_b_unreachable_and_up_restores_it(rig: TwoHostRig, echo_b):
    b = rig.host("b")
    rig.link_down(b)
    try:
        t = time.monotonic()
        r = echo_from(rig, "a", echo_b, timeout=1.0)
        assert not r["ok"], "b still answered with its link down"
        assert time.monotonic() - t < 5
        assert not th.port_open(b.address, 22, timeout=0.5)
    finally:
        rig.link_up(b)
    deadline = time.monotonic() + 5
    while not (r := echo_from(rig, "a", echo_b, timeout=1.0))["ok"]:
        assert time.monotonic() < deadline, f"b unreachable 5 s after link_up: {r}"
    assert rig.ssh(b, "true").returncode == 0


def test_stop_and_start_sshd(rig: TwoHostRig):
    b = rig.host("b")
    rig.stop_sshd(b)
    try:
        assert not rig.sshd_running(b)
        assert not th.port_open(b.address, 22)
        assert rig.ssh(b, "true", check=False).returncode == 255
    finally:
        rig.start_sshd(b)
    assert rig.ssh(b, "echo back").stdout.strip() == "back"


def test_teardown_removes_everything_when_the_body_fails(rig: TwoHostRig):
    with pytest.raises(RuntimeError, match="a test failed"):
        with TwoHostRig() as r:
            run_id = r.run_id
            r.popen("a", ["sleep", "60"])
            assert th.leftovers(run_id), "a built rig shows no namespaces or files"
            raise RuntimeError("a test failed")
    assert th.leftovers(run_id) == []


def test_a_crashed_run_is_cleaned_by_the_next(rig: TwoHostRig):
    # A process builds a rig, starts a process in host a that outlives it, and dies by SIGKILL.
    code = (
        "import os, signal\n"
        "from tests.rigs.twohosts import TwoHostRig\n"
        "r = TwoHostRig().build()\n"
        "r.popen('a', ['sleep', '60'], preexec_fn=None, stdout=-3, stderr=-3)\n"  # DEVNULL
        "print(r.run_id, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                        env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert cp.returncode == -signal.SIGKILL, cp.stderr
    run_id = cp.stdout.strip()
    left = th.leftovers(run_id)
    assert any(x.startswith("netns") for x in left) and any(x.startswith("link") for x in left)
    assert run_id in th.clean_stale()
    assert th.leftovers(run_id) == []
    assert rig.ssh("a", "true").returncode == 0, "cleaning a stale run touched the live rig"
