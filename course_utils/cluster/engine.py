"""Code that runs *on* the engines. Kept free of torch and TensorFlow so it is cheap to call.

The cluster layer calls these through ipyparallel; learners never call them directly.
"""

from __future__ import annotations

import os
import socket
from typing import Any

#: What the last :func:`install` told this engine (rank, world size, ...).
STATE: dict[str, Any] = {}


#: Set by :func:`install` when it pinned this engine to one GPU: the host's list before that.
ENV_ALL_GPUS = "COURSE_HOST_CUDA_DEVICES"


def _gpu_ids(visible: str | None = None) -> list[str]:
    """The GPU ids this process may use: ``$CUDA_VISIBLE_DEVICES`` or every GPU of the host."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    if visible is not None:
        return [v.strip() for v in visible.split(",") if v.strip() and v.strip() != "-1"]
    try:
        return sorted(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return []


def cuda_devices_for(local_rank: int, local_world_size: int, host_gpus: list[str]) -> str | None:
    """The ``CUDA_VISIBLE_DEVICES`` value for one engine: its local rank's GPU, or None.

    Pure (unit 6). With ``local_world_size`` engines on a host that has at least that many GPUs,
    local rank ``i`` sees only GPU ``host_gpus[i]`` (as device 0), so no two ranks share a GPU
    and NCCL gets one device per rank. With no GPUs, or fewer GPUs than engines, nothing is
    pinned (``None``: the backend choice falls back to gloo).
    """
    if not host_gpus or local_world_size > len(host_gpus) or not 0 <= local_rank < len(host_gpus):
        return None
    return host_gpus[local_rank]


def _cuda_touched() -> bool:
    """Whether a framework in this process may already have initialised CUDA."""
    import sys

    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                return True
        except Exception:
            return True
    return "tensorflow" in sys.modules or "jax" in sys.modules


def pin_gpu(local_rank: int, local_world_size: int) -> str | None:
    """Set ``CUDA_VISIBLE_DEVICES`` to this engine's GPU before any framework touches CUDA.

    Idempotent: the host's full list is kept in ``$COURSE_HOST_CUDA_DEVICES``, so a second call
    (a kernel re-connecting) pins from the same list. Returns the value set, or None.
    """
    host = os.environ.get(ENV_ALL_GPUS)
    gpus = host.split(",") if host else _gpu_ids()
    value = cuda_devices_for(local_rank, local_world_size, gpus)
    if value is None or _cuda_touched():
        return None
    os.environ[ENV_ALL_GPUS] = ",".join(gpus)
    os.environ["CUDA_VISIBLE_DEVICES"] = value
    return value


def _gpu_count() -> int:
    """GPUs on this host (before :func:`pin_gpu` narrowed this engine to one)."""
    pinned = os.environ.get(ENV_ALL_GPUS)
    if pinned:
        return len(pinned.split(","))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [v for v in visible.split(",") if v.strip() and v.strip() != "-1"]
        return len(ids)
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0


def _route_addr(towards: str) -> str:
    """The local address this host uses to reach ``towards`` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((towards, 9))
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"


_SLURM_FACTS = {  # key in describe()["slurm"] -> variable srun sets in each task
    "job_id": "SLURM_JOB_ID",
    "procid": "SLURM_PROCID",    # the task's global index in its step: 0..ntasks-1
    "localid": "SLURM_LOCALID",  # its index among the step's tasks on the same node
    "nodeid": "SLURM_NODEID",    # index of its node among the step's nodes
    "ntasks": "SLURM_STEP_NUM_TASKS",
}


def slurm_facts(environ: dict[str, str] | None = None) -> dict[str, Any] | None:
    """What Slurm told this process (a task started by ``srun``), or None outside a Slurm step.

    ``{"job_id", "procid", "localid", "nodeid", "ntasks", "node", "nodelist"}``; ``node`` is the
    Slurm node name (``SLURMD_NODENAME``), ``nodelist`` the job's compressed node list.
    """
    env = os.environ if environ is None else environ
    if not all(env.get(var, "").isdigit() for var in ("SLURM_JOB_ID", "SLURM_PROCID")):
        return None
    facts: dict[str, Any] = {key: int(env[var]) if env.get(var, "").isdigit() else None
                             for key, var in _SLURM_FACTS.items()}
    facts["node"] = env.get("SLURMD_NODENAME") or socket.gethostname()
    facts["nodelist"] = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", "")
    return facts


def describe(controller_addr: str = "127.0.0.1") -> dict[str, Any]:
    """Who am I: host name, routable address, pid, visible GPUs and CPU count, and, for an
    engine started by Slurm, what Slurm says (``"slurm"``: see :func:`slurm_facts`)."""
    info = {
        "host": socket.gethostname(),
        "addr": _route_addr(controller_addr),
        "pid": os.getpid(),
        "gpus": _gpu_count(),
        "cpus": os.cpu_count() or 1,
        # The profile's host entry, set per host by the SSH launcher (profiles.ENV_NODE):
        # tells apart hosts that share a host name.
        "node": os.environ.get("COURSE_NODE") or None,
    }
    slurm = slurm_facts()
    if slurm is not None:
        info["slurm"] = slurm
    return info


def install(info: dict[str, Any], env: dict[str, str]) -> int:
    """Record this engine's rank, export torchrun-style variables and expose names to ``%%px``."""
    import __main__

    os.environ.update(env)
    pin_gpu(int(info.get("local_rank", 0)), int(info.get("local_world_size", 1)))
    STATE.clear()
    STATE.update(info)
    ns = vars(__main__)
    for key in ("rank", "world_size", "local_rank", "local_world_size", "host"):
        ns[key] = info[key]
    return os.getpid()


def state() -> dict[str, Any]:
    return dict(STATE)


def call_named(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Call ``name`` from the engine's interactive namespace (what ``%%px`` cells defined)."""
    import __main__

    fn = vars(__main__).get(name)
    if fn is None:
        raise NameError(f"{name!r} is not defined on this engine: run the %%px cell defining it")
    return fn(*args, **kwargs)


def getenv(name: str, default: str | None = None) -> str | None:
    """An environment variable as this engine sees it."""
    return os.environ.get(name, default)
