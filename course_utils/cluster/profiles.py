"""Cluster profiles: where the engines run. Notebook code never changes between profiles.

``local``  engines on this machine (laptop, CI): the default.
``ssh``    engines on hosts reached over SSH (the two-GPU-host workshop), from a TOML file.
``slurm``  engines as a Slurm job, from a TOML file (``profiles/slurm.toml``; see
           :mod:`course_utils.cluster.slurm`).

A profile file (``profiles/two-hosts.toml`` is the worked example)::

    launcher = "ssh"
    controller_ip = "10.0.0.1"         # address the engines can reach this machine on
    socket_ifname = "eth0"             # GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME
    [[hosts]]
    host = "gpu-a"                     # rank 0 lands on the first host
    engines = 2
    python = "/opt/course/.venv/bin/python"
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

from ..errors import ProfileError

LAUNCHERS = ("local", "ssh", "slurm")


@dataclass(frozen=True)
class HostSpec:
    host: str
    engines: int
    python: str | None = None


_SLURM_TIME = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$")
"""Slurm's time formats: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS."""


@dataclass(frozen=True)
class SlurmSpec:
    """The ``[slurm]`` table of a slurm profile: what the engines' job asks the scheduler for.

    Each engine is one Slurm task (``--ntasks`` = engines); ``None`` leaves Slurm's default.
    """

    partition: str | None = None
    time: str | None = None            # --time, e.g. "30" (minutes) or "02:00:00"
    cpus_per_engine: int | None = None  # --cpus-per-task; also the engines' thread budget
    gpus_per_engine: int = 0           # --gpus-per-task (0: none asked)
    account: str | None = None
    qos: str | None = None
    nodes: int | None = None           # --nodes: spread the engines over this many nodes
    options: tuple[str, ...] = ()      # extra sbatch options, e.g. ("--constraint=a100",)


@dataclass(frozen=True)
class ClusterProfile:
    name: str = "local"
    launcher: str = "local"
    engines: int | None = None
    hosts: tuple[HostSpec, ...] = ()
    controller_ip: str | None = None
    socket_ifname: str | None = None
    engine_python: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    slurm: SlurmSpec | None = None

    @property
    def is_local(self) -> bool:
        return self.launcher == "local"

    @property
    def host_order(self) -> list[str]:
        return [h.host for h in self.hosts]

    def engine_count(self, n: int | None) -> int | None:
        """Engines to start: the profile's own count wins over ``n`` for multi-host profiles."""
        if self.hosts:
            return sum(h.engines for h in self.hosts)
        return n or self.engines

    def engines_per_host(self, n: int) -> int:
        if self.hosts:
            return max(h.engines for h in self.hosts)
        return n

    def engine_env(self, n: int, threads: int) -> dict[str, str]:
        """Environment every engine starts with: thread budget, quiet TF, interface names."""
        if self.launcher == "slurm":  # the job's CPUs per task, not this machine's cores
            threads = (self.slurm.cpus_per_engine if self.slurm else None) or 1
        env = {
            "OMP_NUM_THREADS": str(threads),
            "MKL_NUM_THREADS": str(threads),
            "COURSE_THREADS": str(threads),
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "PYTHONUNBUFFERED": "1",
        }
        if self.socket_ifname:
            env["GLOO_SOCKET_IFNAME"] = self.socket_ifname
            env["NCCL_SOCKET_IFNAME"] = self.socket_ifname
        env.update(self.env)
        return env

    def cluster_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``ipyparallel.Cluster`` that select the launchers."""
        if self.launcher == "local":
            kw: dict[str, Any] = {"engines": "local", "controller_ip": "127.0.0.1"}
        elif self.launcher == "ssh":
            from traitlets.config import Config

            cfg = Config()
            cfg.SSHEngineSetLauncher.engines = {
                h.host: {"n": h.engines, **({"engine_cmd": [h.python, "-m", "ipyparallel.engine"]}
                                             if h.python else {})}
                for h in self.hosts
            }
            kw = {
                "engines": "ssh",
                "controller_ip": "0.0.0.0",
                "controller_location": self.controller_ip or "",
                "config": cfg,
            }
        else:  # slurm: the controller stays here, the engines are one Slurm job
            from .slurm import cluster_kwargs

            kw = cluster_kwargs(self)
        return kw

    def engine_cmd(self) -> list[str] | None:
        if self.engine_python:
            return [self.engine_python, "-m", "ipyparallel.engine"]
        return None


def _profiles_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "profiles"


def load_profile(spec: str | os.PathLike[str] | ClusterProfile | None = None) -> ClusterProfile:
    """``None``/``"local"`` -> the local profile; a name in ``profiles/`` or a path -> that file."""
    if isinstance(spec, ClusterProfile):
        return spec
    if spec is None or str(spec) == "local":
        # $COURSE_ENGINE_PYTHON lets a learner point engines at another interpreter.
        return ClusterProfile(engine_python=os.environ.get("COURSE_ENGINE_PYTHON") or None)
    path = Path(spec)
    if not path.suffix:
        path = _profiles_dir() / f"{spec}.toml"
    if not path.exists():
        raise ProfileError(
            f"cluster profile {str(spec)!r} not found (looked for {path})",
            "use 'local', or a path to a .toml profile (see profiles/two-hosts.toml)",
        )
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{path} is not valid TOML: {exc}", "fix the file's syntax") from exc
    return profile_from_dict(data, name=path.stem)


def profile_from_dict(data: dict[str, Any], name: str = "custom") -> ClusterProfile:
    launcher = data.get("launcher", "local")
    if launcher not in LAUNCHERS:
        raise ProfileError(
            f"profile {name!r}: launcher {launcher!r} is not one of {', '.join(LAUNCHERS)}",
            "set launcher to local, ssh or slurm",
        )
    hosts = []
    for i, h in enumerate(data.get("hosts", [])):
        if "host" not in h:
            raise ProfileError(f"profile {name!r}: hosts[{i}] has no 'host'", "add host = \"name\"")
        n = h.get("engines", 1)
        if not isinstance(n, int) or n < 1:
            raise ProfileError(
                f"profile {name!r}: hosts[{i}].engines = {n!r} is not a positive integer",
                "give each host engines = 1 or more",
            )
        hosts.append(HostSpec(host=str(h["host"]), engines=n, python=h.get("python")))
    if launcher == "ssh" and not hosts:
        raise ProfileError(
            f"profile {name!r}: an ssh profile needs [[hosts]] entries", "list each host once"
        )
    if launcher != "local" and not data.get("controller_ip"):
        raise ProfileError(
            f"profile {name!r}: launcher {launcher!r} needs controller_ip",
            "set controller_ip to this machine's address on the network the hosts share",
        )
    engines = data.get("engines")
    if engines is not None and (not isinstance(engines, int) or engines < 1):
        raise ProfileError(f"profile {name!r}: engines = {engines!r}", "use a positive integer")
    if "slurm" in data and launcher != "slurm":
        raise ProfileError(f"profile {name!r}: a [slurm] table needs launcher = \"slurm\"",
                           "set launcher = \"slurm\" or remove the [slurm] table")
    return ClusterProfile(
        name=name,
        launcher=launcher,
        engines=engines,
        hosts=tuple(hosts),
        controller_ip=data.get("controller_ip"),
        socket_ifname=data.get("socket_ifname"),
        engine_python=data.get("engine_python"),
        env={str(k): str(v) for k, v in data.get("env", {}).items()},
        slurm=slurm_spec_from_dict(data.get("slurm", {}), name) if launcher == "slurm" else None,
    )


def _positive(table: dict[str, Any], key: str, name: str, zero: bool = False) -> int | None:
    value = table.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if zero else 1):
        least = 0 if zero else 1
        raise ProfileError(f"profile {name!r}: slurm.{key} = {value!r} is not an integer >= "
                           f"{least}", f"give slurm.{key} a whole number, {least} or more")
    return value


def slurm_spec_from_dict(table: dict[str, Any], name: str = "custom") -> SlurmSpec:
    """Parse and check a profile's ``[slurm]`` table (see :class:`SlurmSpec`)."""
    known = set(SlurmSpec.__dataclass_fields__)
    unknown = sorted(set(table) - known)
    if unknown:
        raise ProfileError(f"profile {name!r}: unknown slurm key(s) {', '.join(unknown)}",
                           f"use only {', '.join(sorted(known))}")
    time_limit = table.get("time")
    if time_limit is not None:
        time_limit = str(time_limit)
        if not _SLURM_TIME.match(time_limit):
            raise ProfileError(f"profile {name!r}: slurm.time = {time_limit!r} is not a Slurm "
                               "time", 'write minutes ("30"), "HH:MM:SS" or "D-HH:MM:SS"')
    options = table.get("options", [])
    if isinstance(options, str) or not all(isinstance(o, str) for o in options):
        raise ProfileError(f"profile {name!r}: slurm.options = {options!r}",
                           'give a list of sbatch options, e.g. ["--constraint=a100"]')
    texts = {}
    for key in ("partition", "account", "qos"):
        value = table.get(key)
        if value is not None and (not isinstance(value, str) or not re.fullmatch(r"[\w.-]+",
                                                                                 value)):
            raise ProfileError(f"profile {name!r}: slurm.{key} = {value!r}",
                               f"give slurm.{key} as a plain name (letters, digits, _ . -)")
        texts[key] = value
    return SlurmSpec(
        time=time_limit,
        cpus_per_engine=_positive(table, "cpus_per_engine", name),
        gpus_per_engine=_positive(table, "gpus_per_engine", name, zero=True) or 0,
        nodes=_positive(table, "nodes", name),
        options=tuple(options),
        **texts,
    )
