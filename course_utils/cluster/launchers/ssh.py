"""ipyparallel's SSH engine launcher, with the hosts started and stopped in parallel.

Introduced in ``06_two_hosts``. Every SSH profile uses it (``launcher = "ssh"``): it is
ipyparallel's ``SSHEngineSetLauncher`` (the same ``ssh``/``scp`` commands, the same per-host
settings, connection files sent with scp, each engine started by ipyparallel's remote helper),
with two changes that matter in a workshop:

* **start**: ipyparallel starts engines one after the other, about 5 s each over SSH (several
  ssh round trips and remote Python starts per engine), so 2 hosts x 8 GPUs take over a
  minute. Here each host starts in its own thread: the first engine of a host (which copies
  the connection files) first, then its other engines at once.
* **signal/stop**: one ``ssh HOST kill -SIG pid pid ...`` per host instead of one ssh (plus a
  remote Python) per engine, the hosts in parallel.

Configured like the original: ``c.SSHEngineSetLauncher.engines``, ``ssh_cmd``, ``ssh_args``...
(traitlets applies a parent class's config to this subclass).
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal as _signal
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ipyparallel.cluster.launcher import SSHEngineLauncher, SSHEngineSetLauncher

from ...errors import EnginesDidNotStart

if TYPE_CHECKING:
    import ipyparallel as ipp

    from ..profiles import ClusterProfile

#: ssh commands per host (kill) give up after this many seconds.
SSH_COMMAND_TIMEOUT = 20.0


def _run_all(tasks: list[Callable[[], Any]], workers: int | None = None) -> list[Any]:
    """Run the callables concurrently; results (or the exceptions they raised) in order."""
    if not tasks:
        return []

    def safe(fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except BaseException as exc:  # reported to the caller, never lost in a thread
            return exc

    with ThreadPoolExecutor(max_workers=workers or len(tasks)) as pool:
        return list(pool.map(safe, tasks))


class HostStartError(RuntimeError):
    """Engines could not be started on one host: which host, and why (one line)."""

    def __init__(self, host: str, why: str) -> None:
        self.host, self.why = host, why
        super().__init__(f"host {host!r}: {why}")


def _why(exc: BaseException, python: str) -> str:
    """One line for a failed remote step; a missing interpreter said in plain words."""
    if isinstance(exc, subprocess.CalledProcessError):
        if exc.returncode == 127:
            return f"{python}: command not found on that host (the profile's python)"
        if exc.returncode == 255:
            return "ssh failed (host unreachable or sshd gone)"
    text = str(exc).strip().splitlines()
    return text[-1] if text else type(exc).__name__


class CourseSSHEngineLauncher(SSHEngineLauncher):
    """One engine over SSH; its waiting thread survives a host that is briefly unreachable.

    ipyparallel polls a remote engine with ``ssh HOST python ssh_waitpid`` from a thread; an
    ssh that fails (a link down, sshd restarting) kills that thread with a traceback. Here a
    failed poll is retried every few seconds; a host that stays unreachable for
    :attr:`unreachable_for` seconds has lost its engine: the launcher reports it stopped
    (exit code -1, with a warning in the log) instead of dying.
    """

    #: Report the engine stopped after this long without an answer from its host.
    unreachable_for = 120.0
    _first_failure: float | None = None

    def wait_one(self, timeout: float) -> int:
        try:
            code = super().wait_one(timeout)
        except subprocess.CalledProcessError as exc:
            now = time.monotonic()
            self._first_failure = self._first_failure or now
            if now - self._first_failure > self.unreachable_for:
                self.log.warning("engine %s on %s: no answer from the host for %.0f s (%s); "
                                 "taking it as stopped", self.pid, self.location,
                                 now - self._first_failure, _why(exc, "python"))
                return -1
            waited = getattr(self, "_stop_waiting", None)
            if waited is not None and waited.wait(min(5.0, timeout or 5.0)):
                return -1  # stopped while the host was unreachable
            raise TimeoutError("host unreachable; polling again") from None
        self._first_failure = None
        return code


class CourseSSHEngineSetLauncher(SSHEngineSetLauncher):
    """``SSHEngineSetLauncher`` that starts and signals the hosts in parallel."""

    launcher_class = CourseSSHEngineLauncher
    #: How the cluster file names this class. ipyparallel writes ``module:Class`` for classes
    #: outside its entry points, which it cannot import back; a kernel joining ``course lab``'s
    #: cluster (``Cluster.from_file``) needs the dotted name.
    entrypoint_name = "course_utils.cluster.launchers.ssh.CourseSSHEngineSetLauncher"

    def _engine_kwargs(self) -> dict[str, Any]:
        # The traits every engine launcher inherits from this set (as ipyparallel does).
        engine_traits = self.launcher_class.class_traits(config=True)
        shared = set(self.traits(config=True)).intersection(engine_traits)
        inherited = shared.difference({"location", "user", "hostname", "to_send", "to_fetch"})
        inherited |= {"profile_dir", "cluster_id"}
        return {attr: getattr(self, attr) for attr in inherited}

    def start(self, n: int) -> list[str]:
        """Start up to ``n`` engines as ``engines`` assigns them; hosts in parallel."""
        base = self._engine_kwargs()
        loop = self.loop  # resolved here: worker threads have no IOLoop of their own
        plan: list[tuple[str, list[Any], tuple[str | None, str, str | None]]] = []
        started = 0
        for full_host, n_or_config in self.engines.items():
            if isinstance(n_or_config, dict):
                overrides = dict(n_or_config)  # a copy: config is re-read on every start
                count = overrides.pop("n", 1)
            else:
                overrides, count = {}, n_or_config
            user, host = full_host.split("@", 1) if "@" in full_host else (None, full_host)
            host, port = host.split(":", 1) if ":" in host else (host, None)
            launchers = []
            for i in range(min(count, n - started)):
                kwargs = {**base, **overrides, "parent": self, "loop": loop,
                          "identifier": f"{full_host}/{i}"}
                el = self.launchers[f"{full_host}/{i}"] = self.launcher_class(**kwargs)
                if i > 0:
                    el.to_send = []  # the host's first engine copies the connection files
                el.on_stop(self._notice_engine_stopped)
                launchers.append(el)
            started += len(launchers)
            if launchers:
                plan.append((full_host, launchers, (user, host, port)))
            if started >= n:
                break

        def start_host(launchers: list[Any], where: tuple[str | None, str, str | None]) -> None:
            user, host, port = where
            launchers[0].start(user=user, hostname=host, port=port)
            errors = [e for e in _run_all([
                (lambda el=el: el.start(user=user, hostname=host, port=port))
                for el in launchers[1:]]) if isinstance(e, BaseException)]
            if errors:
                raise errors[0]

        results = _run_all([(lambda ls=ls, w=w: start_host(ls, w)) for _, ls, w in plan])
        failed = [(h, ls, r) for (h, ls, _), r in zip(plan, results, strict=True)
                  if isinstance(r, BaseException)]
        dlist = [key for _, ls, _ in plan for key in (el.identifier for el in ls)]
        self.n = started
        if failed:
            host, launchers, exc = failed[0]
            raise HostStartError(host, _why(exc, launchers[0].remote_python)) from exc
        self.notify_start(dlist)
        return dlist

    # ---- signals and output: one ssh per host ----------------------------------------------
    def _by_host(self, running_only: bool = True) -> dict[str, list[Any]]:
        by_host: dict[str, list[Any]] = {}
        for el in list(self.launchers.values()):
            if not getattr(el, "location", ""):
                continue
            if running_only and not (getattr(el, "state", "") == "running"
                                     and getattr(el, "pid", 0)):
                continue
            by_host.setdefault(el.location, []).append(el)
        return by_host

    def _on_each_host(self, by_host: dict[str, list[Any]], script: Callable[[list[Any]], str],
                      ) -> list[tuple[list[Any], str]]:
        """Run ``script(launchers)`` (POSIX sh) once per host, in parallel; (launchers, stdout)."""
        def run(launchers: list[Any]) -> str:
            el = launchers[0]
            cmd = [*el.ssh_cmd, *el.ssh_args, el.location, script(launchers)]
            try:
                return subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True,
                                      text=True, timeout=SSH_COMMAND_TIMEOUT).stdout
            except subprocess.TimeoutExpired:
                return ""

        groups = list(by_host.values())
        outs = _run_all([(lambda ls=ls: run(ls)) for ls in groups])
        return [(ls, o if isinstance(o, str) else "") for ls, o in zip(groups, outs, strict=True)]

    @staticmethod
    def _kill_script(sig: int, wait_s: float, launchers: list[Any],
                     cluster_id: str | None = None) -> str:
        """Signal the pids; if ``wait_s``, wait that long for them to exit, then SIGKILL.

        With ``cluster_id``, only pids whose environment holds exactly
        ``IPP_CLUSTER_ID=<cluster_id>`` (ipyparallel sets it for every engine it launches):
        a pid alone does not name an engine of *this* cluster on a host that several clusters
        share (an engine another kernel already replaced; its pid reused by another cluster's
        engine). Where ``/proc`` is missing (not Linux) the pids are signalled unchecked.
        """
        pids = " ".join(str(int(el.pid)) for el in launchers)
        script = f'pids="{pids}"; '
        if cluster_id:
            mark = shlex.quote(f"IPP_CLUSTER_ID={cluster_id}")
            script += (
                'if [ -r /proc/self/environ ]; then m=""; for p in $pids; do '
                f"tr '\\000' '\\n' 2>/dev/null < /proc/$p/environ | grep -qxF -- {mark} "
                '&& m="$m $p"; done; pids="$m"; fi; ')
        script += f'[ -n "$pids" ] && kill -{int(sig)} $pids 2>/dev/null; '
        if wait_s > 0:
            script += (
                f'i=0; a="$pids"; while [ -n "$a" ] && [ $i -lt {int(wait_s * 10)} ]; do '
                'sleep 0.1; i=$((i+1)); a=""; '
                'for p in $pids; do kill -0 $p 2>/dev/null && a="$a $p"; done; done; '
                '[ -n "$a" ] && kill -9 $a 2>/dev/null; ')
        return script + "true"

    @staticmethod
    def _output_script(remove: bool, launchers: list[Any]) -> str:
        files = [shlex.quote(el.remote_output_file) for el in launchers]
        script = "; ".join(f"echo {_MARK}{i}; cat {f} 2>/dev/null" for i, f in enumerate(files))
        if remove:
            script += "; rm -f " + " ".join(files)
        return script + "; true"

    def _fetch_outputs(self, by_host: dict[str, list[Any]], remove: bool,
                       before: Callable[[list[Any]], str] | None = None) -> None:
        """Read (and maybe delete) every engine's remote output file: one ssh per host, after
        ``before(launchers)`` (a kill) in the same ssh. Each launcher keeps its text, so
        ipyparallel's own ``get_output`` later fetches nothing."""
        def script(ls: list[Any]) -> str:
            return (before(ls) + "; " if before else "") + self._output_script(remove, ls)

        for launchers, out in self._on_each_host(by_host, script):
            texts: dict[str, str] = {}
            for part in out.split(_MARK)[1:]:
                head, _, text = part.partition("\n")
                texts[head.strip()] = text
            for i, el in enumerate(launchers):
                if el._output is None:
                    el._output = texts.get(str(i), "")

    def signal(self, sig: int) -> None:
        """Send ``sig`` to every running engine: one ssh per host, hosts in parallel."""
        by_host = self._by_host()
        if sig == _signal.SIGKILL:  # the engines are gone: keep their output (same ssh)
            self._fetch_outputs(by_host, remove=True,
                                before=lambda ls: self._kill_script(sig, 0, ls, self.cluster_id))
        else:
            self._on_each_host(by_host,
                               lambda ls: self._kill_script(sig, 0, ls, self.cluster_id))

    async def stop(self) -> None:
        """SIGTERM every engine, SIGKILL those alive after ``stop_seconds_until_kill``, read
        and delete their output files: one ssh per host, hosts in parallel. ipyparallel's
        waiting threads then see the engines gone and report them stopped."""
        by_host = self._by_host()
        if not by_host:
            return
        wait = float(getattr(self, "stop_seconds_until_kill", 5))
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: self._fetch_outputs(
                by_host, remove=True,
                before=lambda ls: self._kill_script(_signal.SIGTERM, wait, ls,
                                                    self.cluster_id)))
        for launchers in by_host.values():  # the engines are gone: stop polling for them
            for el in launchers:
                event = getattr(el, "_stop_waiting", None)
                if event is not None:
                    event.set()

    def get_output(self, remove: bool = False) -> str:
        """Every engine's output; the files not read yet are fetched with one ssh per host."""
        pending = {host: [el for el in ls if el._output is None]
                   for host, ls in self._by_host(running_only=False).items()}
        pending = {h: ls for h, ls in pending.items() if ls}
        if pending:
            self._fetch_outputs(pending, remove=remove)
        return super().get_output(remove=remove)


_MARK = "@@course-engine-output-"


# ---- starting a profile's SSH hosts (called by launching.py) ---------------------------
def remote_profile_base(pdir: str) -> str:
    """Where SSH hosts keep their copy of the profile: like ipyparallel, relative to the remote
    home when the local profile is under this home (``.ipython/profile_course``)."""
    home = os.path.expanduser("~").rstrip("/") + "/"
    return pdir[len(home):] if pdir.startswith(home) else pdir


def ssh_preflight(prof: ClusterProfile, timeout: float = 15.0) -> dict[str, str]:
    """``ssh HOST true`` to every host of an SSH profile at once; host -> why it failed.

    Empty when every host answers. Bounded by ``timeout`` (plus ssh's ConnectTimeout), so an
    unreachable host costs seconds, not a hung start.
    """
    procs = {h.host: subprocess.Popen(prof.ssh_argv(h, "true"), stdin=subprocess.DEVNULL,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True)
             for h in prof.hosts}
    deadline = time.monotonic() + timeout
    failed: dict[str, str] = {}
    for host, p in procs.items():
        try:
            _, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            failed[host] = f"no answer within {timeout:g} s"
            continue
        if p.returncode != 0:
            lines = [ln for ln in (err or "").strip().splitlines() if ln.strip()]
            failed[host] = lines[-1] if lines else f"ssh exited {p.returncode}"
    return failed


def start_ssh_engines(cl: ipp.Cluster, prof: ClusterProfile, n: int,
                      env: dict[str, str]) -> None:
    """Start the engines of an SSH profile on its hosts, once every host answered."""
    # Every host must answer before any engine starts (a clear error naming the host,
    # instead of engines left running on the hosts that did answer).
    failed = ssh_preflight(prof)
    if failed:
        raise EnginesDidNotStart(
            "cannot reach " + "; ".join(f"host {h!r} over ssh ({why})"
                                        for h, why in failed.items()),
            "check that the host is up and its sshd runs, then `ssh "
            f"{' '.join(prof.ssh_argv(next(iter(failed)), 'true')[1:-1])} true` works; "
            "`course doctor --hosts PROFILE` checks every host",
        )
    # Set on every start, also on a cluster loaded from its file (a kernel that joined course
    # lab's cluster and restarts it): per host its engine count, interpreter, remote profile
    # folder and environment (with COURSE_NODE: which host), and the ssh/scp commands.
    for key, value in prof.ssh_launcher_settings(
            env, remote_profile_base(cl.profile_dir)).items():
        setattr(cl.config.SSHEngineSetLauncher, key, value)
    cl.engine_launcher_class = CourseSSHEngineSetLauncher
    try:
        cl.start_engines_sync(prof.engine_count(n), environment=env)
    except HostStartError as exc:
        raise EnginesDidNotStart(
            f"could not start engines on host {exc.host!r} over ssh: {exc.why}",
            "check the host's python path in the profile (the course's venv, with ipyparallel, "
            "at the same path on every host) and that the host can reach controller_ip; "
            "`course doctor --hosts PROFILE` names the failing check",
        ) from exc
