"""Cluster profiles: where the engines run. Notebook code never changes between profiles.

``local``  engines on this machine (laptop, CI): the default.
``ssh``    engines on hosts reached over SSH (the two-GPU-host workshop), from a TOML file.
``slurm``  engines as a Slurm job, from a TOML file (``profiles/slurm.toml``; see
           :mod:`course_utils.cluster.launchers.slurm`).

A profile file (``profiles/two-hosts.toml`` is the worked example; unit 6 explains each field)::

    launcher = "ssh"
    controller_ip = "10.0.0.1"         # this machine's address on the link the hosts share;
                                       # the controller listens there only
    socket_ifname = "eth0"             # GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME on every host
    user = "course"                    # optional: ssh user (else ssh_config's or yours)
    ssh_config = "~/.ssh/course"       # optional: ssh -F FILE (aliases, keys, known_hosts)
    ssh_args = ["-o", "ConnectTimeout=5"]   # optional: more options for ssh and scp
    shared_paths = ["/data/course"]    # optional: folders every host must see (doctor checks;
                                       # the course folder itself is always checked)
    [[hosts]]
    host = "gpu-a"                     # an ssh destination; rank 0 lands on the first host
    engines = 2                        # one engine per GPU: local ranks 0 and 1
    python = "/opt/course/.venv/bin/python"  # the same venv path on every host
    address = "10.0.0.2"               # optional: the host's address on the shared link
"""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ProfileError
from ..settings import ENV_ENGINE_PYTHON, ENV_NODE, ENV_NODE_RANK, ENV_THREADS, env

LAUNCHERS = ("local", "ssh", "slurm")

#: ssh options every SSH launch uses after the profile's own (ssh keeps the first value given):
#: never prompt (a prompt would hang the start) and give up on an unreachable host in time.
SSH_DEFAULTS = ("-o", "BatchMode=yes", "-o", "ConnectTimeout=10")

#: Environment variables the SSH launcher sets per host, read back by the engines' report.


@dataclass(frozen=True)
class HostSpec:
    """One ``[[hosts]]`` entry: an ssh destination and what runs there."""

    host: str
    engines: int
    python: str | None = None
    address: str | None = None
    gpus: int | None = None

    @property
    def slug(self) -> str:
        """The host entry as a file name: ``root@10.0.0.2:22`` -> ``root_10.0.0.2_22``."""
        return re.sub(r"[^\w.-]", "_", self.host)


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
    user: str | None = None
    ssh_config: str | None = None
    ssh_args: tuple[str, ...] = ()
    ssh_cmd: tuple[str, ...] = ("ssh",)
    scp_cmd: tuple[str, ...] = ("scp",)
    slurm: SlurmSpec | None = None
    shared_paths: tuple[str, ...] = ()
    path: str | None = None

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
            ENV_THREADS: str(threads),
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "PYTHONUNBUFFERED": "1",
        }
        if self.socket_ifname:
            env["GLOO_SOCKET_IFNAME"] = self.socket_ifname
            env["NCCL_SOCKET_IFNAME"] = self.socket_ifname
        env.update(self.env)
        return env

    # ---- ssh ------------------------------------------------------------------------------
    def ssh_options(self) -> list[str]:
        """Options for both ssh and scp: ``-F ssh_config``, the profile's ``ssh_args``, then
        :data:`SSH_DEFAULTS` (ssh keeps the first value of an option, so the profile wins)."""
        opts = ["-F", self.ssh_config] if self.ssh_config else []
        return opts + list(self.ssh_args) + list(SSH_DEFAULTS)

    def destination(self, h: HostSpec | str) -> str:
        """The ssh destination of a host entry, with the profile's ``user`` if it has none."""
        host = h.host if isinstance(h, HostSpec) else h
        return f"{self.user}@{host}" if self.user and "@" not in host else host

    def ssh_argv(self, h: HostSpec | str, command: str) -> list[str]:
        """``ssh ... DEST COMMAND`` exactly as the engine launcher runs it (doctor, tests)."""
        return [*self.ssh_cmd, *self.ssh_options(), self.destination(h), command]

    def ssh_engines(self, env: dict[str, str], remote_base: str) -> dict[str, dict[str, Any]]:
        """``SSHEngineSetLauncher.engines``: per host its engine count, interpreter, its own
        remote profile folder (hosts may share a file system: without it, scp would copy the
        connection files onto themselves) and ``env`` plus who the host is in the profile."""
        out: dict[str, dict[str, Any]] = {}
        for i, h in enumerate(self.hosts):
            cfg: dict[str, Any] = {
                "n": h.engines,
                "remote_profile_dir": f"{remote_base.rstrip('/')}/hosts/{h.slug}",
                "environment": {**env, ENV_NODE: h.host, ENV_NODE_RANK: str(i)},
            }
            python = h.python or self.engine_python
            if python:
                cfg["remote_python"] = python
                cfg["engine_cmd"] = [python, "-m", "ipyparallel.engine"]
            out[self.destination(h)] = cfg
        return out

    def ssh_launcher_settings(self, env: dict[str, str], remote_base: str) -> dict[str, Any]:
        """Every ``SSHEngineSetLauncher`` setting of this profile: hosts, ssh and scp."""
        return {
            "engines": self.ssh_engines(env, remote_base),
            "ssh_cmd": list(self.ssh_cmd),
            "scp_cmd": list(self.scp_cmd),
            "ssh_args": self.ssh_options(),
            "scp_args": self.ssh_options(),
        }

    def engine_cmd(self) -> list[str] | None:
        if self.engine_python:
            return [self.engine_python, "-m", "ipyparallel.engine"]
        return None


def _profiles_dir() -> Path:
    from ..settings import data_dir

    return data_dir("profiles")


def load_profile(spec: str | os.PathLike[str] | ClusterProfile | None = None) -> ClusterProfile:
    """``None``/``"local"`` -> the local profile; a name in ``profiles/`` or a path -> that file."""
    if isinstance(spec, ClusterProfile):
        return spec
    if spec is None or str(spec) == "local":
        # $COURSE_ENGINE_PYTHON lets a learner point engines at another interpreter.
        return ClusterProfile(engine_python=env(ENV_ENGINE_PYTHON) or None)
    path = Path(spec).expanduser()
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
    return profile_from_dict(data, name=path.stem, base=path.resolve().parent)


def _str_list(value: Any, what: str, name: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ProfileError(f"profile {name!r}: {what} = {value!r} is not a list of strings",
                           f'write {what} = ["-o", "ConnectTimeout=5"]')
    return tuple(value)


def _is_listen_address(ip: str) -> bool:
    """A single routable address the controller can listen on (not loopback, not 0.0.0.0)."""
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return False
    return not (addr.is_loopback or addr.is_unspecified or addr.is_multicast)


def profile_from_dict(data: dict[str, Any], name: str = "custom",
                      base: Path | None = None) -> ClusterProfile:
    """Validate a profile's TOML data; relative ``ssh_config`` paths are relative to ``base``
    (the profile file's folder)."""
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
        gpus = h.get("gpus")
        if gpus is not None and (not isinstance(gpus, int) or gpus < 0):
            raise ProfileError(f"profile {name!r}: hosts[{i}].gpus = {gpus!r}",
                               "give the number of GPUs (0 or more), or leave it out")
        hosts.append(HostSpec(host=str(h["host"]), engines=n, python=h.get("python"),
                              address=h.get("address"), gpus=gpus))
    if len({h.host for h in hosts}) != len(hosts):
        raise ProfileError(f"profile {name!r}: a host is listed twice",
                           "list each host once; give it engines = N for N engines")
    if launcher == "ssh" and not hosts:
        raise ProfileError(
            f"profile {name!r}: an ssh profile needs [[hosts]] entries", "list each host once"
        )
    controller_ip = data.get("controller_ip")
    if launcher != "local" and not controller_ip:
        raise ProfileError(
            f"profile {name!r}: launcher {launcher!r} needs controller_ip",
            "set controller_ip to this machine's address on the network the hosts share",
        )
    if launcher == "ssh" and not _is_listen_address(str(controller_ip)):
        raise ProfileError(
            f"profile {name!r}: controller_ip = {controller_ip!r} is not an address the hosts "
            "can reach (loopback or 0.0.0.0 would be wrong: the controller listens there only)",
            "set controller_ip to this machine's IP address on the link the hosts share "
            "(`ip -4 addr` shows it)",
        )
    engines = data.get("engines")
    if engines is not None and (not isinstance(engines, int) or engines < 1):
        raise ProfileError(f"profile {name!r}: engines = {engines!r}", "use a positive integer")
    ssh_config = data.get("ssh_config")
    if ssh_config:
        cfg_path = Path(str(ssh_config)).expanduser()
        if not cfg_path.is_absolute() and base is not None:
            cfg_path = base / cfg_path
        ssh_config = str(cfg_path)
    if "slurm" in data and launcher != "slurm":
        raise ProfileError(f"profile {name!r}: a [slurm] table needs launcher = \"slurm\"",
                           "set launcher = \"slurm\" or remove the [slurm] table")
    return ClusterProfile(
        name=name,
        launcher=launcher,
        engines=engines,
        hosts=tuple(hosts),
        controller_ip=controller_ip,
        socket_ifname=data.get("socket_ifname"),
        engine_python=data.get("engine_python"),
        env={str(k): str(v) for k, v in data.get("env", {}).items()},
        user=data.get("user"),
        ssh_config=ssh_config,
        ssh_args=_str_list(data.get("ssh_args", []), "ssh_args", name),
        ssh_cmd=_str_list(data.get("ssh_cmd", ["ssh"]), "ssh_cmd", name),
        scp_cmd=_str_list(data.get("scp_cmd", ["scp"]), "scp_cmd", name),
        slurm=slurm_spec_from_dict(data.get("slurm", {}), name) if launcher == "slurm" else None,
        shared_paths=_str_list(data.get("shared_paths", []), "shared_paths", name),
        path=str(base) if base is not None else None,
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


def write_profile(path: str | os.PathLike[str], data: dict[str, Any]) -> Path:
    """Write a profile dict as TOML (strings, numbers, lists, ``hosts`` and ``slurm`` tables).

    Used by the tests to write the rig's profile, and by instructors' scripts.
    """
    def val(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int | float):
            return str(v)
        if isinstance(v, list | tuple):
            return "[" + ", ".join(val(x) for x in v) + "]"
        return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'

    lines = [f"{k} = {val(v)}" for k, v in data.items() if not isinstance(v, dict | list)
             or (isinstance(v, list) and not (v and isinstance(v[0], dict)))]
    for k, v in data.items():
        if isinstance(v, dict):
            lines += ["", f"[{k}]", *(f"{kk} = {val(vv)}" for kk, vv in v.items())]
    for h in data.get("hosts", []):
        lines += ["", "[[hosts]]", *(f"{kk} = {val(vv)}" for kk, vv in h.items())]
    p = Path(path)
    p.write_text("\n".join(lines) + "\n")
    tomllib.loads(p.read_text())  # what we wrote must read back
    return p
