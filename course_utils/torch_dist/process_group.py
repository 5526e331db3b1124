"""torch.distributed on every engine: backend choice, process-group start/stop, timeouts.

Introduced in ``00_cluster_tour``. The kernel side (``start``, ``stop``) never imports torch;
torch is imported on the engines by the ``_engine_*`` functions, which ipyparallel runs there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import settings
from ..cluster import CourseCluster, current, ports
from ..errors import (
    BackendUnavailable,
    ClusterTimeout,
    PortInUse,
    WorldSizeMismatch,
)
from ..settings import env_threads
from . import messages  # noqa: F401  # registers what torch's messages mean with the cluster

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


def pg_backend(chosen: str) -> str:
    """The backend string torch gets. An NCCL group maps devices to backends,
    ``"cpu:gloo,cuda:nccl"``, so CPU tensors (the lessons' small examples) go over gloo and
    CUDA tensors over NCCL: the same notebook runs on CPUs and on the GPU hosts."""
    return "cpu:gloo,cuda:nccl" if chosen == "nccl" else chosen


def backend_label(chosen: str) -> str:
    """How the summary names the backend: ``gloo``, or ``nccl+gloo`` for the mapped group."""
    return "nccl+gloo" if chosen == "nccl" else chosen


def debug_level(debug: str | bool | None) -> str:
    """``cu.start_torch(debug=...)`` -> ``off``/``info``/``detail`` (None: ``$COURSE_TORCH_DEBUG``,
    default ``off``; True: ``detail``; False: ``off``)."""
    if debug is None:
        return settings.torch_debug()
    if isinstance(debug, bool):
        return "detail" if debug else "off"
    level = str(debug).strip().lower()
    if level not in settings.TORCH_DEBUG_LEVELS:
        raise ValueError(f"debug={debug!r} is not one of {settings.TORCH_DEBUG_LEVELS}")
    return level


def start(
    cluster: CourseCluster | None = None,
    backend: str = "auto",
    timeout: float | None = None,
    master_port: int | None = None,
    world_size: int | None = None,
    debug: str | bool | None = None,
) -> dict[str, Any]:
    """Create the default process group on every engine (idempotent).

    Re-running with the same backend on the same engines reuses the live group; anything else
    destroys it and builds a fresh one on a new free port chosen *on rank 0's host*.
    ``timeout`` (default ``$COURSE_PG_TIMEOUT``, 60 s) bounds rendezvous and every collective.
    ``debug`` (default ``$COURSE_TORCH_DEBUG``, ``off``): a plain torch group, what a training
    script gets. ``detail`` wraps the group in torch's checking wrapper
    (``TORCH_DISTRIBUTED_DEBUG=DETAIL``, unit 8 teaches it through
    :func:`course_utils.torch_dist.faults.set_debug`): every collective is first compared across
    ranks. torch 2.14.1 kills the process (SIGSEGV) when ``DistributedDataParallel`` is built on
    such a group, so build DDP only on a group started with debug off.
    The course's rendezvous store listens on a port of its own; ``MASTER_ADDR``/``MASTER_PORT``,
    ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` are exported on every engine for a *second*, free
    port, so the official tutorials' ``dist.destroy_process_group()`` then
    ``dist.init_process_group("gloo")`` (``env://``) works in a ``%%px`` cell.
    Returns a summary: backend, world size, master address/port, debug level, whether reused.
    """
    cc = cluster or current()
    rm = cc.ranks
    if world_size is not None and world_size != rm.world_size:
        raise WorldSizeMismatch(
            f"world_size={world_size} was asked but the cluster has {rm.world_size} engines",
            f"omit world_size (it is derived from the cluster) or cu.start(n={world_size})",
        )
    chosen = _usable(backend, choose_backend(backend, [r.gpus for r in rm],
                                             [r.local_rank for r in rm]), cc)
    pg_timeout = float(settings.pg_timeout() if timeout is None else timeout)
    if pg_timeout <= 0:
        raise ValueError(f"timeout={timeout} must be positive seconds")

    level = debug_level(debug)
    gloo_cuda = chosen != "nccl" and settings.torch_device() == "cuda"
    want = {"backend": backend_label(chosen), "world_size": rm.world_size, "debug": level}
    states = cc.run(_engine_state, timeout=10)
    broken = cc.flags.pop("pg_broken", False)
    if master_port is None and not broken and all(
        s and s["backend"] == want["backend"] and s["world_size"] == rm.world_size
        and s["rank"] == r.rank and s.get("debug") == level
        and s.get("device", "").startswith("cuda") == (gloo_cuda or chosen == "nccl")
        for s, r in zip(states, rm, strict=True)
    ):
        _register_hooks(cc, backend, timeout, debug)
        return {**states[0], **want, "reused": True}

    if master_port is not None:
        if cc.run_on(0, ports.port_in_use, int(master_port), rm.master_addr, timeout=10):
            raise PortInUse(
                f"master_port {master_port} is already in use on rank 0's host {rm[0].host}",
                "omit master_port so a free one is chosen, or pick another port",
            )
        port = int(master_port)
        env_port = cc.run_on(0, ports.free_port, rm.master_addr, timeout=10)
    else:  # two distinct ports: the course's store, and the one exported for env:// init
        port, env_port = cc.run_on(0, ports.free_ports, 2, rm.master_addr, timeout=10)

    args = [
        (r.rank, rm.world_size, r.local_rank, rm.master_addr, port, pg_backend(chosen),
         pg_timeout, level, cc.profile.is_local, env_port, gloo_cuda)
        for r in rm
    ]
    try:
        results = cc.run_per_rank(_engine_start, args, timeout=pg_timeout + 30)
    except ClusterTimeout as exc:
        raise ClusterTimeout(
            f"the {chosen} process group did not form on {rm.master_addr}:{port} "
            f"within {pg_timeout:g} s ({exc.cause.split(';')[-1].strip()})",
            "run cu.restart(); on two hosts check that rank 0's host accepts connections on "
            "the master port and that GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME name a shared "
            "interface",
        ) from None
    _register_hooks(cc, backend, timeout, debug)
    return {**results[0], "reused": False}


def stop(cluster: CourseCluster | None = None) -> list[bool]:
    """Destroy the process group on every engine (no-op where there is none)."""
    cc = cluster or current()
    cc.on_restart("torch", None)
    return cc.run(_engine_stop, timeout=30)


def _register_hooks(cc: CourseCluster, backend: str, timeout: float | None,
                    debug: str | bool | None = None) -> None:
    # After cu.restart() the new engines get a fresh group with the same settings.
    cc.on_restart("torch", lambda c: start(c, backend=backend, timeout=timeout, debug=debug))
    cc.on_stop("torch", lambda c: c.run(_engine_stop, timeout=10))


# ---- engine side ---------------------------------------------------------------------------
_ENGINE: dict[str, Any] = {}
#: The default group this module built (``group``): a group the learner built since is not ours.
_GROUP: dict[str, Any] = {}


def _engine_state() -> dict[str, Any] | None:
    import sys

    if "torch.distributed" not in sys.modules:
        return None
    import torch.distributed as dist

    if not dist.is_initialized() or not _ENGINE or _GROUP.get("group") is not dist.group.WORLD:
        return None  # none, or the learner's own (e.g. a tutorial's init_process_group)
    return dict(_ENGINE)


def _engine_start(rank: int, world_size: int, local_rank: int, master_addr: str, port: int,
                 backend: str, timeout_s: float, debug: str = "off",
                 loopback: bool = False, env_port: int | None = None,
                 gloo_cuda: bool = False) -> dict[str, Any]:
    import datetime
    import os

    import torch
    import torch.distributed as dist

    import __main__

    if dist.is_initialized():
        dist.destroy_process_group()
    _ENGINE.clear()
    _GROUP.clear()
    # What torchrun exports, for code in the tutorials' shape (env:// init); MASTER_PORT is not
    # the port of the course's own store below, so a second group can rendezvous there.
    os.environ.update({"MASTER_ADDR": master_addr, "MASTER_PORT": str(env_port or port),
                       "RANK": str(rank), "LOCAL_RANK": str(local_rank),
                       "WORLD_SIZE": str(world_size), "TORCH_DISTRIBUTED_DEBUG": debug.upper()})
    # Read by torch when the group is built; set explicitly, since torch reads the variable
    # only once, at import.
    dist.set_debug_level(getattr(dist.DebugLevel, debug.upper()))
    if loopback and "GLOO_SOCKET_IFNAME" not in os.environ:
        lo = loopback_ifname()
        if lo:  # gloo's own listening sockets: loopback, not the host name's address
            os.environ["GLOO_SOCKET_IFNAME"] = lo
    threads = env_threads()
    if threads:
        torch.set_num_threads(threads)
    cuda = "nccl" in backend
    device = _engine_device(rank, local_rank, cuda or gloo_cuda)
    timeout = datetime.timedelta(seconds=timeout_s)
    store = rendezvous_store(rank, world_size, master_addr, port, timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=timeout)
    _GROUP["group"] = dist.group.WORLD
    # One all_reduce proves every rank joined the group before we report success; a mapped
    # NCCL group is probed on both devices.
    probes = [torch.ones(1, device=device)] + ([torch.ones(1)] if cuda else [])
    for probe in probes:
        dist.all_reduce(probe)
        if int(probe.item()) != world_size:
            raise RuntimeError(f"probe all_reduce gave {probe.item()}, expected {world_size}")
    label = "nccl+gloo" if cuda else backend.rsplit(":", 1)[-1]
    _ENGINE.update(rank=rank, world_size=world_size, backend=label, pg_backend=backend,
                   master_addr=master_addr, master_port=env_port or port, store_port=port,
                   device=str(device), debug=debug,
                   # a str, not torch's TorchVersion: unpickling that in the kernel would
                   # import torch there (2.8 s of CPU, at every cu.start_torch())
                   torch=str(torch.__version__))
    __main__.device = device
    return dict(_ENGINE)


def _usable(requested: str | None, chosen: str, cc: Any) -> str:
    """``auto``'s NCCL only where torch on every rank can use a GPU: a CUDA_VISIBLE_DEVICES that
    names one (Slurm sets it from GRES) is not enough without a driver, or for a GRES device
    file that is not a real GPU; then gloo."""
    if (requested or "auto").lower() == "auto" and chosen == "nccl" and 0 in cc.run(
            _torch_gpu_count, timeout=60):
        return "gloo"
    return chosen


def _torch_gpu_count() -> int:
    """On an engine: the CUDA devices torch can use here (0 without a driver)."""
    import torch

    return int(torch.cuda.device_count())


def _engine_device(rank: int, local_rank: int, cuda: bool) -> Any:
    """This rank's torch device: its GPU for an NCCL group (or a gloo group under
    ``$COURSE_TORCH_DEVICE=cuda``, where ranks may share one), else the CPU."""
    import os

    import torch

    if not cuda:
        return torch.device("cpu")
    # An engine pinned to its GPU (CUDA_VISIBLE_DEVICES, cluster.engines.engine.pin_gpu) sees it as
    # device 0; an unpinned one sees every GPU of its host and uses its local rank's.
    if torch.cuda.device_count() == 0:
        raise BackendUnavailable(
            f"rank {rank} was to use CUDA (an NCCL group, or $COURSE_TORCH_DEVICE=cuda) but "
            "torch sees no CUDA device here "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})",
            "use cu.start_torch(backend='gloo') with COURSE_TORCH_DEVICE unset, or check the "
            "host's GPUs with `nvidia-smi`")
    index = local_rank % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def rendezvous_store(rank: int, world_size: int, master_addr: str, port: int,
                     timeout: Any) -> Any:
    """A ``TCPStore`` for ``init_process_group(store=...)`` that listens on ``master_addr``
    only. torch's own ``tcp://`` init (and a plain ``TCPStore(..., is_master=True)``) binds the
    master port on every interface, whatever address it is given (checked with ``ss -ltn``);
    a socket bound here to ``master_addr`` (loopback on the local profile) and handed over keeps
    it there. Used by ``cu.start_torch()`` and by the graded checks' own short-lived ranks."""
    import socket

    import torch.distributed as dist

    if rank != 0:
        return dist.TCPStore(master_addr, port, world_size, False, timeout, use_libuv=True)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((master_addr, port))
    except OSError as exc:
        sock.close()
        raise PortInUse(f"rank 0 cannot listen on {master_addr}:{port}: {exc.strerror}",
                        "run cu.start_torch() again: it picks a fresh port") from None
    sock.listen(128)
    return dist.TCPStore(master_addr, port, world_size, True, timeout,
                         master_listen_fd=sock.detach(), use_libuv=True)


def loopback_ifname() -> str | None:
    """The loopback interface's name (``lo`` on Linux, ``lo0`` on macOS), if there is one."""
    import socket

    names = [name for _, name in socket.if_nameindex()]
    return next((n for n in ("lo", "lo0") if n in names), None)


def _engine_stop() -> bool:
    import sys

    _ENGINE.clear()
    _GROUP.clear()
    if "torch.distributed" not in sys.modules:
        return False
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
        return True
    return False


# ---- what DETAIL mode costs --------------------------------------------------------------------
def debug_overhead(cluster: CourseCluster | None = None,
                   sizes: Sequence[int] = (4, 4096, 1 << 20, 64 << 20),
                   seconds_per_size: float = 1.0, rounds: int = 3) -> dict[int, dict[str, float]]:
    """Median ``all_reduce`` latency (ms) per message size in bytes, with the group built with
    ``debug="off"`` and ``debug="detail"``, and their ratio. The modes alternate ``rounds``
    times and the best round counts (a shared machine only ever adds time). A benchmark for
    instructors (not a test); it leaves the group at ``$COURSE_TORCH_DEBUG``."""
    cc = cluster or current()
    out: dict[int, dict[str, float]] = {int(n): {} for n in sizes}
    for _ in range(max(1, rounds)):
        for level in ("off", "detail"):
            start(cc, debug=level)
            for n in sizes:
                ms = max(cc.run(_engine_time_all_reduce, int(n), float(seconds_per_size),
                                timeout=60 + 20 * seconds_per_size))  # the slowest rank counts
                out[int(n)][level] = min(ms, out[int(n)].get(level, float("inf")))
    for row in out.values():
        row["ratio"] = row["detail"] / row["off"] if row["off"] else float("nan")
    start(cc)
    return out


def _engine_time_all_reduce(nbytes: int, budget_s: float) -> float:
    import statistics
    import time

    import torch
    import torch.distributed as dist

    t = torch.ones(max(1, nbytes // 4))
    dist.all_reduce(t)  # warm-up (connections, buffers)
    times: list[float] = []
    dist.barrier()
    # every rank runs the same count: decided by rank 0's first timings, broadcast
    probe = time.perf_counter()
    dist.all_reduce(t)
    first = time.perf_counter() - probe
    count = torch.tensor([min(500, max(3, int(budget_s / max(first, 1e-6))))])
    dist.broadcast(count, 0)
    for _ in range(int(count.item())):
        t0 = time.perf_counter()
        dist.all_reduce(t)
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)
