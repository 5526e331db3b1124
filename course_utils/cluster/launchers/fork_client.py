"""Local engines forked from one process that has already imported torch and ipyparallel.

A fresh engine spends about 3.5 s of CPU importing ipyparallel and, on its first call, torch;
every engine of a cluster imports the same modules with the same environment. Here a local
cluster starts a *fork server* with its controller (:mod:`.ipyparallel_fork_server`, with
the engines' environment): it imports those modules once, then forks one child per engine. A
child is a separate process with its own pid, the engine's arguments, environment, working
directory and output file; it runs exactly what an exec'd engine runs
(:func:`.ipyparallel_engine.run_engine`).

What stays as before: ipyparallel tracks each engine by its pid (signals, ``stop``, the
cluster file that other kernels read), process scans find engines by their command line
(``ipyparallel`` in it) and by run marks in their environment (a server is started with the
environment its children get, so ``/proc/PID/environ`` is right, but for the
:data:`MOMENTARY` and :data:`CLUSTER_VARS` variables, which show the values the server was
started with; ask :func:`servers_of` which servers forked a cluster's engines).

A server is not tied to one cluster: another cluster this process starts while the first runs,
with the same interpreter, working directory and environment (but for the variables that name
a cluster, :data:`CLUSTER_VARS`), is forked by it too, instead of importing torch again.

Nothing here listens on the network: the server's socket is a Unix socket in a directory only
this user can enter. The server lives while the process that started it lives and exits after
a minute without a child. When the last cluster it served is stopped (:func:`stop_fork_servers`)
it kills what it forked that is still there and stays for that minute: a cluster started again
with the same environment (``cu.stop()`` then ``cu.start()``, the next test of a test run) is
forked by it instead of importing torch again (about 3.5 s of CPU). A process without a cluster
that starts checks' worlds gets a server of its own for them (:func:`helper_server_socket`).
``COURSE_ENGINE_FORK=0`` starts every engine as its own ``python`` instead; so does any
failure to reach a server (a warning in the log says why).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
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

from ... import procs, settings
from ...private_dir import private_dir
from ...settings import ENV_ENGINE_FORK, env
from ..engines import ipyparallel_engine
from . import fork_protocol

ENV_FORK = ENV_ENGINE_FORK
_LOCK = threading.Lock()
#: server key -> the server's process (started by this process), the ids of the clusters it
#: forked engines for, the moment by which it must answer (the start timeout of the cluster it
#: was started for) and its socket (kept: where the socket folder is can change while a process
#: runs, with ``tempfile.tempdir``)
_SERVERS: dict[str, tuple[subprocess.Popen, set[str], float, str]] = {}
#: cluster id -> the links to a server's socket named for that cluster (:func:`_alias`)
_ALIASES: dict[str, list[Path]] = {}
#: keys whose server never answered: their engines are exec'd without asking again
_BROKEN: set[str] = set()


#: The engine commands (``python -m MODULE``) a server forks.
ENGINE_MODULES = (ipyparallel_engine.MODULE, "ipyparallel.engine")


class ForkUnavailable(RuntimeError):
    """No fork server could take the request (the launcher then execs the engine)."""


def enabled(environ: dict[str, str] | None = None) -> bool:
    """True unless ``$COURSE_ENGINE_FORK`` is ``0`` (or the platform has no ``fork``)."""
    return hasattr(os, "fork") and env(ENV_FORK, environ) not in ("0", "no", "false")


def socket_dir() -> Path:
    """This user's directory of server sockets (in :func:`private_dir`, mode 0700; Unix socket
    paths must be short, so not the profile directory)."""
    return private_dir("engines")


#: Variables that change while a process runs and that nothing reads before an engine starts
#: (its child gets the request's values): pytest's name of the running test, the connection
#: info ipyparallel hands the engines, a kernel's TF_CONFIG, and what libraries write into
#: ``os.environ`` as they import or run: importing scikit-learn (the course's offline data)
#: sets Intel OpenMP's two ``KMP_`` variables, which torch's GNU OpenMP never reads; torch's
#: compiler sets its cache folder when it first compiles; importing TensorFlow sets five, which
#: it sets again in any process that imports it (``TF2_BEHAVIOR`` always to 1, h5py's plugin
#: path to ``disable`` before it imports h5py). A difference in them alone does not start
#: another server (each one imports torch again, 2-3 s of CPU, and holds its memory): a kernel
#: that imported TensorFlow after ``cu.start()`` (unit 8) started two more servers.
MOMENTARY = ("PYTEST_CURRENT_TEST", "IPP_CONNECTION_INFO", "TF_CONFIG", "KMP_DUPLICATE_LIB_OK",
             "KMP_INIT_AT_FORK", "TORCHINDUCTOR_CACHE_DIR", "TF2_BEHAVIOR",
             "ENABLE_RUNTIME_UPTIME_TELEMETRY", "TPU_ML_PLATFORM", "TPU_ML_PLATFORM_VERSION",
             "HDF5_PLUGIN_PATH")


#: Variables that name the cluster an engine belongs to. Nothing the server imports reads them,
#: so one server forks the engines of every cluster this process runs; each child gets its own
#: values, while ``/proc/PID/environ`` shows those of the cluster the server was started for
#: (process scans that must find a run's processes use a mark that is part of the key, such as
#: the grader's ``COURSE_GRADING_RUN``).
CLUSTER_VARS = ("IPP_CLUSTER_ID", "IPP_PROFILE_DIR", settings.ENV_CLUSTER_ID)


def server_key(python: str, env: dict[str, str], cwd: str = "") -> str:
    """Which server may fork an engine: same interpreter, working directory (a ``python -m``
    puts it first on ``sys.path``) and environment, but for the :data:`MOMENTARY` and
    :data:`CLUSTER_VARS` variables."""
    kept = sorted((k, v) for k, v in env.items() if k not in MOMENTARY + CLUSTER_VARS)
    blob = json.dumps([python, cwd, kept]).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def cluster_tag(python: str, env: dict[str, str]) -> str:
    """What the names of the links to every server of one cluster's engines (any process's)
    begin with: the interpreter and the cluster id."""
    blob = json.dumps([python, env.get("IPP_CLUSTER_ID", "")]).encode()
    return hashlib.sha256(blob).hexdigest()[:10]


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
                timeout: float | None = None) -> tuple[str, str, subprocess.Popen, float, bool]:
    """The running server for (python, env, cwd) started by this process, else a new one that
    must answer within ``timeout`` s (default ``$COURSE_START_TIMEOUT``): key, socket, process,
    deadline, and whether it was started now."""
    key = server_key(python, env, cwd)
    if key in _BROKEN:
        raise ForkUnavailable("its fork server did not answer before")
    cid = env.get("IPP_CLUSTER_ID", "")
    with _LOCK:
        proc, clusters, deadline, path = _SERVERS.get(key, (None, set(), 0.0, ""))
        fresh = proc is None or proc.poll() is not None
        if fresh:
            clusters = set()
            # named for no cluster: another process finds it only through the link named for
            # a cluster it serves (:func:`_alias`), which goes when that cluster stops
            path = str(socket_dir() / f"server-{os.getpid()}-{key}.sock")
            deadline = time.monotonic() + (settings.start_timeout() if timeout is None
                                           else timeout)
            remove_stale_sockets()
            log_dir = Path(env.get("IPP_PROFILE_DIR") or tempfile.gettempdir()) / "log"
            log_dir.mkdir(parents=True, exist_ok=True)
            log = log_dir / f"ipengine-fork-{env.get('IPP_CLUSTER_ID', '')}-{key}.log"
            with open(log, "ab") as out, open(os.devnull, "rb") as null:
                proc = subprocess.Popen(
                    [python, "-m", fork_protocol.SERVER_MODULE, f"--socket={path}"], env=env,
                    cwd=cwd, stdin=null, stdout=out, stderr=subprocess.STDOUT,
                    start_new_session=True)
        if cid and cid not in clusters:
            clusters.add(cid)
            _alias(path, cluster_tag(python, env), key, cid)
        _SERVERS[key] = (proc, clusters, deadline, path)
    return key, path, proc, deadline, fresh


def _alias(path: str, tag: str, key: str, cluster_id: str) -> None:
    """A link named for the cluster with ``tag``, to the server's socket at ``path``: a kernel
    that joined that cluster finds the server (:func:`_other_server`) while the cluster runs."""
    link = socket_dir() / f"{tag}-{os.getpid()}-{key}.sock"
    with contextlib.suppress(OSError):
        link.unlink()
    with contextlib.suppress(OSError):
        os.symlink(path, link)
        _ALIASES.setdefault(cluster_id, []).append(link)


def remove_stale_sockets() -> list[str]:
    """Delete this user's server sockets (and links to them) that no server answers on (a
    server killed with SIGKILL leaves its file); the names removed."""
    gone = []
    for sock in socket_dir().glob("*.sock"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(str(sock))
        except OSError:
            with contextlib.suppress(OSError):
                sock.unlink()
                gone.append(sock.name)
        finally:
            s.close()
    return gone


def prestart(python: str, env: dict[str, str], timeout: float | None = None,
             cwd: str = ".") -> None:
    """Start the server for engines with ``env`` now (it imports while the controller
    starts; it must answer within ``timeout`` s); the engines' launcher finds it. Does nothing
    when forking is off."""
    if enabled(env):
        with contextlib.suppress(OSError, ForkUnavailable):
            _server_for(python, env, os.path.abspath(cwd), timeout)


def _other_server(python: str, env: dict[str, str]) -> socket.socket | None:
    """A connection to a running server of the same cluster that another process started
    (``course lab``'s, the grader's), if there is one: a kernel that replaces the engines of a
    cluster it joined (``cu.restart()``) forks them there instead of importing torch again.
    The engines get this process's environment either way."""
    tag = cluster_tag(python, env)
    for sock in sorted(socket_dir().glob(f"{tag}-*.sock")):
        pid = sock.name.split("-")[1]
        if not pid.isdigit() or int(pid) == os.getpid() or not procs.pid_alive(int(pid)):
            continue
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(str(sock))
            return s
        except OSError:
            s.close()
    return None


def _own_connection(python: str, env: dict[str, str], cwd: str) -> socket.socket:
    """A connection to this process's server for (python, env, cwd), started if need be (again,
    if the running one exited idle just now)."""
    while True:
        key, path, proc, deadline, fresh = _server_for(python, env, cwd)
        try:
            return _connect(path, proc, deadline)
        except ForkUnavailable:
            if not fresh and proc.poll() is not None:
                continue
            _BROKEN.add(key)
            with contextlib.suppress(OSError):
                proc.kill()
            raise


def fork_engine(args: list[str], env: dict[str, str], cwd: str, output_file: str) -> int:
    """Have a server fork an engine running ``args`` (``python -m
    course_utils.cluster.engines.ipyparallel_engine ...``) with ``env`` in ``cwd``, its output
    appended to ``output_file``; the engine's pid. This process's own server for ``env`` if it runs,
    else another process's for the same cluster, else a new one of this process."""
    # ipyparallel's own module too: a kernel that joined the cluster (Cluster.from_file) has
    # ipyparallel's default engine command; the child runs the same engine either way
    if len(args) < 3 or args[1] != "-m" or args[2] not in ENGINE_MODULES:
        raise ForkUnavailable(f"not a local engine: {args[:3]}")
    cwd = os.path.abspath(cwd)
    own = _SERVERS.get(server_key(args[0], env, cwd))
    conn = _other_server(args[0], env) if own is None or own[0].poll() is not None else None
    if conn is None:
        conn = _own_connection(args[0], env, cwd)
    with conn, open(output_file, "ab") as out, open(os.devnull, "rb") as null:
        conn.settimeout(settings.start_timeout())
        try:
            fork_protocol.send_message(conn, {"argv": args[3:], "env": env, "cwd": cwd},
                                     [null.fileno(), out.fileno()])
            reply, _ = fork_protocol.recv_message(conn)
        except (OSError, ValueError) as exc:
            raise ForkUnavailable(f"the fork server did not fork: {exc}") from exc
    if "pid" not in reply:
        raise ForkUnavailable(f"the fork server could not fork: {reply.get('error')}")
    return int(reply["pid"])


def own_server_socket() -> str | None:
    """The socket of a running fork server this process started (a running cluster's first,
    then one started with this process's environment, then an idle one a stopped cluster left),
    or None: a helper that needs a short-lived torch process of its own asks it to fork one
    (:func:`course_utils.checks.spawn.spawn`)."""
    own = server_key(sys.executable, dict(os.environ), os.getcwd())
    with _LOCK:  # a running cluster's server first, then one with this process's environment
        alive = sorted((not clusters, key != own, path)
                       for key, (p, clusters, _, path) in _SERVERS.items() if p.poll() is None)
    return next((path for *_, path in alive if os.path.exists(path)), None)


def helper_server_socket() -> str | None:
    """A fork server for this process's short-lived torch helpers, answering: the one a
    cluster of this process runs (:func:`own_server_socket`), else one started now with this
    process's environment (it exits after a minute without a child, or with this process).
    None when forking is off or no server answers: the caller then starts a fresh ``python``.
    A process that starts several checks' worlds without a cluster (a test run, a peer's
    program) imports torch once instead of once per world (about 3 CPU-s each)."""
    path = own_server_socket()
    if path or not enabled():
        return path
    try:
        _own_connection(sys.executable, dict(os.environ), os.getcwd()).close()
    except (OSError, ForkUnavailable):
        return None
    return own_server_socket()


def servers_of(cluster_id: str) -> list[int]:
    """The pids of the running servers this process started that forked engines of
    ``cluster_id``."""
    with _LOCK:
        return sorted(p.pid for p, clusters, _, _ in _SERVERS.values()
                      if cluster_id in clusters and p.poll() is None)


def stop_fork_servers(cluster_id: str | None = None) -> None:
    """With ``cluster_id``: the servers that no other running cluster of this process uses
    kill what they forked that is still there (an engine a joined kernel restarted and the stop
    did not know of, a nanny) and stay, idle, for the next cluster this process starts with the
    same environment (``cu.stop()`` then ``cu.start()``) or for checks' worlds; each
    exits after :data:`~.ipyparallel_fork_server.IDLE_S` s without a child. Without: end every
    server this process started, with what it forked. Engines are stopped first, separately; a
    server whose process exited leaves its engines running."""
    with _LOCK:
        gone = [cid for cid in _ALIASES if cluster_id in (None, cid)]
        links = [link for cid in gone for link in _ALIASES.pop(cid)]
        served = [k for k, (_, clusters, _, _) in _SERVERS.items()
                  if cluster_id is None or cluster_id in clusters]
        for k in served:
            _SERVERS[k][1].discard(cluster_id)
        idle = [_SERVERS[k][0] for k in served if cluster_id is not None and not _SERVERS[k][1]]
        procs = [_SERVERS.pop(k)[0] for k in served] if cluster_id is None else []
    for link in links:
        with contextlib.suppress(OSError):
            link.unlink()
    for p in idle:
        _end_children(p.pid)
    for p in procs:
        with contextlib.suppress(OSError):
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=2)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)


def _end_children(server: int, timeout: float = 5.0) -> None:
    """SIGKILL what the server ``server`` forked that is still there, each child with its
    session (each is a session leader: an engine's nanny goes too); until they are gone (the
    server reaps them) or ``timeout`` s."""
    try:
        kids = psutil.Process(server).children()
    except psutil.Error:
        return
    for kid in kids:
        with contextlib.suppress(OSError):
            os.killpg(kid.pid, signal.SIGKILL)
    psutil.wait_procs(kids, timeout=timeout)


class ForkedEngineLauncher(LocalEngineLauncher):
    """``LocalEngineLauncher`` whose engine is forked by a server (see the module); tracked by
    pid like any engine. Falls back to starting the process itself.

    Only public parts of ipyparallel's launcher are used or overridden (``start``, ``join``,
    ``notify_start``, ``notify_stop``, ``loop``, ``process``): the engine is not this process's
    child, so a thread of ours waits for it and reports its exit on the launcher's loop, as
    ipyparallel's own waiter does for the processes it starts."""

    _exit_watch: threading.Thread | None = None

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
        loop = self.loop  # read here, on the thread that started the engine
        self._exit_watch = threading.Thread(target=self._report_exit, args=(loop,),
                                            daemon=True, name=f"wait(pid={pid})")
        self._exit_watch.start()
        return pid

    def _report_exit(self, loop: Any) -> None:
        code = None
        while self.state == "running":
            try:
                code = self.process.wait(timeout=self.poll_seconds)
                break
            except psutil.TimeoutExpired:
                continue
        stopped = {"exit_code": code, "pid": self.pid, "identifier": self.identifier}
        loop.add_callback(lambda: self.notify_stop(stopped))

    async def join(self, timeout: float | None = None) -> None:
        """Until the forked engine has exited (``TimeoutError`` after ``timeout`` s)."""
        if self._exit_watch is None:  # started as its own python, or read back from a file
            return await super().join(timeout)
        self._exit_watch.join(timeout=timeout)
        if self._exit_watch.is_alive():
            raise TimeoutError(f"Process {self.pid} did not exit in {timeout} seconds.")


class ForkedEngineSetLauncher(LocalEngineSetLauncher):
    """``LocalEngineSetLauncher`` of :class:`ForkedEngineLauncher` engines."""

    launcher_class = ForkedEngineLauncher
    #: How the cluster file names this class (a kernel joining the cluster imports it back).
    entrypoint_name = "course_utils.cluster.launchers.fork_client.ForkedEngineSetLauncher"
