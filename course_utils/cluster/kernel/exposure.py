"""What the course's processes listen on, and which of those sockets other machines can reach.

On the local profile everything the course starts binds the loopback address, except what
TensorFlow cannot be told: a ``tf.distribute.Server`` (units 4-5, and unit 5's coordinator in
the kernel) listens on ``0.0.0.0:<port>`` whatever host its ClusterSpec names (TensorFlow's
gRPC server adds its port as ``0.0.0.0:<port>``; no option or variable changes that).
``course doctor`` prints this report; the "What listens" table of docs/cluster.md says the same.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Listener:
    """One listening TCP socket of a course process."""

    role: str  # "kernel", "controller", "rank 0", ...
    pid: int
    addr: str
    port: int

    @property
    def loopback(self) -> bool:
        return is_loopback(self.addr)

    def text(self) -> str:
        where = "all interfaces" if self.addr in ("0.0.0.0", "::") else self.addr
        return f"{self.role} (pid {self.pid}) port {self.port} on {where}"


def is_loopback(addr: str) -> bool:
    """True for 127.0.0.0/8 and ::1 (packets from other machines never reach these)."""
    try:
        return ipaddress.ip_address(addr.split("%")[0]).is_loopback
    except ValueError:
        return False


def listening_table(tables: str | None = None) -> list[tuple[str, int, int]]:
    """``(address, port, uid)`` of every listening TCP socket of this network namespace, any
    user's, from ``/proc/net/tcp`` and ``tcp6`` (or from ``tables``, their text); the address
    in the tables' hex. Introduced for ``course workshop check``'s firewall line."""
    if tables is None:
        tables = ""
        for name in ("/proc/net/tcp", "/proc/net/tcp6"):
            with contextlib.suppress(OSError), open(name) as fh:
                tables += fh.read()
    found = []
    for line in tables.splitlines():
        cols = line.split()
        if len(cols) < 8 or cols[3] != "0A" or ":" not in cols[1]:
            continue  # a header, or not a listening socket
        address, port = cols[1].rsplit(":", 1)
        found.append((address, int(port, 16), int(cols[7])))
    return found


def listening(pid: int | None = None, children: bool = False) -> list[tuple[int, str, int]]:
    """``(pid, address, port)`` of every TCP socket process ``pid`` (default: this one) listens
    on; with ``children``, its child processes' too (the controller runs its schedulers so)."""
    import psutil

    root = psutil.Process(pid or os.getpid())
    procs = [root] + (root.children(recursive=True) if children else [])
    out: dict[tuple[str, int], int] = {}  # forked children share their parent's sockets
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            for c in proc.net_connections(kind="tcp"):
                if c.status == psutil.CONN_LISTEN:
                    out.setdefault((c.laddr.ip, c.laddr.port), proc.pid)
    return sorted((p, a, port) for (a, port), p in out.items())


def report(cc: Any) -> list[Listener]:
    """Listening sockets of the kernel, the controller (local) and every engine (asked on the
    engine itself, so remote hosts report too)."""
    found = [Listener("kernel", p, a, port) for p, a, port in listening()]
    ctl = getattr(getattr(cc.cluster, "controller", None), "process", None)
    if ctl is not None:
        with contextlib.suppress(Exception):
            found += [Listener("controller", p, a, port)
                      for p, a, port in listening(ctl.pid, children=True)]
    for info, socks in zip(cc.ranks, cc.run(listening, timeout=30), strict=True):
        found += [Listener(f"rank {info.rank}", p, a, port) for p, a, port in socks]
    return found


def exposed(listeners: list[Listener]) -> list[Listener]:
    """The sockets another machine could connect to."""
    return [x for x in listeners if not x.loopback]
