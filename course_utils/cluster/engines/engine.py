"""Code that runs *on* the engines. Kept free of torch and TensorFlow so it is cheap to call.

The cluster layer calls these through ipyparallel; learners never call them directly.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
from typing import Any

from ...private_dir import open_private, private_dir
from ...procs import pid_alive
from ...settings import ENV_HOST_CUDA_DEVICES, ENV_NODE, env

#: What the last :func:`install` told this engine (rank, world size, ...).
STATE: dict[str, Any] = {}

#: The signal on which an engine writes its Python stacks to :func:`stack_file` (so the kernel
#: can say where a rank is stuck: a blocked collective cannot answer a call). None on Windows.
STACK_SIGNAL = getattr(signal, "SIGUSR2", None)
_STACK_OUT: list[Any] = []


#: Set by :func:`install` when it pinned this engine to one GPU: the host's list before that.
ENV_ALL_GPUS = ENV_HOST_CUDA_DEVICES


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
    host = env(ENV_ALL_GPUS) or None
    gpus = host.split(",") if host else _gpu_ids()
    value = cuda_devices_for(local_rank, local_world_size, gpus)
    if value is None or _cuda_touched():
        return None
    os.environ[ENV_ALL_GPUS] = ",".join(gpus)
    os.environ["CUDA_VISIBLE_DEVICES"] = value
    return value


def gpu_count() -> int:
    """GPUs on this host (before :func:`pin_gpu` narrowed this engine to one)."""
    pinned = env(ENV_ALL_GPUS) or None
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


def route_address(towards: str) -> str:
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
        "addr": route_address(controller_addr),
        "pid": os.getpid(),
        "gpus": gpu_count(),
        "cpus": os.cpu_count() or 1,
        # The profile's host entry, set per host by the SSH launcher (profiles.ENV_NODE):
        # tells apart hosts that share a host name.
        "node": env(ENV_NODE) or None,
    }
    slurm = slurm_facts()
    if slurm is not None:
        info["slurm"] = slurm
    return info


def install(info: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """Record this engine's rank, export torchrun-style variables and expose names to ``%%px``.

    Also arms the stack dump (:data:`STACK_SIGNAL`); returns the pid and the dump's file.
    """
    import __main__

    os.environ.update(env)
    pin_gpu(int(info.get("local_rank", 0)), int(info.get("local_world_size", 1)))
    STATE.clear()
    STATE.update(info)
    ns = vars(__main__)
    for key in ("rank", "world_size", "local_rank", "local_world_size", "host"):
        ns[key] = info[key]
    return {"pid": os.getpid(), "stack_file": enable_stack_dump()}


def stack_file(pid: int | None = None) -> str:
    """Where engine ``pid`` writes its stacks when it gets :data:`STACK_SIGNAL`."""
    return str(private_dir("stacks") / f"{pid or os.getpid()}.txt")


def enable_stack_dump() -> str | None:
    """Dump every thread's Python stack to :func:`stack_file` on :data:`STACK_SIGNAL`.

    ``faulthandler`` writes from its C signal handler, so this works while the main thread is
    blocked inside a collective, where no Python code (and no ipyparallel call) can run.
    """
    import faulthandler

    if STACK_SIGNAL is None:
        return None
    if not _STACK_OUT:
        path = stack_file()
        out = open_private(path)  # stays open: the handler writes to its fd
        faulthandler.register(STACK_SIGNAL, file=out, all_threads=True, chain=False)
        _STACK_OUT.append((out, path))
    return _STACK_OUT[0][1]


def remove_stale_stack_files() -> int:
    """Delete this user's stack files whose engine process is gone (engines are killed, so
    they cannot clean up after themselves). Returns how many were removed."""
    import glob

    removed = 0
    for path in glob.glob(str(private_dir("stacks") / "*.txt")):
        try:
            pid = int(os.path.basename(path).split(".")[0])
        except ValueError:
            continue
        if not pid_alive(pid):
            with contextlib.suppress(OSError):
                os.unlink(path)
                removed += 1
    return removed


_FH_FRAME = re.compile(r'^\s*File "(?P<file>.+?)", line (?P<line>\d+) in (?P<func>\S+)')


def summarize_stack(dump: str) -> str:
    """``faulthandler`` output -> ``"in all_reduce (torch.distributed), called from
    only_rank0 line 9"``: the innermost library call on the thread running the learner's code,
    and the learner's innermost line."""
    threads = [t for t in re.split(r"\n(?=(?:Current thread|Thread) 0x)", dump) if "File" in t]
    main = next((t for t in threads if "do_apply" in t or "run_code" in t or "run_cell" in t),
                threads[0] if threads else "")
    frames = [m.groupdict() for m in map(_FH_FRAME.match, main.splitlines()) if m]
    if not frames:
        return "running (no stack available)"
    # faulthandler lists the most recent call first
    lib = {"site-packages", "dist-packages", "/lib/python3", "/course_utils/", "<frozen"}
    learner = next((f for f in frames if not any(p in f["file"] for p in lib)
                    and f["func"] != "<module>" or "ipykernel_" in f["file"]), None)
    dist = next((f for f in frames if "torch/distributed" in f["file"]
                 and not f["func"].startswith("_") and f["func"] != "wrapper"), None)
    parts = []
    if dist is not None:
        parts.append(f"in {dist['func']} (torch.distributed)")
    elif frames:
        parts.append(f"in {frames[0]['func']}")
    if learner is not None:
        parts.append(f"called from {learner['func']} line {learner['line']}")
    return ", ".join(parts)


def state() -> dict[str, Any]:
    return dict(STATE)


def px_name(name: str, to_call: bool = False) -> Any:
    """What a ``%%px`` cell bound to ``name`` in this engine's namespace (a callable, when
    ``to_call``). The one place that says, when it is not there, which cells to run: every
    probe and recorder looks the learner's names up through it."""
    import __main__

    value = vars(__main__).get(name)
    if value is None or (to_call and not callable(value)):
        raise NameError(f"{name!r} is not defined on this engine: run the %%px cell that "
                        "defines it, and the cells above it")
    return value


def call_named(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Call ``name`` from the engine's interactive namespace (what ``%%px`` cells defined)."""
    return px_name(name, to_call=True)(*args, **kwargs)


def getenv(name: str, default: str | None = None) -> str | None:
    """An environment variable as this engine sees it."""
    return os.environ.get(name, default)
