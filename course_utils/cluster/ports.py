"""Free-port choice and port checks. These run on the engine that must listen (rank 0 for the
torch master port, each TF task for its server port), so "free" is true where it matters.

Ports are picked below the kernel's ephemeral range: the OS hands ports from that range to
every outgoing connection, so a port picked there (``bind(0)``) can be taken by some other
program's connection in the moment between the pick and the server's bind (seen in CI as
``PortInUse ... the port is taken``). Below the range only another listener can take it.

At a workshop each learner's ports come from a block of their own (``$COURSE_PORTS``, set by
the hub; ``course_utils.workshop.render.firewall_nft`` closes each block to the other
learners), and a pick never leaves the block."""

from __future__ import annotations

import random
import socket

from ..errors import CourseError
from ..settings import ENV_PORTS, env

PICK_FLOOR = 20000          # lowest port picked; well above the registered services people run
PICK_TRIES = 200
# Its own generator: a seeded global `random` (a learner's random.seed(0)) would make every
# process pick the same ports in the same order.
_RNG = random.SystemRandom()


def port_block() -> tuple[int, int] | None:
    """``$COURSE_PORTS`` (``"LOW-HIGH"``, both included) as ``(low, high)`` with ``high``
    excluded, or ``None`` when it is not set."""
    text = env(ENV_PORTS).strip()
    if not text:
        return None
    try:
        low, high = (int(x) for x in text.split("-"))
    except ValueError:
        low = high = 0
    if not 0 < low <= high < 65536:
        raise CourseError(f"{ENV_PORTS}={text!r} is not a block of ports LOW-HIGH",
                          f"unset {ENV_PORTS}, or give two ports, e.g. 20000-20099")
    return (low, high + 1)


def pick_range() -> tuple[int, int]:
    """``(low, high)``: the ports :func:`free_ports` picks from, ``high`` excluded; the
    learner's block where one is set; ``(0, 0)`` when the ephemeral range starts too low to
    leave room (then the OS picks)."""
    block = port_block()
    if block is not None:
        return block
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            ephemeral_low = int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):   # not Linux: macOS's range starts at 49152
        ephemeral_low = 49152
    if ephemeral_low - PICK_FLOOR < 1000:
        return (0, 0)
    return (PICK_FLOOR, ephemeral_low)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that nothing listens on at ``host`` right now."""
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct free ports (held open together so none is handed out twice), below
    the ephemeral range where the machine allows it."""
    low, high = pick_range()
    fenced = port_block() is not None
    socks: list[socket.socket] = []
    try:
        tries = 0
        while len(socks) < count:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            if fenced and tries >= PICK_TRIES:
                raise CourseError(f"no {count} free port(s) in your block {low}-{high - 1} "
                                  f"({ENV_PORTS}) after {PICK_TRIES} tries",
                                  "stop what you left running (cu.stop() in your other "
                                  "notebooks), then try again")
            port = _RNG.randrange(low, high) if high and tries < PICK_TRIES else 0
            tries += 1
            try:
                s.bind((host, port))
            except OSError:
                if port == 0:
                    raise
                socks.pop().close()
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """True when ``port`` cannot be bound on ``host`` (someone listens or holds it)."""
    if not 0 < int(port) < 65536:
        raise ValueError(f"port {port} is outside 1..65535")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, int(port)))
        except OSError:
            return True
    return False
