"""``course doctor``: one line per check, exit 0 only when every check passes.

Each failing line names the fix. Checks run in dependency order; the cluster checks use their
own cluster id so they never touch a running ``course lab``.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

INSTALL_FIX = "run `make lab` or `pip install -e '.[test]'` in the course's virtual environment"


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""

    def line(self) -> str:
        mark = "PASS" if self.ok else "FAIL"
        text = f"[{mark}] {self.name}: {self.detail}"
        if not self.ok and self.fix:
            text += f" -> fix: {self.fix}"
        return text


def version_check(module: str, label: str, minimum: tuple[int, ...] = ()) -> Check:
    """``module`` imports and is at least ``minimum`` (a version tuple)."""
    try:
        mod = importlib.import_module(module)
    except Exception as exc:  # ImportError, or a broken install raising anything
        return Check(label, False, f"cannot import {module} ({type(exc).__name__}: {exc})",
                     INSTALL_FIX)
    version = str(getattr(mod, "__version__", "?"))
    parts = tuple(int(p) for p in version.split("+")[0].split(".")[:len(minimum)] if p.isdigit())
    if minimum and parts < minimum:
        want = ".".join(map(str, minimum))
        return Check(label, False, f"{version} is older than {want}", INSTALL_FIX)
    return Check(label, True, version)


def check_python() -> Check:
    ok = sys.version_info >= (3, 11)
    return Check("python", ok, platform.python_version(), "use Python 3.11 or newer")


def check_tensorflow(timeout: float = 180) -> Check:
    # A subprocess: TF takes seconds and much memory to import, and a broken TF can abort.
    code = "import tensorflow as tf; print(tf.__version__)"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=timeout, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    except subprocess.TimeoutExpired:
        return Check("tensorflow", False, f"import took over {timeout:g} s", INSTALL_FIX)
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return Check("tensorflow", False, f"cannot import ({last})", INSTALL_FIX)
    return Check("tensorflow", True, out.stdout.strip().splitlines()[-1])


def check_hardware() -> Check:
    from ..cluster.engines.engine import gpu_count

    gpus = gpu_count()
    detail = f"{os.cpu_count()} CPU cores, {gpus} GPU(s) visible"
    detail += " -> backend gloo" if gpus == 0 else " -> backend nccl for GPU ranks"
    return Check("hardware", True, detail)


def check_cluster(engines: int, timeout: float, tf: bool = False,
                  profile: Any = "local") -> list[Check]:
    from .. import cluster, torch_dist

    checks = []
    cid = f"doctor-{os.getpid()}"
    t0 = time.perf_counter()
    try:
        cc = cluster.start(n=engines, profile=profile, timeout=timeout, cluster_id=cid)
    except Exception as exc:
        msg = str(exc).splitlines()[0]
        fix = getattr(exc, "fix", "see the engine output above")
        return [Check("cluster", False, f"{engines} engines did not start: {msg}", fix)]
    try:
        checks.append(Check("cluster", True,
                            f"{engines} engines up in {time.perf_counter() - t0:.1f} s"))
        t1 = time.perf_counter()
        try:
            torch_dist.start(cc, backend="gloo", timeout=min(timeout, 60))
            sums = cc.run(_rank_sum, timeout=30)
            want = float(sum(range(1, engines + 1)))
            ok = all(s == want for s in sums)
            detail = f"sum over ranks of (rank+1) = {sums} (want {want:g} on every rank)"
            detail += f" in {time.perf_counter() - t1:.1f} s"
            checks.append(Check("gloo all_reduce", ok, detail,
                                "" if ok else "report this: gloo returned a wrong sum"))
        except Exception as exc:
            checks.append(Check("gloo all_reduce", False, str(exc).splitlines()[0],
                                getattr(exc, "fix", INSTALL_FIX)))
        if tf:
            checks.append(check_tf_cluster(
                cc, timeout, while_up=lambda ports: checks.append(check_exposure(cc, ports))))
        else:
            checks.append(check_exposure(cc, set()))
    finally:
        cc.stop(force=True)
    return checks


def check_exposure(cc, tf_ports: set[int]) -> Check:
    """What the course's processes listen on: only TF's gRPC servers may listen beyond the
    loopback address (TensorFlow cannot be told otherwise; docs/cluster.md says so)."""
    from ..cluster.kernel import exposure

    try:
        found = exposure.report(cc)
    except Exception as exc:
        return Check("exposure", False, f"could not list sockets: {exc}", "report this")
    wide = exposure.exposed(found)
    odd = [x for x in wide if x.port not in tf_ports]
    detail = f"{len(found) - len(wide)} sockets on loopback (controller, torch store, gloo)"
    tf = sorted(x.port for x in wide if x.port in tf_ports)
    if tf:
        detail += (f"; on ALL interfaces while TF servers run: ports {tf} (TensorFlow's gRPC "
                   "server binds 0.0.0.0 whatever its ClusterSpec says; docs/cluster.md)")
    if odd:
        detail += "; unexpected: " + ", ".join(x.text() for x in odd)
    return Check("exposure", not odd, detail,
                 "" if not odd else "report this: only TF gRPC servers should listen beyond "
                 "loopback on the local profile")


def check_tf_cluster(cc, timeout: float,
                     while_up: Callable[[set[int]], None] | None = None) -> Check:
    """1 ps + 1 worker on the engines (on different ranks when there are two): both answer,
    and one training step on the worker moves the variable that lives on the ps.
    ``while_up(ports)`` runs while the servers are up (the exposure check)."""
    from .. import tf_dist
    from ..checks.tf_graph import engine_tf_one_step

    name = "tf parameter server"
    t0 = time.perf_counter()
    try:
        tfc = tf_dist.start_servers(cc, num_ps=1, num_workers=1, ps_rank=cc.world_size - 1,
                                    timeout=min(timeout, 20))
        ready = time.perf_counter() - t0
        w = cc.run_on(tfc.rank_of("worker", 0), engine_tf_one_step, timeout=60)
        ok = abs(w - 0.6) < 1e-5
        if while_up is not None:
            while_up({int(a.rsplit(":", 1)[1]) for job in tfc.cluster.values() for a in job})
        detail = (f"ps:0 on rank {tfc.rank_of('ps', 0)}, worker:0 on rank "
                  f"{tfc.rank_of('worker', 0)} answered in {ready:.1f} s; one step moved w "
                  f"0 -> {w:.3f} (want 0.600) in {time.perf_counter() - t0:.1f} s")
        return Check(name, ok, detail, "" if ok else "report this: the ps step gave a wrong value")
    except Exception as exc:
        return Check(name, False, str(exc).splitlines()[0],
                     getattr(exc, "fix", "run `course doctor` again; see the engine logs"))
    finally:
        with contextlib.suppress(Exception):
            tf_dist.stop_servers(cc)


def _rank_sum() -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    return float(t.item())


def run_checks(engines: int = 2, timeout: float = 60, tf: bool = True,
               emit: Callable[[str], None] = print) -> list[Check]:
    """``course doctor``: versions, hardware, the learner's kernel, then a real cluster.
    (``course doctor --profile``: :func:`.doctor_slurm.profile_checks`.)"""
    results: list[Check] = []

    def add(c: Check) -> None:
        results.append(c)
        emit(c.line())

    add(check_python())
    add(version_check("ipyparallel", "ipyparallel", (9,)))
    add(version_check("torch", "torch", (2, 4)))
    add(version_check("torchvision", "torchvision"))
    if tf:
        add(check_tensorflow())
    add(check_hardware())
    from ..learner.kernelspec import kernel_health  # the learner's Jupyter kernel

    add(Check("kernel", *kernel_health()))
    torch_ok = all(c.ok for c in results if c.name in ("torch", "ipyparallel"))
    tf_ok = tf and all(c.ok for c in results if c.name == "tensorflow")
    if torch_ok:
        for c in check_cluster(engines, timeout, tf=tf_ok):
            add(c)
    else:
        add(Check("cluster", False, "skipped: torch or ipyparallel is missing", INSTALL_FIX))
    return results
