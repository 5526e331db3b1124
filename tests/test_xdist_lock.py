"""conftest's ``MachineLock``: how the suite's timing-sensitive tests get the machine to
themselves when ``make test`` shares the suite between xdist workers."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from conftest import MachineLock, alone

ROOT = Path(__file__).resolve().parents[1]
HOLD = textwrap.dedent("""
    import sys, time
    from conftest import MachineLock
    lock = MachineLock(sys.argv[1])
    print("taking", flush=True)
    lock.take(sys.argv[2])
    print("held", flush=True)
    time.sleep(float(sys.argv[3]))
""")


def _line(proc: subprocess.Popen, timeout: float = 30.0) -> str:
    """The child's next line, or a failure after ``timeout`` s (a broken lock must not hang
    the suite)."""
    got: list[str] = []  # a thread, not select(): the line may already sit in the buffer
    reader = threading.Thread(target=lambda: got.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if not got:
        proc.kill()
        pytest.fail(f"the lock's child said nothing for {timeout:g} s")
    return got[0].strip()


def _start(folder: Path, kind: str, seconds: float) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder), kind, str(seconds)],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert _line(proc) == "taking"
    return proc


def _other_worker(folder: Path, kind: str, seconds: float) -> subprocess.Popen:
    proc = _start(folder, kind, seconds)
    assert _line(proc) == "held"
    return proc


def test_an_exclusive_test_waits_for_the_shared_ones_and_they_for_it(tmp_path):
    mine = MachineLock(str(tmp_path))
    other = _other_worker(tmp_path, "exclusive", 1.5)
    t0 = time.monotonic()
    mine.take("shared")
    assert time.monotonic() - t0 > 1.0, "took the shared lock while the other held it alone"
    other.wait(10)
    other = _other_worker(tmp_path, "shared", 1.5)  # two shared holders at once: no waiting
    t0 = time.monotonic()
    mine.release()
    mine.take("shared")
    assert time.monotonic() - t0 < 0.5
    mine.release()
    mine.take("exclusive")
    assert time.monotonic() - t0 > 1.0, "took it alone while another test shared it"
    mine.release()
    other.wait(10)


def test_a_waiting_exclusive_test_is_not_starved_by_shared_ones(tmp_path):
    mine = MachineLock(str(tmp_path))
    mine.take("shared")
    writer = _start(tmp_path, "exclusive", 1)
    time.sleep(1.0)  # the writer waits on our shared lock, holding the turnstile
    mine.release()
    t0 = time.monotonic()
    mine.take("shared")  # a new shared test queues behind the writer
    assert _line(writer) == "held"
    assert time.monotonic() - t0 > 0.7
    writer.wait(10)
    mine.release()


def test_alone_names_the_timing_tests():
    assert alone("notebooks/07_performance.ipynb::Cell 3")
    assert alone("notebooks/09_capstone.ipynb::Cell 3 (pass 2)")
    assert not alone("notebooks/00_cluster_tour.ipynb::Cell 3 (pass 3)")
    assert not alone("notebooks/01_collectives.ipynb::Cell 0")
