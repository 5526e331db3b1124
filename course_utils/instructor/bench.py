"""Benchmarks (measured, never asserted in tests): ``course bench startup``.

Prints human-readable lines, then one JSON line last.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import sys
import time
from typing import Any

RAW_INIT = """
import os, torch, torch.distributed as dist
os.environ['MASTER_ADDR'] = '127.0.0.1'
os.environ['MASTER_PORT'] = str(port)
dist.init_process_group('gloo', rank=rank, world_size=world_size)
t = torch.ones(1)
dist.all_reduce(t)
"""


def _noop() -> int:
    return 0


def _median_ms(fn: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def raw_cold_ready(n: int) -> float:
    """What a learner writes without our helpers: plain ipyparallel + torch, cold."""
    import ipyparallel as ipp

    from ..cluster.ports import free_port

    t0 = time.perf_counter()
    cl = ipp.Cluster(n=n, cluster_id=f"bench-raw-{os.getpid()}", log_level=logging.WARNING)
    rc = cl.start_and_connect_sync()
    try:
        view = rc[:]
        view.scatter("rank", list(range(n)), flatten=True, block=True)
        view.push({"world_size": n, "port": free_port()}, block=True)
        view.execute(RAW_INIT, block=True)
        elapsed = time.perf_counter() - t0
    finally:
        rc.close()
        cl.stop_cluster_sync()
    return elapsed


def floor_s(n: int) -> float:
    """What no helper can beat, measured now: ``n`` torch imports in parallel (each engine's),
    plus a bare controller with ``n`` engines registering (our heartbeat, no course code)."""
    import ipyparallel as ipp

    from ..cluster.launchers.launching import HEARTBEAT_MISSES, HEARTBEAT_MS

    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", "import torch.distributed"])
             for _ in range(n)]
    for p in procs:
        p.wait()
    imports = time.perf_counter() - t0
    t0 = time.perf_counter()
    cl = ipp.Cluster(n=n, cluster_id=f"bench-floor-{os.getpid()}", delay=0,
                     controller_ip="127.0.0.1", log_level=logging.ERROR,
                     controller_args=[f"--HeartMonitor.period={HEARTBEAT_MS}",
                                      f"--HeartMonitor.max_heartmonitor_misses={HEARTBEAT_MISSES}"])
    rc = cl.start_and_connect_sync()
    try:
        rc.wait_for_engines(n, timeout=120, interactive=False)
        registered = time.perf_counter() - t0
    finally:
        rc.close()
        cl.stop_cluster_sync()
    return imports + registered


def startup(n: int = 2, repeat: int = 200) -> dict[str, Any]:
    from .. import cluster, torch_dist
    from ..cluster.kernel import registry

    # Warm the page cache for torch so neither contender pays the first disk read.
    subprocess.run([sys.executable, "-c", "import torch.distributed"], check=True)

    raw = raw_cold_ready(n)
    print(f"raw ipyparallel + torch, cold:  {raw:.2f} s")
    floor = floor_s(n)
    print(f"floor (imports + registration): {floor:.2f} s")

    cid = f"bench-{os.getpid()}"
    t0 = time.perf_counter()
    cc = cluster.start(n=n, cluster_id=cid)
    torch_dist.start(cc)
    cold = time.perf_counter() - t0
    print(f"course helpers, cold:           {cold:.2f} s ({cold / floor:.2f}x the floor)")
    try:
        # Warm: a fresh connection (as a new notebook kernel makes) to the running cluster.
        cc.client.close()
        registry.forget(cc)
        t0 = time.perf_counter()
        cc2 = cluster.start(cluster_id=cid)
        info = torch_dist.start(cc2)
        warm = time.perf_counter() - t0
        print(f"course helpers, warm:           {warm:.3f} s (group reused: {info['reused']})")

        helper = _median_ms(lambda: cc2.run(_noop), repeat)
        raw_view = cc2.client[cc2.ranks.engine_ids]
        rawrt = _median_ms(lambda: raw_view.apply_sync(_noop), repeat)
        print(f"round trip, helper / raw:       {helper:.2f} ms / {rawrt:.2f} ms")
        # What one %%px cell costs beyond its own work: an execute on every engine.
        px = _median_ms(lambda: cc2.view.execute("pass", block=True), repeat)
        print(f"%%px cell overhead (execute):   {px:.2f} ms")
    finally:
        cc2.stop(force=True)
        cc.stop(kill=True)  # what cc2's stop left: its client closed, no hooks to run
    return {
        "engines": n,
        "cold_ready_s": round(cold, 3),
        "warm_ready_s": round(warm, 3),
        "raw_cold_ready_s": round(raw, 3),
        "floor_s": round(floor, 3),
        "cold_over_floor": round(cold / floor, 3),
        "helper_roundtrip_ms": round(helper, 3),
        "raw_roundtrip_ms": round(rawrt, 3),
        "roundtrip_ratio": round(helper / rawrt, 3),
        "px_cell_ms": round(px, 3),
    }


def print_json(result: dict[str, Any]) -> None:
    print(json.dumps(result, sort_keys=True))
