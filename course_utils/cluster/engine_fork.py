"""Local engines forked from one process that has already imported torch and ipyparallel.

A fresh engine spends about 3.5 s of CPU importing ipyparallel and, on its first call, torch;
every engine of a cluster imports the same modules with the same environment. Here the first
local engine of a cluster starts a *fork server* instead (``python -m
course_utils.cluster.ipyparallel_engine --fork-server=SOCKET``, with the engines' environment):
it imports those modules once, then forks one child per engine. A child is a separate process
with its own pid, the engine's arguments, environment, working directory and output file; it
runs exactly what an exec'd engine runs (:func:`.ipyparallel_engine.run_engine`).

What stays as before: ipyparallel tracks each engine by its pid (signals, ``stop``, the
cluster file that other kernels read), process scans find engines by their command line
(``ipyparallel_engine``) and by the cluster id and run marks in their environment (a server
is started with exactly the environment its children get, so ``/proc/PID/environ`` is right).

Nothing here listens on the network: the server's socket is a Unix socket in a directory only
this user can enter. The server lives while the process that started it lives, exits when that
process stops the cluster (:func:`stop_fork_servers`), and after :data:`IDLE_S` s without a
child. ``COURSE_ENGINE_FORK=0`` starts every engine as its own ``python`` instead; so does any
failure to reach a server (a warning in the log says why).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import select
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
from ipyparallel.cluster.launcher import (
    LocalEngineLauncher,
    LocalEngineSetLauncher,
    ProcessStateError,
)

from .. import settings

ENV_FORK = "COURSE_ENGINE_FORK"
#: What the server imports before it forks (the course's engine side is imported as well).
PRELOAD = ("torch", "ipyparallel.engine.app", "ipyparallel.engine.kernel")
#: Seconds a server without children waits for another request before it exits.
IDLE_S = 60.0
_HEADER = struct.Struct("!I")
_LOCK = threading.Lock()
#: server key -> the server's process (started by this process), its cluster id and the
#: moment by which it must answer (the start timeout of the cluster it was started for)
_SERVERS: dict[str, tuple[subprocess.Popen, str, float]] = {}
#: keys whose server never answered: their engines are exec'd without asking again
_BROKEN: set[str] = set()


class ForkUnavailable(RuntimeError):
    """No fork server could take the request (the launcher then execs the engine)."""


def enabled(environ: dict[str, str] | None = None) -> bool:
    """True unless ``$COURSE_ENGINE_FORK`` is ``0`` (or the platform has no ``fork``)."""
    env = os.environ if environ is None else environ
    return hasattr(os, "fork") and env.get(ENV_FORK, "1").strip() not in ("0", "no", "false")


def socket_dir() -> Path:
    """This user's directory of server sockets (mode 0700; Unix socket paths must be short,
    so not the profile directory)."""
    d = Path(tempfile.gettempdir()) / f"course-engines-{os.getuid()}"
    d.mkdir(mode=0o700, exist_ok=True)
    os.chmod(d, 0o700)
    return d


def server_key(python: str, env: dict[str, str]) -> str:
    """Which server may fork an engine: same interpreter and exactly the same environment."""
    blob = json.dumps([python, sorted(env.items())]).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _send(conn: socket.socket, obj: Any, fds: list[int] | None = None) -> None:
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


def _recv(conn: socket.socket, maxfds: int = 0) -> tuple[Any, list[int]]:
    if maxfds:
        head, fds, _, _ = socket.recv_fds(conn, _HEADER.size, maxfds)
    else:
        head, fds = conn.recv(_HEADER.size), []
    if not head:
        raise ConnectionError("the other side closed the connection")
    (size,) = _HEADER.unpack(_recv_exact(conn, _HEADER.size, head))
    return json.loads(_recv_exact(conn, size)), list(fds)


# ---- the launcher side (the kernel or command that starts the cluster) ----------------------

def _connect(path: str, proc: subprocess.Popen, deadline: float) -> socket.socket:
    """A connection to the server at ``path``, waiting while it imports (until ``deadline``,
    on ``time.monotonic()``)."""
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            return s
        except OSError:
            s.close()
        if proc.poll() is not None:
            raise ForkUnavailable(f"the fork server exited with code {proc.returncode}")
        if time.monotonic() > deadline:
            raise ForkUnavailable("the fork server did not answer within the start timeout")
        time.sleep(0.02)


def _server_for(python: str, env: dict[str, str], cwd: str,
                timeout: float | None = None) -> tuple[str, str, subprocess.Popen, float]:
    """The running server for (python, env) started by this process, else a new one that must
    answer within ``timeout`` s (default ``$COURSE_START_TIMEOUT``): key, socket, process,
    deadline."""
    key = server_key(python, env)
    path = str(socket_dir() / f"{os.getpid()}-{key}.sock")
    if key in _BROKEN:
        raise ForkUnavailable("its fork server did not answer before")
    with _LOCK:
        proc, _, deadline = _SERVERS.get(key, (None, "", 0.0))
        if proc is None or proc.poll() is not None:
            deadline = time.monotonic() + (settings.start_timeout() if timeout is None
                                           else timeout)
            with contextlib.suppress(OSError):
                os.unlink(path)
            from .launching import ENGINE_MODULE

            log_dir = Path(env.get("IPP_PROFILE_DIR") or tempfile.gettempdir()) / "log"
            log_dir.mkdir(parents=True, exist_ok=True)
            log = log_dir / f"ipengine-fork-{env.get('IPP_CLUSTER_ID', '')}-{key}.log"
            with open(log, "ab") as out, open(os.devnull, "rb") as null:
                proc = subprocess.Popen(
                    [python, "-m", ENGINE_MODULE, f"--fork-server={path}"], env=env, cwd=cwd,
                    stdin=null, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            _SERVERS[key] = (proc, env.get("IPP_CLUSTER_ID", ""), deadline)
    return key, path, proc, deadline


def prestart(python: str, env: dict[str, str], timeout: float | None = None,
             cwd: str = ".") -> None:
    """Start the server for engines with ``env`` now (it imports while the controller
    starts; it must answer within ``timeout`` s); the engines' launcher finds it. Does nothing
    when forking is off."""
    if enabled(env):
        with contextlib.suppress(OSError, ForkUnavailable):
            _server_for(python, env, os.path.abspath(cwd), timeout)


def fork_engine(args: list[str], env: dict[str, str], cwd: str, output_file: str) -> int:
    """Have a server fork an engine running ``args`` (``python -m ENGINE_MODULE ...``) with
    ``env`` in ``cwd``, its output appended to ``output_file``; the engine's pid."""
    from .launching import ENGINE_MODULE

    if len(args) < 3 or args[1:3] != ["-m", ENGINE_MODULE]:
        raise ForkUnavailable(f"not a local course engine: {args[:3]}")
    cwd = os.path.abspath(cwd)
    key, path, proc, deadline = _server_for(args[0], env, cwd)
    try:
        conn = _connect(path, proc, deadline)
    except ForkUnavailable:
        _BROKEN.add(key)
        with contextlib.suppress(OSError):
            proc.kill()
        raise
    with conn, open(output_file, "ab") as out, open(os.devnull, "rb") as null:
        conn.settimeout(settings.start_timeout())
        try:
            _send(conn, {"argv": args[3:], "env": env, "cwd": cwd},
                  [null.fileno(), out.fileno()])
            reply, _ = _recv(conn)
        except (OSError, ValueError) as exc:
            raise ForkUnavailable(f"the fork server did not fork: {exc}") from exc
    if "pid" not in reply:
        raise ForkUnavailable(f"the fork server could not fork: {reply.get('error')}")
    return int(reply["pid"])


def stop_fork_servers(cluster_id: str | None = None) -> None:
    """End the servers this process started (those for ``cluster_id`` only, if given). Their
    engines are stopped separately (an engine outlives its server)."""
    with _LOCK:
        keys = [k for k, (_, cid, _) in _SERVERS.items() if cluster_id in (None, cid)]
        procs = [_SERVERS.pop(k)[0] for k in keys]
    for p in procs:
        with contextlib.suppress(OSError):
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=2)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)


class ForkedEngineLauncher(LocalEngineLauncher):
    """``LocalEngineLauncher`` whose engine is forked by a server (see the module); tracked by
    pid like any engine. Falls back to starting the process itself."""

    def start(self) -> Any:
        if self.state != "before":
            raise ProcessStateError(f"The process was already started: {self.state}")
        env = os.environ.copy()
        env.update(self.get_env())
        if not enabled(env):
            return super().start()
        try:
            pid = fork_engine(list(self.args), env, self.work_dir, self.output_file)
            self.process = psutil.Process(pid)
        except (ForkUnavailable, OSError, psutil.Error) as exc:
            self.log.warning(f"engine {self.identifier}: starting its own python ({exc})")
            return super().start()
        self.pid = pid
        self.notify_start(pid)
        self._start_waiting()
        return pid


class ForkedEngineSetLauncher(LocalEngineSetLauncher):
    """``LocalEngineSetLauncher`` of :class:`ForkedEngineLauncher` engines."""

    launcher_class = ForkedEngineLauncher
    #: How the cluster file names this class (a kernel joining the cluster imports it back).
    entrypoint_name = "course_utils.cluster.engine_fork.ForkedEngineSetLauncher"


# ---- the server side ------------------------------------------------------------------------

def _child(request: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: become the engine the request describes; never returns."""
    code = 1
    try:
        os.setsid()  # like ipyparallel's engines: a kernel's Ctrl-C is not sent to it
        os.dup2(fds[0], 0)
        os.dup2(fds[1], 1)
        os.dup2(fds[1], 2)
        for fd in fds:
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        if "numpy" in sys.modules:  # its global generator was seeded once, in the server
            sys.modules["numpy"].random.seed()
        from .ipyparallel_engine import ENGINE_FILE, run_engine

        sys.argv = [ENGINE_FILE, *request["argv"]]
        run_engine()
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
        request, fds = _recv(conn, maxfds=2)
    except (OSError, ValueError):
        return None
    if len(fds) != 2:
        for fd in fds:
            os.close(fd)
        _send(conn, {"error": "expected stdin and stdout"})
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
        _send(conn, {"pid": pid})
    return pid


def serve(path: str) -> None:
    """The fork server: import, listen on ``path``, fork engines until told to stop."""
    parent = os.getppid()
    for name in (*PRELOAD, *settings_preload()):
        with contextlib.suppress(Exception):
            __import__(name)
    from . import engine  # noqa: F401  (the engine side of the course, as an engine imports)

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
    finally:
        listener.close()
        with contextlib.suppress(OSError):
            os.unlink(path)


def settings_preload() -> list[str]:
    """The modules named in ``$COURSE_ENGINE_PRELOAD`` (comma-separated)."""
    return [n.strip() for n in os.environ.get("COURSE_ENGINE_PRELOAD", "").split(",")
            if n.strip()]
