"""How a fork server (:mod:`.ipyparallel_fork_server`) and the processes that ask it to fork
talk: one request per connection on its Unix socket, a length-prefixed JSON message with the
child's standard streams passed alongside (``SCM_RIGHTS``), and one reply with the child's
pid. Standard library only: engines, the server and the course's engine-side helpers import it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import time
from typing import Any

from ... import procs

#: The server's module, as its command line names it (``python -m SERVER_MODULE``). Here, not
#: imported from it: a module that ``python -m`` runs must not be imported before (runpy warns,
#: and the module would be loaded twice).
SERVER_MODULE = "course_utils.cluster.launchers.ipyparallel_fork_server"
#: Set in a fork server (and so in all its children): its socket. None in a process that no
#: server forked (an exec'd engine starts its helpers as their own ``python``).
FORK_SERVER: str | None = None
_HEADER = struct.Struct("!I")


def send_message(conn: socket.socket, obj: Any, fds: list[int] | None = None) -> None:
    """Send ``obj`` as length-prefixed JSON, with the file descriptors ``fds`` alongside."""
    data = json.dumps(obj).encode()
    head = _HEADER.pack(len(data))
    if fds:
        socket.send_fds(conn, [head], fds)
        conn.sendall(data)
    else:
        conn.sendall(head + data)


def _recv_exact(conn: socket.socket, n: int, got: bytes = b"") -> bytes:
    while len(got) < n:
        part = conn.recv(n - len(got))
        if not part:
            raise ConnectionError("the other side closed the connection")
        got += part
    return got


def recv_message(conn: socket.socket, maxfds: int = 0) -> tuple[Any, list[int]]:
    """One message of :func:`send_message`, and up to ``maxfds`` descriptors sent with it."""
    if maxfds:
        head, fds, _, _ = socket.recv_fds(conn, _HEADER.size, maxfds)
    else:
        head, fds = conn.recv(_HEADER.size), []
    if not head:
        raise ConnectionError("the other side closed the connection")
    (size,) = _HEADER.unpack(_recv_exact(conn, _HEADER.size, head))
    return json.loads(_recv_exact(conn, size)), list(fds)


def fork_call(path: str, target: str, args: list[Any], fds: list[int], env: dict[str, str],
              cwd: str, timeout: float = 30.0) -> int:
    """Ask the server at ``path`` to fork a child that calls ``target``
    (``"package.module:function"``) with ``args`` (JSON values), with ``fds`` as its stdin,
    stdout and stderr, environment ``env`` and working directory ``cwd``; the child's pid.
    Raises OSError when the server cannot be reached or refuses."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect(path)
        send_message(conn, {"call": target, "args": args, "env": env, "cwd": cwd}, fds)
        try:
            reply, _ = recv_message(conn)
        except ValueError as exc:
            raise OSError(f"the fork server answered badly: {exc}") from exc
    if "pid" not in reply:
        raise OSError(f"the fork server could not fork: {reply.get('error')}")
    return int(reply["pid"])


def fork_helper(path: str | None, target: str, args: list[Any], out_fds: list[int],
                env: dict[str, str], cwd: str) -> ForkedChild | None:
    """:func:`fork_call` for a helper process with no input (stdin ``/dev/null``; ``out_fds``:
    stdout and, if given, stderr): a handle on it, or None when there is no server (``path``
    None) or it cannot fork; the caller then starts a fresh ``python`` instead."""
    if not path:
        return None
    try:
        with open(os.devnull, "rb") as null:
            return ForkedChild(fork_call(path, target, args, [null.fileno(), *out_fds], env,
                                         cwd))
    except OSError:
        return None


class ForkedChild:
    """A process a fork server forked at this process's request: enough of ``Popen``
    (``pid``, ``poll``, ``terminate``, ``kill``) for the code that started it. It is the
    server's child, so its exit code is not known here: :meth:`poll` says -1 once it is gone.
    ``keep`` holds files (pipe ends) that must stay open as long as this object lives."""

    def __init__(self, pid: int, keep: tuple[Any, ...] = ()) -> None:
        self.pid = pid
        self.keep = keep
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and not procs.pid_alive(self.pid):
            self.returncode = -1
        return self.returncode

    def wait(self, timeout: float = 10.0) -> int | None:
        """Wait until the process is gone (at most ``timeout`` s); :meth:`poll`'s answer."""
        deadline = time.monotonic() + timeout
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
