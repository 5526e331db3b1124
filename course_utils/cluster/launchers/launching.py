"""Launching and stopping the processes of a cluster: controller and engines.

Framework-free and below :class:`~course_utils.cluster.kernel.course_cluster.CourseCluster`: these
functions work on an ``ipyparallel.Cluster``. The stop set is two functions:
:func:`stop_engines` (the engines only: a restart) and :func:`stop_cluster` (engines,
controller and files: the end). The public lifecycle (``cu.start()``, ``cu.stop()``,
``CourseCluster.stop()``) is in :mod:`.lifecycle` and :mod:`.course_cluster`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

import ipyparallel as ipp
from ipyparallel.cluster.launcher import LocalProcessLauncher

from ... import settings
from ...errors import CourseError, EnginesDidNotStart
from ..engines import engine, ipyparallel_engine
from ..kernel.cluster_files import course_file_of, owner_only, profile_dir, remove_stale
from ..kernel.sharing import adopt_recorded_engines
from ..profiles import ClusterProfile
from . import fork_client, slurm, slurm_queue

HEARTBEAT_MS = 500
HEARTBEAT_MISSES = 20
# How long an engine waits for the controller's answer to its registration. A local engine
# asks the moment the connection file is written, before the controller is ready to answer.
REGISTRATION_S = 30
#: The module local engines run (see its docstring).
ENGINE_MODULE = "course_utils.cluster.engines.ipyparallel_engine"


def cluster_kwargs(prof: ClusterProfile) -> dict[str, Any]:
    """Keyword arguments for ``ipyparallel.Cluster`` that select the profile's launchers.

    The controller listens on ``controller_ip`` only: loopback for the local profile,
    the shared link's address for SSH hosts (never every interface).
    """
    if prof.launcher == "local":
        # engines forked from one process that imported torch once (fork_client.py)
        engines = fork_client.ForkedEngineSetLauncher if fork_client.enabled() else "local"
        return {"engines": engines, "controller_ip": "127.0.0.1"}
    if prof.launcher == "slurm":  # the controller stays here, the engines are one Slurm job
        return slurm.cluster_kwargs(prof)
    from traitlets.config import Config

    from .ssh import CourseSSHEngineSetLauncher

    cfg = Config()
    for key, value in prof.ssh_launcher_settings({}, ".ipython/profile_course").items():
        setattr(cfg.SSHEngineSetLauncher, key, value)
    return {
        # ipyparallel's SSH launcher, starting the hosts in parallel (ssh_launcher.py)
        "engines": CourseSSHEngineSetLauncher,
        "controller_ip": prof.controller_ip,
        "controller_location": prof.controller_ip or "",
        "config": cfg,
    }


def new_ipp_cluster(cid: str, prof: ClusterProfile, n: int) -> ipp.Cluster:
    cl = ipp.Cluster(
        n=n,
        cluster_id=cid,
        profile_dir=profile_dir(),
        delay=0,  # engines get the connection info directly; no need to sleep after the controller
        shutdown_atexit=True,
        # ipyparallel logs every killed engine's whole output as a warning; our own errors
        # carry the output when it matters (EnginesDidNotStart).
        log_level=logging.ERROR,
        # ipyparallel finishes an engine's registration on its first heartbeats; the default
        # 3 s period costs ~5 s per start. 0.5 s with 20 allowed misses keeps a 10 s tolerance.
        controller_args=[
            f"--HeartMonitor.period={HEARTBEAT_MS}",
            f"--HeartMonitor.max_heartmonitor_misses={HEARTBEAT_MISSES}",
        ],
        **cluster_kwargs(prof),
    )
    # An engine gives up (exit 255) when the controller has not answered its registration
    # request in IPEngine.timeout, ipyparallel's 5 s by default: short for a controller that
    # is busy starting several learners' clusters at once. Every launcher (local, SSH, Slurm)
    # puts engine_args on the engine's command line.
    cl.config.EngineLauncher.engine_args = [f"--IPEngine.timeout={REGISTRATION_S:g}"]
    cmd = prof.engine_cmd()
    if prof.is_local:
        # Engines start with the controller, not after it: each waits for the connection
        # file itself (see ipyparallel_engine.py; ipyparallel would first wait for the
        # controller, then pass the connection info in the environment).
        cl.send_engines_connection_env = False
        cl.config.LocalEngineSetLauncher.delay = 0  # no 0.1 s pause between engines
        cmd = [*(cmd[:1] if cmd else [sys.executable]), "-m", ENGINE_MODULE]
    if cmd:
        cl.config.LocalEngineLauncher.engine_cmd = cmd
        cl.config.LocalEngineSetLauncher.engine_cmd = cmd
    return cl


def engine_env(prof: ClusterProfile, n: int, preload: Sequence[str] = ()) -> dict[str, str]:
    """The variables ``n`` engines of ``prof`` start with (on top of the launcher's); with
    ``preload``, the modules they import before their first call (a local cluster's fork
    server imports them once, before it forks the engines)."""
    env = prof.engine_env(n, settings.threads_per_engine(prof.engines_per_host(n)))
    if preload:
        env[ipyparallel_engine.PRELOAD_ENV] = ",".join(preload)
    return env


def prestart_fork_server(cl: ipp.Cluster, prof: ClusterProfile, n: int,
                         timeout: float, preload: Sequence[str] = ()) -> None:
    """Local engines: start their fork server now, so that it imports while the controller
    starts (the same environment as :func:`start_engines` gives the engines); it must answer
    within ``timeout`` s, else the engines start as their own processes."""
    if not prof.is_local or not isinstance(cl.engine_launcher_class, type) or not issubclass(
            cl.engine_launcher_class, fork_client.ForkedEngineSetLauncher):
        return
    cmd = cl.config.LocalEngineSetLauncher.engine_cmd
    env = {**os.environ, "IPP_CLUSTER_ID": cl.cluster_id, "IPP_PROFILE_DIR": cl.profile_dir,
           **engine_env(prof, n, preload)}
    fork_client.prestart(cmd[0], env, timeout)


def start_engines(cl: ipp.Cluster, prof: ClusterProfile, n: int,
                  preload: Sequence[str] = ()) -> None:
    """Start ``n`` engines the profile's way (this machine, SSH hosts, a Slurm job), each
    importing ``preload`` before its first call."""
    owner_only(cl)
    env = engine_env(prof, n, preload)
    if prof.launcher != "ssh":
        cl.start_engines_sync(n, environment=env)
        return
    from .ssh import start_ssh_engines

    start_ssh_engines(cl, prof, n, env)


def start_ipp_cluster(cid: str, prof: ClusterProfile, n: int, timeout: float,
                      preload: Sequence[str] = ()) -> tuple[ipp.Cluster, ipp.Client]:
    """A new controller and ``n`` engines under id ``cid`` (importing ``preload``),
    registered, and a client."""
    for attempt in (1, 2):
        remove_stale(cid)
        cl = new_ipp_cluster(cid, prof, n)
        prestart_fork_server(cl, prof, n, timeout, preload)
        cl.start_controller_sync()
        try:
            start_engines(cl, prof, n, preload)
            client = cl.connect_client_sync()
            break
        except CourseError:  # already says cause and fix (e.g. sbatch refused the engines' job)
            stop_cluster(cl)
            raise
        except Exception as exc:
            exited = controller_exited(cl)
            stop_cluster(cl)
            if exited and attempt == 1:
                # ipyparallel's controller picks each port by binding port 0 and closing it,
                # then binds it again: a port another process took in between ends it (exit 1)
                continue
            raise EnginesDidNotStart(
                f"could not launch engines: {exc}", "run `course doctor` to see which part fails"
            ) from exc
    wait_for_engines(cl, client, n, timeout)
    return cl, client


def controller_exited(cl: ipp.Cluster) -> bool:
    """The local controller process of ``cl`` has exited (False for one on another host)."""
    proc = getattr(cl.controller, "process", None) if isinstance(
        cl.controller, LocalProcessLauncher) else None
    return proc is not None and not _process_alive(proc)


def stop_engines(cl: ipp.Cluster, kill: bool = False) -> None:
    """SIGTERM, then SIGKILL after 2 s; ``kill=True`` skips the polite step (a rank stuck in a
    C-level collective ignores SIGINT and may not reach a Python SIGTERM handler)."""
    for es in list(cl.engines.values()):
        for el in list(getattr(es, "launchers", {}).values()):
            with contextlib.suppress(Exception):
                el.stop_seconds_until_kill = 2
    if kill:
        with contextlib.suppress(Exception):
            cl.signal_engines_sync(signal.SIGKILL)
    with contextlib.suppress(Exception):
        cl.stop_engines_sync()


def stop_cluster(cl: ipp.Cluster, kill: bool = False) -> None:
    """Stop every engine and the controller, then remove the cluster's files.

    The cluster file is read *first*: engines another kernel started (``cu.restart()``,
    stopping TF servers) are recorded there, not in this process's ``cl``.
    """
    adopt_recorded_engines(cl)
    stop_engines(cl, kill=kill)
    fork_client.stop_fork_servers(cl.cluster_id)
    with contextlib.suppress(Exception):
        engine.remove_stale_stack_files()
    controller_pid = (cl.controller.pid if isinstance(cl.controller, LocalProcessLauncher)
                      else None)
    with contextlib.suppress(Exception):
        cl.stop_controller_sync()
    if controller_pid:
        end_session_leftovers(controller_pid)
    with contextlib.suppress(Exception):  # the cluster file and the connection files
        remove_stale(cl.cluster_id, cl.profile_dir)
    with contextlib.suppress(Exception):
        course_file_of(cl).unlink(missing_ok=True)


def end_session_leftovers(leader: int) -> None:
    """SIGKILL what is left of the session that process ``leader`` started (ipyparallel starts
    a local controller as a session leader, and its schedulers join that session). A
    controller stopped while it is still starting (a Slurm job refused at once) can die before
    its schedulers, which would otherwise live on, orphaned."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(leader, signal.SIGKILL)


def engine_output(cl: ipp.Cluster, limit: int = 1500) -> str:
    out = []
    for es in cl.engines.values():
        with contextlib.suppress(Exception):
            text = es.get_output()
            if text:
                out.append(text.strip())
    text = "\n".join(out).strip()
    return text[-limit:] if text else "(no engine output)"


def _process_alive(proc: Any) -> bool:
    import psutil

    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def engines_all_exited(cl: ipp.Cluster) -> bool:
    """True when every engine process we launched has exited (checked on the processes
    themselves: the launchers' own state only updates while ipyparallel's loop runs)."""
    launchers = [el for es in cl.engines.values()
                 for el in getattr(es, "launchers", {}).values()]
    if not launchers:
        return all(getattr(es, "state", "running") == "after" for es in cl.engines.values())
    for el in launchers:
        proc = getattr(el, "process", None)
        if proc is None:
            if getattr(el, "state", "running") != "after":
                return False
        elif _process_alive(proc):
            return False
    return True


def wait_for_engines(cl: ipp.Cluster, client: ipp.Client, n: int, timeout: float,
                     exclude: set[int] | None = None) -> None:
    """Wait until ``n`` engines (not in ``exclude``) registered; fail fast if they all died
    (then the cluster is stopped)."""
    exclude = exclude or set()
    deadline = time.monotonic() + timeout
    while True:
        fresh = [e for e in client.ids if e not in exclude]
        if len(fresh) >= n:
            return
        # Hook: a Slurm job stuck in the queue or ended says so itself (slurm_queue.py).
        stuck = slurm_queue.engines_problem(cl, len(fresh), n, time.monotonic() > deadline)
        if stuck is not None:
            stop_cluster(cl)
            raise stuck
        if time.monotonic() > deadline or engines_all_exited(cl):
            died = engines_all_exited(cl)
            output = engine_output(cl)
            stop_cluster(cl)
            reason = "exited before registering" if died else f"did not register in {timeout:g} s"
            raise EnginesDidNotStart(
                f"{n - len(fresh)} of {n} engines {reason}. Engine output:\n{output}",
                "run `course doctor` for the failing check; on a slow machine raise "
                "$COURSE_START_TIMEOUT; for remote hosts check the profile's python path "
                "and that the hosts can reach controller_ip",
            )
        time.sleep(0.02)


def wait_unregistered(client: ipp.Client, old: set[int],
                      timeout: float = HEARTBEAT_MS * HEARTBEAT_MISSES / 1000 + 5) -> None:
    """Wait until the controller dropped the replaced engines ``old``, so the rank map and
    ``%%px`` see only the new ones. Locally an engine's nanny reports its death at once; a
    Slurm job's cancel kills the nannies too, and the controller notices only when the
    heartbeats stop (``HEARTBEAT_MISSES`` periods)."""
    deadline = time.monotonic() + timeout
    while set(client.ids) & old and time.monotonic() < deadline:
        time.sleep(0.05)
