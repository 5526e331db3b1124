"""Engine-side probes for two hosts (unit 6 and its tests): where a rank runs, what crosses
the link, and whether unit 3's DDP training keeps replicas equal across hosts.

Every function runs *on* an engine (``cluster.run(fn)``); the collective ones need the process
group ``cu.start_torch()`` made, and every rank must call them.
"""

from __future__ import annotations

import os
import socket
from typing import Any

#: Environment variables a rank's process-group setup depends on (shown in unit 6).
DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK", "MASTER_ADDR",
            "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "CUDA_VISIBLE_DEVICES")


def interface_addresses() -> dict[str, list[str]]:
    """This host's network interfaces and their IPv4 addresses (from ``ip -j addr``; Linux)."""
    import json
    import subprocess

    try:
        out = subprocess.run(["ip", "-j", "-4", "addr", "show"], capture_output=True,
                             text=True, timeout=5, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return {link["ifname"]: [a["local"] for a in link.get("addr_info", [])]
            for link in json.loads(out or "[]")}


def engine_where() -> dict[str, Any]:
    """Who and where this rank is: host names, link address, interfaces and the dist env."""
    from course_utils.cluster.engines.engine import state

    st = state()
    return {
        "rank": st.get("rank"), "local_rank": st.get("local_rank"),
        "node_rank": st.get("node_rank"), "host": st.get("host"),
        "hostname": socket.gethostname(), "addr": st.get("addr"), "pid": os.getpid(),
        "interfaces": interface_addresses(),
        "env": {k: os.environ.get(k) for k in DIST_ENV},
    }


def engine_rank_sum() -> float:
    """*Collective.* all_reduce of (rank + 1): every rank must get 1 + 2 + ... + world_size."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    return float(t.item())


def engine_all_reduce_time(nbytes: int = 16 * 2**20, iters: int = 5) -> dict[str, float]:
    """*Collective.* Median seconds (slowest rank) of ``dist.all_reduce`` on ``nbytes`` of
    float32, with bus bandwidth in GB/s (NCCL's definition: what each link carries)."""
    import torch
    import torch.distributed as dist

    from course_utils.torch_dist.bandwidth import busbw, engine_time

    t = torch.ones(nbytes // 4)
    seconds = engine_time(lambda: dist.all_reduce(t), iters=iters, warmup=1)
    return {"bytes": float(nbytes), "seconds": seconds,
            "busbw_GBps": busbw(nbytes, seconds, dist.get_world_size())}


def engine_all_reduce_for(seconds: float, nbytes: int = 2**20) -> int:
    """*Collective.* all_reduce ``nbytes`` again and again for ``seconds``; returns the count.

    Unit 6 and its tests pull a cable in the middle of it: the collective timeout of the
    process group (``cu.start_torch(timeout=...)``) turns the stall into an error.
    """
    import time

    import torch
    import torch.distributed as dist

    t, n, end = torch.ones(nbytes // 4), 0, time.monotonic() + seconds
    while time.monotonic() < end:
        dist.all_reduce(t)
        n += 1
    return n


def engine_ddp_steps(steps: int = 4, seed: int = 0) -> dict[str, Any]:
    """*Collective.* Unit 3's DDP training for ``steps`` steps (the torchrun script's loop,
    :func:`course_utils.torch_dist.ddp_script.train_steps`) in the current process group."""
    import __main__
    from course_utils.torch_dist.ddp_script import train_steps

    res = train_steps(steps, seed=seed, device=getattr(__main__, "device", None))
    res.pop("model")
    return res


def engine_tf_ps_step() -> dict[str, Any]:
    """On a rank that hosts a TF worker (after ``tf_dist.start_servers``): one SGD step
    (lr 0.1) on (w - 3)^2 whose ``w`` lives on ps:0, wherever that is; ``w`` is 0.6 after it.
    Returns ``w``, this worker's task and the ps address (unit 6: the step crosses hosts)."""
    import __main__
    from course_utils.checks.tf_graph import engine_tf_one_step

    ns = vars(__main__)
    w = engine_tf_one_step()
    return {"w": w, "worker": f"worker:{ns['worker_index']}", "ps": ns["tf_cluster"]["ps"][0],
            "hostname": socket.gethostname()}
