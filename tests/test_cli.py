"""The ``course`` command: doctor (pass and fail), lab headless, bench output."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

from course_utils import procs
from course_utils.cli import build_parser, main
from course_utils.cluster.ports import free_port

COURSE = [sys.executable, "-m", "course_utils.cli"]


def run(args, env=None, timeout=240):
    return subprocess.run(COURSE + args, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def engine_pids(cluster_id: str) -> list[int]:
    """ipyparallel processes (controller, engines) whose environment names this cluster id."""
    return [pid for pid in procs.pids_with_environ(f"IPP_CLUSTER_ID={cluster_id}")
            if "ipyparallel" in " ".join(procs.cmdline(pid))]


def test_parser_knows_every_command():
    p = build_parser()
    for cmd in (["lab", "--no-browser", "--port", "1"], ["doctor"], ["bench", "startup"],
                ["stop"]):
        assert p.parse_args(cmd).func
    assert main(["lab", "--engines", "0"]) == 2


def test_doctor_fails_clearly_without_torch(tmp_path):
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('torch is not installed')\n")
    out = run(["doctor", "--no-tf"], env={"PYTHONPATH": str(tmp_path)})
    assert out.returncode == 1
    assert "[FAIL] torch: cannot import torch (ImportError: torch is not installed) -> fix:" \
        in out.stdout
    assert "[FAIL] cluster: skipped" in out.stdout


def test_doctor_fails_clearly_when_engines_cannot_start():
    out = run(["doctor", "--no-tf", "--timeout", "20"], env={"COURSE_ENGINE_PYTHON": "/bin/false"})
    assert out.returncode == 1
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("[FAIL] cluster"))
    assert "engines did not start" in line and "-> fix:" in line


KERNEL_RESTARTS = """
import course_utils as cu
cc = cu.start()
assert not cc.owned
cu.restart()  # what every TF teardown does: new engines, started by this process
print("restarted engines", [r.pid for r in cc.ranks])
"""


def test_lab_headless_answers_and_leaves_no_engines():
    port = free_port()
    cid = f"pytest-lab-{os.getpid()}"
    env = {**os.environ, "COURSE_CLUSTER_ID": cid}
    proc = subprocess.Popen(
        COURSE + ["lab", "--no-browser", "--port", str(port), "--",
                  "--IdentityProvider.token=t0k"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        status = None
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            try:
                url = f"http://127.0.0.1:{port}/api/status?token=t0k"
                with urllib.request.urlopen(url, timeout=2) as r:
                    status = json.loads(r.read())
                break
            except OSError:
                time.sleep(0.5)
        assert status is not None, "JupyterLab never answered /api/status"
        assert "started" in status
        assert len(engine_pids(cid)) >= 3  # controller + 2 engines
        # A notebook kernel replaces the lab's engines (cu.restart, every TF teardown).
        kernel = subprocess.run([sys.executable, "-c", KERNEL_RESTARTS], env=env, text=True,
                                capture_output=True, timeout=120)
        assert kernel.returncode == 0, kernel.stdout + kernel.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert "2 engines ready" in out
    # SIGTERM, then SIGKILL after 2 s: on a loaded machine the processes take a while to go
    deadline = time.time() + 15
    while engine_pids(cid) and time.time() < deadline:
        time.sleep(0.2)
    left = {pid: (procs.parent(pid), " ".join(procs.cmdline(pid))[-60:])
            for pid in engine_pids(cid)}
    assert not left, (f"engines left behind after course lab stopped (pid: parent, command): "
                      f"{left}; the kernel said {kernel.stdout[-300:]!r}; the lab: {out[-800:]}")


def test_bench_startup_prints_json_last():
    # one engine: the JSON's shape is what is tested here (`make bench` measures two)
    out = run(["bench", "startup", "--engines", "1", "--repeat", "20"])
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    for key in ("cold_ready_s", "warm_ready_s", "raw_cold_ready_s", "helper_roundtrip_ms",
                "raw_roundtrip_ms", "roundtrip_ratio"):
        assert result[key] > 0, key


def test_doctor_passes_here_and_its_tf_check_trains_a_step_on_a_ps():
    out = run(["doctor"])
    assert out.returncode == 0, out.stdout + out.stderr
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("[")]
    assert all(ln.startswith("[PASS]") for ln in lines), out.stdout
    names = {ln.split("]")[1].split(":")[0].strip() for ln in lines}
    assert {"python", "torch", "ipyparallel", "cluster", "gloo all_reduce"} <= names
    assert "sum over ranks of (rank+1) = [3.0, 3.0]" in out.stdout
    line = next(ln for ln in out.stdout.splitlines() if "tf parameter server" in ln)
    assert "ps:0 on rank 1, worker:0 on rank 0" in line, line
    assert "one step moved w 0 -> 0.600" in line, line


def test_doctor_skips_the_tf_cluster_check_without_tensorflow(tmp_path):
    fake = tmp_path / "tensorflow"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('tensorflow is not installed')\n")
    out = run(["doctor"], env={"PYTHONPATH": str(tmp_path)})
    assert out.returncode == 1
    assert "[FAIL] tensorflow: cannot import" in out.stdout and "-> fix:" in out.stdout
    assert "tf parameter server" not in out.stdout
    assert "[PASS] gloo all_reduce" in out.stdout
