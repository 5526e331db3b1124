"""The programs ``course doctor --hosts`` sends to each host, run here as ssh would run them
(``PYTHON -`` with the text on stdin), without ssh: the two-host rig (tests/test_two_hosts.py)
runs them over ssh for real."""

import json
import socket
import subprocess
import sys

import pytest

from course_utils.instructor import doctor_hosts, host_programs


def run_on_stdin(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-", *args], input=host_programs.source(name),
                          capture_output=True, text=True, timeout=60)


def test_probe_reports_versions_shared_folders_and_ports(tmp_path):
    (tmp_path / "marker").write_text("token")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(4)
        addr = f"127.0.0.1:{s.getsockname()[1]}"
        args = json.dumps({"packages": doctor_hosts.PACKAGES, "marker": "marker",
                           "shared": {str(tmp_path): "token", str(tmp_path / "no"): "token"},
                           "connect": [addr], "timeout": 3})
        cp = run_on_stdin("probe", args)
    assert "@@PROBE" in cp.stdout, cp.stderr
    info = json.loads(cp.stdout.split("@@PROBE", 1)[1])
    assert info["shared"] == {str(tmp_path): True, str(tmp_path / "no"): "missing"}
    assert info["ports"] == {addr: "ok"}
    # the probe reads versions the way the controller reads its own: they compare equal here
    assert info["versions"] == doctor_hosts.local_versions()


def test_listen_prints_two_ports_and_exits_once_every_host_connected():
    p = subprocess.Popen([sys.executable, "-", "127.0.0.1", "20", "1"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        p.stdin.write(host_programs.source("listen"))
        p.stdin.close()
        tag, port, spare = p.stdout.readline().split()
        assert tag == "@@PORT" and port != spare
        socket.create_connection(("127.0.0.1", int(port)), timeout=5).close()
        assert p.wait(timeout=10) == 0
    finally:
        if p.poll() is None:
            p.kill()


def test_an_unknown_program_is_refused():
    with pytest.raises(ValueError, match="probe"):
        host_programs.source("nope")
