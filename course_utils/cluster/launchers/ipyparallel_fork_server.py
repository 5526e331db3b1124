"""The fork server of a cluster's local engines: ``python -m
course_utils.cluster.launchers.ipyparallel_fork_server --socket=PATH`` (started by
:mod:`.fork_client`, which explains why). It imports what every engine imports, then listens on
the Unix socket ``PATH``; each connection asks for one engine (its arguments, environment, working
directory, stdin and output file) and gets the pid of a forked child that runs
:func:`..engines.ipyparallel_engine.run_engine`. Its children show its command line
(``ipyparallel`` in it, as process scans of engines expect).

A forked engine asks the same server (:func:`.fork_protocol.fork_call`) for the helper
processes it would otherwise start as a fresh ``python``: ipyparallel's nanny (which relays
signals to it) and the launcher of a graded check's own ranks
(:func:`course_utils.checks.spawn.spawn`), which would import torch again.

It exits when the process that started it is gone (its children stay: they may be engines
of a cluster another process runs), on SIGTERM (its children that are still there are killed
with it: the clusters it served have stopped), and after :data:`IDLE_S` s without a child (a
cluster's stop kills its children and leaves it to that: the next cluster is forked by it).
Standard library and the engine's own modules only.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import select
import signal
import socket
import sys
import time
from typing import Any

from ..engines.ipyparallel_engine import ENGINE_FILE, preload_names, run_engine
from . import fork_protocol

#: What the server imports before it forks (the course's engine side is imported as well).
#: ``torch._dynamo``: a process's first torch optimizer or ``DistributedDataParallel`` imports it
#: (about 2 CPU-seconds), which every engine and every rank of a graded check would pay again.
#: ``ipykernel.debugger`` (debugpy): every engine's kernel imports it as it starts, 0.3 s of
#: CPU, most of what a forked engine spent starting.
PRELOAD = ("torch", "torch._dynamo", "ipyparallel.engine.app", "ipyparallel.engine.kernel",
           "ipykernel.debugger")
#: Seconds a server without children waits for another request before it exits.
IDLE_S = 60.0
#: This module, as the server's command line names it.
MODULE = fork_protocol.SERVER_MODULE


def _run_request(request: dict[str, Any]) -> None:
    """In the child: an engine (``argv``) or a call (``call``, ``args``)."""
    if "call" in request:
        module, _, name = str(request["call"]).partition(":")
        sys.argv = [sys.executable]
        getattr(importlib.import_module(module), name)(*request.get("args", []))
    else:
        sys.argv = [ENGINE_FILE, *request["argv"]]
        run_engine()


def _child(request: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: become what the request describes; never returns."""
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the server's handler is not the engine's
        os.setsid()  # like ipyparallel's engines: a kernel's Ctrl-C is not sent to it
        os.dup2(fds[0], 0)
        os.dup2(fds[1], 1)
        os.dup2(fds[-1], 2)  # stdout again unless a third descriptor came
        for fd in fds:
            if fd > 2:
                os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        if "numpy" in sys.modules:  # its global generator was seeded once, in the server
            sys.modules["numpy"].random.seed()
        _run_request(request)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - the child must never return into the server
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _serve_one(conn: socket.socket, listener: socket.socket) -> int | None:
    """Fork the engine one connection asks for; its pid (None if the request was bad)."""
    conn.settimeout(10)
    try:
        request, fds = fork_protocol.recv_message(conn, maxfds=3)
    except (OSError, ValueError):
        return None
    if len(fds) not in (2, 3):
        for fd in fds:
            os.close(fd)
        fork_protocol.send_message(conn, {"error": "expected stdin, stdout and maybe stderr"})
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        listener.close()
        conn.close()
        _child(request, fds)
    for fd in fds:
        os.close(fd)
    with contextlib.suppress(OSError):
        fork_protocol.send_message(conn, {"pid": pid})
    return pid


def _exit_on_signal(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def serve(path: str) -> None:
    """The fork server: import, listen on ``path``, fork engines until told to stop."""
    parent = os.getppid()
    # debugpy warns at import that frozen modules may hide breakpoints; nobody debugs the server
    # (its children get their own environment)
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    for name in (*PRELOAD, *preload_names()):
        with contextlib.suppress(Exception):
            __import__(name)

    # SIGTERM (the end of the process's clusters) ends the loop below; the socket file goes
    signal.signal(signal.SIGTERM, _exit_on_signal)
    fork_protocol.FORK_SERVER = path  # what its children ask for their helper processes
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with contextlib.suppress(OSError):
        os.unlink(path)
    listener.bind(path)  # a connection succeeds from now on: everything is imported
    listener.listen(16)
    children: set[int] = set()
    idle_since = time.monotonic()
    try:
        while os.getppid() == parent:
            ready, _, _ = select.select([listener], [], [], 0.2)
            while children:
                try:
                    pid, _ = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    children.clear()
                    break
                if pid == 0:
                    break
                children.discard(pid)
                if not children:
                    idle_since = time.monotonic()
            if ready:
                conn, _ = listener.accept()
                with conn:
                    pid = _serve_one(conn, listener)
                if pid:
                    children.add(pid)
            elif not children and time.monotonic() - idle_since > IDLE_S:
                break
    except SystemExit:
        # SIGTERM: the clusters it served are being stopped, their engines were told to go;
        # whatever it forked and is still there (an engine a joined kernel restarted, missed by
        # the stop; a nanny) goes with it, its session too (each child is a session leader)
        for pid in children:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
        raise
    finally:
        listener.close()
        with contextlib.suppress(OSError):
            os.unlink(path)


def main() -> None:
    path = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--socket=")]
    if not path:
        sys.exit(f"usage: python -m {MODULE} --socket=PATH")
    serve(path[0])


if __name__ == "__main__":
    main()
