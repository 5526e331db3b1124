"""The workshop file: hosts and their GPUs, the learners, and what each learner gets.

An instructor writes one TOML file (``workshops/example.toml`` is a commented copy)::

    learners = ["alice", "bob", "carol", "dave", "erin"]   # OS users; or a count: 12
    gpus_per_learner = 1            # on *each* host: a learner's ranks span every host
    partition = "workshop"          # or: reservation = "ddp-day"
    time = "04:00:00"               # how long one learner's engines may hold their GPUs
    interface = "eth1"              # the hosts' link: where the hub and every port listen
    # slurm_conf = "/etc/slurm/slurm.conf"  # only if Slurm's clients need SLURM_CONF there

    [hub]
    host = "gpu1"                   # the host the hub and the learners' labs run on
    port = 8000
    ssl_cert = "/etc/ssl/hub.pem"   # optional, with ssl_key: the hub serves https
    ssl_key = "/etc/ssl/private/hub.key"
    max_processes = 4096            # a learner's processes and threads per host; 0: no limit
    max_memory = "8G"               # a learner's lab and kernels together (a cgroup); 0: none

    [[hosts]]
    name = "gpu1"                   # the Slurm node name (its short host name)
    address = "10.0.0.1"            # its address on `interface`
    gpus = 8
    cpus = 32

:func:`load_workshop` reads and checks it (every mistake a :class:`WorkshopError` naming the
key and the fix); :mod:`course_utils.workshop.render` turns the result into the hub's config,
Slurm's GRES lines and the learners' cluster profile (``course workshop``). Not imported by any
notebook: this is the instructor's side of ``docs/instructor.md`` "A workshop on two GPU hosts".
"""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import CourseError

_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")  # what useradd accepts by default
_SLURM_TIME = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$")


class WorkshopError(CourseError):
    """The workshop file is missing, unreadable, or says something impossible."""


@dataclass(frozen=True)
class WorkshopHost:
    name: str
    address: str
    gpus: int
    cpus: int = 0               # 0: whatever slurmd detects
    gpu_files: str = ""         # gres.conf File=; default /dev/nvidia[0-(gpus-1)]

    @property
    def gpu_file_pattern(self) -> str:
        if self.gpu_files:
            return self.gpu_files
        return "/dev/nvidia0" if self.gpus == 1 else f"/dev/nvidia[0-{self.gpus - 1}]"


#: The learners' port blocks: learner k (in the file's order) gets ``PORTS_PER_LEARNER`` ports
#: from ``PORT_BASE + k * PORTS_PER_LEARNER``, all below Linux's ephemeral range (32768).
PORT_BASE, PORTS_PER_LEARNER, PORT_CEILING = 20000, 100, 32768


@dataclass(frozen=True)
class Workshop:
    hosts: tuple[WorkshopHost, ...]
    learners: tuple[str, ...]
    gpus_per_learner: int = 1
    shards_per_gpu: int = 0     # > 0: learners share GPUs through Slurm's `shard` GRES
    partition: str = "workshop"
    reservation: str = ""
    time: str = "04:00:00"
    interface: str = ""
    slurm_conf: str = ""        # set when slurm.conf is not where Slurm looks by itself
    lab_start_timeout: int = 120  # seconds the hub waits for a learner's JupyterLab
    max_processes: int = 4096   # a learner's processes and threads on a host (0: no limit)
    max_memory: int = 8 << 30   # bytes a learner's lab and kernels hold together (0: no limit)
    hub_host: str = ""
    hub_port: int = 8000
    instructor: str = ""
    path: str = ""
    ssl_cert: str = ""          # [hub] ssl_cert/ssl_key: the hub serves https with this pair
    ssl_key: str = ""

    @property
    def shared(self) -> bool:
        return self.shards_per_gpu > 0

    @property
    def hub(self) -> WorkshopHost:
        return next(h for h in self.hosts if h.name == self.hub_host)

    @property
    def hub_url(self) -> str:
        scheme = "https" if self.ssl_cert else "http"
        return f"{scheme}://{self.hub.address}:{self.hub_port}"

    def slots_per_host(self, host: WorkshopHost) -> int:
        """How many learners' ranks fit on ``host`` at once."""
        units = host.gpus * (self.shards_per_gpu or 1)
        return units // self.gpus_per_learner

    @property
    def capacity(self) -> int:
        """Learners whose engines can run at once (each needs GPUs on every host)."""
        return min(self.slots_per_host(h) for h in self.hosts)

    @property
    def queued(self) -> int:
        """Learners beyond :attr:`capacity`: they wait in Slurm's queue when all start."""
        return max(0, len(self.learners) - self.capacity)

    @property
    def ranks_per_learner(self) -> int:
        return self.gpus_per_learner * len(self.hosts)

    def port_block(self, learner: str) -> tuple[int, int]:
        """``(low, high)``, both included: the ports ``learner``'s servers (the torch store,
        TensorFlow's tasks) listen on, closed to every other learner by the firewall."""
        k = self.learners.index(learner)
        low = PORT_BASE + k * PORTS_PER_LEARNER
        return low, low + PORTS_PER_LEARNER - 1


def _need(table: dict[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in table:
        raise WorkshopError(f"{where}: `{key}` is missing", f"add `{key} = ...` to {where}")
    value = table[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise WorkshopError(f"{where}: `{key}` is {value!r}, not a {kind.__name__}",
                            f"write `{key}` as a {kind.__name__}")
    return value


def _positive(table: dict[str, Any], key: str, where: str, default: int) -> int:
    value = table.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise WorkshopError(f"{where}: `{key}` is {value!r}",
                            f"give `{key}` as a whole number >= 0")
    return value


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str | int) -> int:
    """Bytes in ``"8G"``, ``"512M"``, ``"1.5G"`` or a whole number of bytes (0: no limit);
    ValueError for anything else (a bool, a negative number, another unit)."""
    m = None if isinstance(text, bool) else re.fullmatch(
        r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", str(text), re.I)
    if not m:
        raise ValueError(f"{text!r} is not a size")
    return int(float(m[1]) * _UNITS[m[2].upper()])


def _size(table: dict[str, Any], key: str, where: str, default: int) -> int:
    try:
        return parse_size(table.get(key, default))
    except ValueError:
        raise WorkshopError(f"{where}: `{key}` is {table.get(key)!r}, not a size",
                            f'give `{key}` as bytes or with K, M, G or T ("8G"); 0: no '
                            "limit") from None


def _host(entry: Any, i: int) -> WorkshopHost:
    where = f"[[hosts]] entry {i + 1}"
    if not isinstance(entry, dict):
        raise WorkshopError(f"{where} is not a table", "write each host as a [[hosts]] table")
    unknown = set(entry) - {"name", "address", "gpus", "cpus", "gpu_files"}
    if unknown:
        raise WorkshopError(f"{where}: unknown key(s) {sorted(unknown)}",
                            "a host has name, address, gpus, cpus and gpu_files")
    name, address = _need(entry, "name", str, where), _need(entry, "address", str, where)
    try:
        ipaddress.ip_address(address)
    except ValueError:
        raise WorkshopError(f"{where}: address {address!r} is not an IP address",
                            "give the host's address on the workshop's interface, "
                            "e.g. 10.0.0.1") from None
    gpus = _positive(entry, "gpus", where, 0)
    if gpus < 1:
        raise WorkshopError(f"{where} ({name}): `gpus` must be 1 or more",
                            "count the GPUs of the host (`nvidia-smi -L`)")
    return WorkshopHost(name, address, gpus, _positive(entry, "cpus", where, 0),
                        str(entry.get("gpu_files", "")))


def _learners(value: Any) -> tuple[str, ...]:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return tuple(f"learner{i:02d}" for i in range(1, value + 1))
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        bad = [v for v in value if not _NAME.match(v)]
        if bad:
            raise WorkshopError(f"learner names {bad} are not valid user names",
                                "use lower-case letters, digits, _ and -, starting with a "
                                "letter (each learner is an OS user)")
        if len(set(value)) != len(value):
            raise WorkshopError("a learner is named twice", "give each learner once")
        return tuple(value)
    raise WorkshopError(f"`learners` is {value!r}",
                        "give a count (learners = 12) or a list of user names")


#: The keys of the file's top level and of its ``[hub]`` table (``[[hosts]]``: :func:`_host`).
TOP_KEYS = {"learners", "gpus_per_learner", "shards_per_gpu", "partition", "reservation",
            "time", "interface", "slurm_conf", "instructor", "hub", "hosts"}
HUB_KEYS = {"host", "port", "lab_start_timeout", "ssl_cert", "ssl_key", "max_processes",
            "max_memory"}


def _known(table: Any, allowed: set[str], where: str) -> None:
    """A misspelt key would be ignored (and its setting lost): name it instead."""
    if not isinstance(table, dict):
        raise WorkshopError(f"{where} is not a table", f"write {where} as a TOML table")
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise WorkshopError(f"{where}: unknown key(s) {unknown}",
                            f"spell each key as one of: {', '.join(sorted(allowed))}")


def workshop_from_dict(data: dict[str, Any], path: str = "") -> Workshop:
    """A :class:`Workshop` from the parsed file; every mistake a :class:`WorkshopError`."""
    _known(data, TOP_KEYS, "the workshop file")
    _known(data.get("hub", {}), HUB_KEYS, "[hub]")
    hosts = tuple(_host(e, i) for i, e in enumerate(data.get("hosts", [])))
    if len(hosts) < 1:
        raise WorkshopError("the file names no [[hosts]]", "add a [[hosts]] table per GPU host")
    if len({h.name for h in hosts}) != len(hosts):
        raise WorkshopError("two [[hosts]] have the same name", "give each host its own name")
    learners = _learners(data.get("learners"))
    if PORT_BASE + len(learners) * PORTS_PER_LEARNER > PORT_CEILING:
        most = (PORT_CEILING - PORT_BASE) // PORTS_PER_LEARNER
        raise WorkshopError(f"{len(learners)} learners do not fit the port blocks (at most "
                            f"{most}, {PORTS_PER_LEARNER} ports each)",
                            f"run two workshops of at most {most} learners each")
    per = _positive(data, "gpus_per_learner", "the workshop file", 1)
    shards = _positive(data, "shards_per_gpu", "the workshop file", 0)
    if per < 1:
        raise WorkshopError("`gpus_per_learner` is 0", "give each learner 1 or more GPUs per host")
    hub = data.get("hub", {})
    hub_host = str(hub.get("host", hosts[0].name))
    if hub_host not in {h.name for h in hosts}:
        raise WorkshopError(f"[hub] host {hub_host!r} is not one of the [[hosts]]",
                            f"name one of {[h.name for h in hosts]}")
    cert, key = (str(hub.get(k, "")) for k in ("ssl_cert", "ssl_key"))
    if bool(cert) != bool(key) or not all(os.path.isabs(p) for p in (cert, key) if p):
        raise WorkshopError("[hub] needs both ssl_cert and ssl_key, as absolute paths, or "
                            "neither", "name the certificate and its key, e.g. ssl_cert = "
                            "\"/etc/ssl/hub.pem\" and ssl_key = \"/etc/ssl/private/hub.key\"")
    time = str(data.get("time", "04:00:00"))
    if not _SLURM_TIME.match(time):
        raise WorkshopError(f"`time` {time!r} is not a Slurm time",
                            "write minutes (\"90\") or HH:MM:SS (\"04:00:00\")")
    ws = Workshop(hosts=hosts, learners=learners, gpus_per_learner=per, shards_per_gpu=shards,
                  partition=str(data.get("partition", "workshop")),
                  reservation=str(data.get("reservation", "")), time=time,
                  interface=str(data.get("interface", "")),
                  slurm_conf=str(data.get("slurm_conf", "")), hub_host=hub_host,
                  lab_start_timeout=_positive(hub, "lab_start_timeout", "[hub]", 120),
                  max_processes=_positive(hub, "max_processes", "[hub]", 4096),
                  max_memory=_size(hub, "max_memory", "[hub]", 8 << 30),
                  hub_port=_positive(hub, "port", "[hub]", 8000),
                  instructor=str(data.get("instructor", "")), path=path,
                  ssl_cert=cert, ssl_key=key)
    too_small = [h.name for h in hosts if ws.slots_per_host(h) < 1]
    if too_small:
        raise WorkshopError(f"hosts {too_small} have fewer GPUs than one learner needs "
                            f"({per} per host)",
                            "lower `gpus_per_learner`, or share GPUs: `shards_per_gpu = 2`")
    return ws


def load_workshop(path: str | Path) -> Workshop:
    """Read and check the workshop file at ``path``."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text())
    except OSError as exc:
        raise WorkshopError(f"cannot read the workshop file {p}: {exc.strerror}",
                            "give the path of your workshop file (see workshops/example.toml)"
                            ) from None
    except tomllib.TOMLDecodeError as exc:
        raise WorkshopError(f"{p} is not valid TOML: {exc}", "fix the line named above") from None
    return workshop_from_dict(data, str(p.resolve()))
