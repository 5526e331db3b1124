"""The one place that decides defaults: engine count, names, timeouts and thread budgets, and
the one place that reads the course's ``COURSE_*`` environment variables (:data:`VARIABLES`
lists every one; :func:`env` reads them, and refuses a name not listed).

Each value can be overridden by an environment variable so that ``course lab``, the notebooks
and CI agree without passing arguments around.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Mapping
from pathlib import Path

#: Environment variables read here (documented in docs/instructor.md).
ENV_ENGINES = "COURSE_ENGINES"
ENV_CLUSTER_ID = "COURSE_CLUSTER_ID"
ENV_PROFILE = "COURSE_PROFILE"
ENV_IPYTHON_PROFILE = "COURSE_IPYTHON_PROFILE"
ENV_START_TIMEOUT = "COURSE_START_TIMEOUT"
ENV_CALL_TIMEOUT = "COURSE_CALL_TIMEOUT"
ENV_PG_TIMEOUT = "COURSE_PG_TIMEOUT"
ENV_TORCH_DEBUG = "COURSE_TORCH_DEBUG"
ENV_TORCH_DEVICE = "COURSE_TORCH_DEVICE"
ENV_THREADS = "COURSE_THREADS"
ENV_WORKDIR = "COURSE_WORKDIR"
ENV_KERNEL_PREFIX = "COURSE_KERNEL_PREFIX"
ENV_CACHE = "COURSE_CACHE_DIR"
ENV_LIVE = "COURSE_LIVE"
ENV_ENGINE_FORK = "COURSE_ENGINE_FORK"
ENV_ENGINE_PRELOAD = "COURSE_ENGINE_PRELOAD"
ENV_ENGINE_PYTHON = "COURSE_ENGINE_PYTHON"
ENV_NODE = "COURSE_NODE"
ENV_NODE_RANK = "COURSE_NODE_RANK"
ENV_HOST_CUDA_DEVICES = "COURSE_HOST_CUDA_DEVICES"
ENV_GRADING_RUN = "COURSE_GRADING_RUN"
ENV_SANDBOX_HIDDEN = "COURSE_SANDBOX_HIDDEN"
ENV_SANDBOX_SEEN = "COURSE_SANDBOX_SEEN"
ENV_WORKSHOP = "COURSE_WORKSHOP"
ENV_PORTS = "COURSE_PORTS"

#: Every ``COURSE_*`` variable, and who sets it (a user, or the course for its own processes).
VARIABLES: dict[str, str] = {
    ENV_ENGINES: "user: engines a local cluster starts (2)",
    ENV_CLUSTER_ID: "user: the cluster's name, shared by course lab and every kernel (course)",
    ENV_PROFILE: "user: the cluster profile, local or a profile file (the workshop sets it)",
    ENV_IPYTHON_PROFILE: "user: the IPython profile holding connection files (course)",
    ENV_START_TIMEOUT: "user: seconds engines may take to register (60)",
    ENV_CALL_TIMEOUT: "user: seconds a call on the engines may take (120)",
    ENV_PG_TIMEOUT: "user: seconds torch waits in a collective (60)",
    ENV_TORCH_DEBUG: "user: torch.distributed's debug level, off, info or detail (off)",
    ENV_TORCH_DEVICE: "user: where a gloo group keeps its tensors, cpu or cuda (cpu)",
    ENV_WORKDIR: "user: the learner's working folder (~/dist-training-course)",
    ENV_KERNEL_PREFIX: "user: where the course's kernelspec is installed (this environment)",
    ENV_CACHE: "user: where released notebooks are cached (~/.cache/dist-training-course)",
    ENV_LIVE: "user: 0 turns live-updating figures into one final figure",
    ENV_ENGINE_FORK: "user: 0 starts every local engine as its own python",
    ENV_ENGINE_PYTHON: "user: the interpreter local engines run",
    ENV_THREADS: "course: CPU threads an engine may use (its share of the host's cores)",
    ENV_ENGINE_PRELOAD: "course: modules an engine imports before its first call",
    ENV_NODE: "course: the profile's host entry an engine runs on",
    ENV_NODE_RANK: "course: that host's index in the profile",
    ENV_HOST_CUDA_DEVICES: "course: every GPU of an engine's host, before one was pinned",
    ENV_GRADING_RUN: "course: marks the processes of one grading run",
    ENV_SANDBOX_HIDDEN: "course: folders a grading sandbox hides",
    ENV_SANDBOX_SEEN: "course: paths a grading sandbox binds back in",
    ENV_WORKSHOP: "course: the workshop file a learner's lab was made from",
    ENV_PORTS: "course: LOW-HIGH, the ports the course may listen on (a workshop gives each "
               "learner a block of their own, closed to the others by its firewall)",
}

#: Values of ``$COURSE_TORCH_DEBUG`` / ``cu.start_torch(debug=...)``.
TORCH_DEBUG_LEVELS = ("off", "info", "detail")


def env(name: str, environ: Mapping[str, str] | None = None) -> str:
    """The value of the course's variable ``name`` (one of :data:`VARIABLES`) in ``environ``
    (default: this process's), stripped; ``""`` when unset."""
    if name not in VARIABLES:
        raise KeyError(f"{name} is not one of the course's variables (settings.VARIABLES)")
    return (os.environ if environ is None else environ).get(name, "").strip()


def env_threads() -> int:
    """``$COURSE_THREADS``: the CPU threads this engine may use, 0 when not set."""
    return int(env(ENV_THREADS) or 0)


def _env_int(name: str, default: int) -> int:
    raw = env(name)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ValueError(f"${name}={raw!r} is not an integer; unset it or give a number") from exc
    if value <= 0:
        raise ValueError(f"${name}={raw!r} must be positive")
    return value


def default_engines() -> int:
    """Engines started by ``course lab`` and ``start()`` when ``n`` is not given (2)."""
    return _env_int(ENV_ENGINES, 2)


def cluster_id() -> str:
    """Name of the course cluster, so every kernel and ``course lab`` find the same one."""
    return env(ENV_CLUSTER_ID) or "course"


def cluster_profile() -> str:
    """Which cluster profile to use: ``local`` (default), or a name/path of a profile file."""
    return env(ENV_PROFILE) or "local"


def ipython_profile() -> str:
    """IPython profile that holds the cluster's connection files and logs."""
    return env(ENV_IPYTHON_PROFILE) or "course"


def start_timeout() -> int:
    """Seconds to wait for engines to register before giving up."""
    return _env_int(ENV_START_TIMEOUT, 60)


def call_timeout() -> int:
    """Seconds a helper waits for a call on the engines before raising ClusterTimeout."""
    return _env_int(ENV_CALL_TIMEOUT, 120)


def pg_timeout() -> int:
    """Seconds torch waits in a collective (and in rendezvous) before raising."""
    return _env_int(ENV_PG_TIMEOUT, 60)


def torch_debug() -> str:
    """torch.distributed's debug level on the engines (``off`` by default: a plain group).

    ``detail`` sets ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` before the process group is built: torch
    wraps the group so that every collective is first checked against the other ranks' (op,
    shapes, dtypes) and a mismatch fails at once with the ranks named. Unit 8 teaches it
    (:func:`course_utils.torch_dist.faults.set_debug`). It is not the default because it costs an
    extra exchange per collective and because torch 2.14.1 kills the process (SIGSEGV) when
    ``DistributedDataParallel`` is built on such a group (reproduced with two plain processes).
    """
    raw = env(ENV_TORCH_DEBUG).lower() or "off"
    if raw not in TORCH_DEBUG_LEVELS:
        levels = ", ".join(TORCH_DEBUG_LEVELS)
        raise ValueError(f"${ENV_TORCH_DEBUG}={raw!r} is not one of {levels}")
    return raw


def torch_device() -> str:
    """Where a gloo group's ranks keep their tensors: ``cpu`` (default) or ``cuda``.

    ``cuda`` is for a machine with fewer GPUs than engines, one GPU say: NCCL refuses two ranks
    on one GPU, but gloo moves CUDA tensors (it stages them through host memory), so the ranks
    share the GPU and the lessons' tensors, models and gradients live on it. An NCCL group
    always uses each rank's own GPU.
    """
    raw = env(ENV_TORCH_DEVICE).lower() or "cpu"
    if raw not in ("cpu", "cuda"):
        raise ValueError(f"${ENV_TORCH_DEVICE}={raw!r} is not cpu or cuda")
    return raw


def threads_per_engine(engines_on_host: int, cores: int | None = None) -> int:
    """CPU threads each engine may use so engines sharing a host do not oversubscribe it."""
    cores = cores or os.cpu_count() or 1
    return max(1, cores // max(1, engines_on_host))


#: Where ``pip install .`` puts the course's notebooks and profiles (pyproject's data-files).
DATA_SUBDIR = Path("share") / "dist-training-course"


def course_root() -> Path:
    """The folder that holds this ``course_utils`` package: the checkout when running from one
    (editable install, tests; ``notebooks/``, ``profiles/``, ``slides/`` sit beside the package),
    else site-packages. A child process with it on ``PYTHONPATH`` imports this very copy. The
    one place that computes it: everything else asks here (or :func:`data_dir`)."""
    return Path(__file__).resolve().parent.parent


def data_dir(name: str) -> Path:
    """The course's ``notebooks`` or ``profiles`` folder: the checkout's, when running from one
    (editable install, tests), else the copy the installed package ships under
    ``<prefix>/share/dist-training-course/``. Nothing else assumes a checkout."""
    here = course_root() / name
    if here.is_dir():
        return here
    prefixes = [sysconfig.get_path("data"), sys.prefix, sys.base_prefix]
    with_user = sysconfig.get_path("data", f"{os.name}_user")  # pip install --user
    for prefix in [*prefixes, with_user]:
        candidate = Path(prefix) / DATA_SUBDIR / name
        if candidate.is_dir():
            return candidate
    return here  # absent: callers name this path in their error
