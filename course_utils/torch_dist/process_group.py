"""torch.distributed on every engine: backend choice, process-group init/teardown, timeouts.

Introduced in ``00_cluster_tour``. The kernel side (``init``, ``destroy``) never imports torch;
torch is imported on the engines by the ``_engine_*`` functions, which ipyparallel runs there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import settings
from ..cluster import CourseCluster, current, ports
from ..errors import BackendUnavailable, ClusterTimeout, PortInUse, WorldSizeMismatch

BACKENDS = ("auto", "gloo", "nccl")


def choose_backend(requested: str, gpus_by_rank: Sequence[int],
                   local_ranks: Sequence[int]) -> str:
    """``auto`` -> nccl when every rank has its own GPU (gpus > local rank), else gloo.

    An explicit ``nccl`` without such a GPU on every rank is an error that names the ranks.
    """
    req = (requested or "auto").lower()
    if req not in BACKENDS:
        raise BackendUnavailable(
            f"backend {requested!r} is not one of {', '.join(BACKENDS)}",
            "use backend='auto' (nccl on GPUs, gloo on CPUs), 'gloo' or 'nccl'",
        )
    short = [r for r, (g, lr) in enumerate(zip(gpus_by_rank, local_ranks, strict=True)) if g <= lr]
    if req == "auto":
        return "gloo" if short or not gpus_by_rank else "nccl"
    if req == "nccl" and short:
        raise BackendUnavailable(
            f"nccl needs one CUDA GPU per rank, but rank(s) {short} have none "
            f"(GPUs seen per rank: {list(gpus_by_rank)})",
            "use backend='auto' or 'gloo' on CPU machines; on GPU hosts check "
            "CUDA_VISIBLE_DEVICES and start no more engines per host than it has GPUs",
        )
    return req


def init(
    cluster: CourseCluster | None = None,
    backend: str = "auto",
    timeout: float | None = None,
    master_port: int | None = None,
    world_size: int | None = None,
) -> dict[str, Any]:
    """Create the default process group on every engine (idempotent).

    Re-running with the same backend on the same engines reuses the live group; anything else
    destroys it and builds a fresh one on a new free port chosen *on rank 0's host*.
    ``timeout`` (default ``$COURSE_PG_TIMEOUT``, 60 s) bounds rendezvous and every collective.
    Returns a summary: backend, world size, master address/port and whether it was reused.
    """
    cc = cluster or current()
    rm = cc.ranks
    if world_size is not None and world_size != rm.world_size:
        raise WorldSizeMismatch(
            f"world_size={world_size} was asked but the cluster has {rm.world_size} engines",
            f"omit world_size (it is derived from the cluster) or cu.start(n={world_size})",
        )
    chosen = choose_backend(backend, [r.gpus for r in rm], [r.local_rank for r in rm])
    pg_timeout = float(settings.pg_timeout() if timeout is None else timeout)
    if pg_timeout <= 0:
        raise ValueError(f"timeout={timeout} must be positive seconds")

    want = {"backend": chosen, "world_size": rm.world_size}
    states = cc.run(_engine_state, timeout=10)
    if master_port is None and all(
        s and s["backend"] == chosen and s["world_size"] == rm.world_size and s["rank"] == r.rank
        for s, r in zip(states, rm, strict=True)
    ):
        _register_hooks(cc, backend, timeout)
        return {**states[0], **want, "reused": True}

    if master_port is not None:
        if cc.run_on(0, ports.port_in_use, int(master_port), rm.master_addr, timeout=10):
            raise PortInUse(
                f"master_port {master_port} is already in use on rank 0's host {rm[0].host}",
                "omit master_port so a free one is chosen, or pick another port",
            )
        port = int(master_port)
    else:
        port = cc.run_on(0, ports.free_port, rm.master_addr, timeout=10)

    args = [
        (r.rank, rm.world_size, r.local_rank, rm.master_addr, port, chosen, pg_timeout)
        for r in rm
    ]
    try:
        results = cc.run_per_rank(_engine_init, args, timeout=pg_timeout + 30)
    except ClusterTimeout as exc:
        raise ClusterTimeout(
            f"the {chosen} process group did not form on {rm.master_addr}:{port} "
            f"within {pg_timeout:g} s ({exc.cause.split(';')[-1].strip()})",
            "run cu.restart(); on two hosts check that rank 0's host accepts connections on "
            "the master port and that GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME name a shared "
            "interface",
        ) from None
    _register_hooks(cc, backend, timeout)
    return {**results[0], "reused": False}


def destroy(cluster: CourseCluster | None = None) -> list[bool]:
    """Destroy the process group on every engine (no-op where there is none)."""
    cc = cluster or current()
    cc.on_restart("torch", None)
    return cc.run(_engine_destroy, timeout=30)


def _register_hooks(cc: CourseCluster, backend: str, timeout: float | None) -> None:
    # After cu.restart() the new engines get a fresh group with the same settings.
    cc.on_restart("torch", lambda c: init(c, backend=backend, timeout=timeout))
    cc.on_stop("torch", lambda c: c.run(_engine_destroy, timeout=10))


# ---- engine side ---------------------------------------------------------------------------
_ENGINE: dict[str, Any] = {}


def _engine_state() -> dict[str, Any] | None:
    import sys

    if "torch.distributed" not in sys.modules:
        return None
    import torch.distributed as dist

    if not dist.is_initialized() or not _ENGINE:
        return None
    return dict(_ENGINE)


def _engine_init(rank: int, world_size: int, local_rank: int, master_addr: str, port: int,
                 backend: str, timeout_s: float) -> dict[str, Any]:
    import datetime
    import os

    import torch
    import torch.distributed as dist

    import __main__

    if dist.is_initialized():
        dist.destroy_process_group()
    _ENGINE.clear()
    os.environ.update({"MASTER_ADDR": master_addr, "MASTER_PORT": str(port),
                       "RANK": str(rank), "WORLD_SIZE": str(world_size)})
    threads = int(os.environ.get("COURSE_THREADS", "0") or 0)
    if threads:
        torch.set_num_threads(threads)
    if backend == "nccl":
        # An engine pinned to its GPU (CUDA_VISIBLE_DEVICES, cluster.engine.pin_gpu) sees it
        # as device 0; an unpinned one sees every GPU of its host and uses its local rank's.
        index = local_rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        device = torch.device("cuda", index)
    else:
        device = torch.device("cpu")
    dist.init_process_group(
        backend,
        init_method=f"tcp://{master_addr}:{port}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    # One all_reduce proves every rank joined the group before we report success.
    probe = torch.ones(1, device=device)
    dist.all_reduce(probe)
    if int(probe.item()) != world_size:
        raise RuntimeError(f"probe all_reduce gave {probe.item()}, expected {world_size}")
    _ENGINE.update(rank=rank, world_size=world_size, backend=backend, master_addr=master_addr,
                   master_port=port, device=str(device), torch=torch.__version__)
    __main__.device = device
    return dict(_ENGINE)


def _engine_destroy() -> bool:
    import sys

    _ENGINE.clear()
    if "torch.distributed" not in sys.modules:
        return False
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
        return True
    return False
