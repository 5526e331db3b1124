"""The cluster a class is graded on: a fresh one per notebook, every process of a run marked
in its environment (``RUN_MARK``) so that all of them are ended by pid afterwards."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable

from .. import procs, settings
from ..errors import CourseError
from ..settings import ENV_GRADING_RUN

#: Marks every process started for one graded notebook (the controller, engines, the kernel and
#: anything it starts inherit it), so that all of them can be ended by pid afterwards.
RUN_MARK = ENV_GRADING_RUN


def marked_processes(value: str, key: str = RUN_MARK) -> list[int]:
    """Pids of live processes whose environment has ``key=value`` (never this process)."""
    me = os.getpid()
    return [pid for pid in procs.pids_with_environ(f"{key}={value}") if pid != me]


def kill_marked(value: str, timeout: float = 5.0) -> list[int]:
    """SIGKILL every process carrying ``RUN_MARK=value``; wait (bounded) until they are gone.

    A killed child of this process stays a zombie until its owner (a ``Popen``, ipyparallel's
    launcher) reaps it: :func:`marked_processes` counts zombies as gone, and nothing here reaps,
    so no owner loses its child's exit status.
    """
    return _kill_all(lambda: marked_processes(value), timeout)


def kill_runs_of(grader_pid: int, timeout: float = 5.0) -> list[int]:
    """SIGKILL every process of every run the grader process ``grader_pid`` started (marks
    ``grade-<grader_pid>-<n>``): what a ``course grade --jobs N`` job left when it died."""
    me = os.getpid()
    return _kill_all(lambda: [p for p in procs.pids_with_environ_prefix(
        f"{RUN_MARK}=grade-{grader_pid}-") if p != me], timeout)


def _kill_all(find: Callable[[], list[int]], timeout: float) -> list[int]:
    pids = find()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while find() and time.monotonic() < deadline:
        time.sleep(0.05)
    return pids


class GradingCluster:
    """A fresh cluster for each graded notebook: its own id and processes, torn down by pid.

    :meth:`restart` ends every process the previous notebook left (controller, engines, the
    kernel, engines its ``cu.restart()`` started) and starts a new controller and engines.
    Measured against keeping the controller and replacing only the engines, the difference is
    small (docs/instructor.md), and a fresh cluster survives a student's ``cu.stop(force=True)``.
    """

    def __init__(self, engines: int | None = None, start_timeout: float | None = None,
                 sandbox: bool = False) -> None:
        self.engines = engines or settings.default_engines()
        self.sandbox = sandbox  # the notebook's own cu.start() starts it, inside the sandbox
        self.start_timeout = start_timeout
        self.count = 0
        self.cc = None
        self.cluster_id = ""
        self.mark = ""
        self._saved_env = {k: os.environ.get(k) for k in (settings.ENV_CLUSTER_ID, RUN_MARK,
                                                          settings.ENV_ENGINES)}

    def restart(self) -> float:
        """End everything of the previous run and have a clean cluster ready; seconds taken.
        A start that fails is tried once more, on a fresh id with everything of the failed
        one ended first (said on stderr): one bad start does not stop a class's grading."""
        t0 = time.perf_counter()
        try:
            self._fresh()
        except CourseError as exc:
            first = (exc.cause or str(exc)).splitlines()[0]
            print(f"course grade: cluster {self.cluster_id} did not start ({first}); "
                  "trying once more on a fresh one", file=sys.stderr, flush=True)
            from ..cluster.kernel import lifecycle

            with contextlib.suppress(Exception):  # its files and controller; its processes
                lifecycle.stop_running(self.cluster_id)  # are killed by their mark next
            self._fresh()
        return time.perf_counter() - t0

    def _fresh(self) -> None:
        from ..cluster.kernel import lifecycle

        self._stop_cluster()
        if self.mark:
            kill_marked(self.mark)
        self.count += 1
        self.mark = self.cluster_id = f"grade-{os.getpid()}-{self.count}"
        os.environ[RUN_MARK] = self.mark
        os.environ[settings.ENV_CLUSTER_ID] = self.cluster_id
        if self.sandbox:  # nothing to start here: the sandbox has its own network and processes
            os.environ[settings.ENV_ENGINES] = str(self.engines)
            return
        self.cc = lifecycle.start(n=self.engines, cluster_id=self.cluster_id,
                                  timeout=self.start_timeout)

    def _stop_cluster(self) -> None:
        from ..cluster.kernel import lifecycle

        if self.cc is not None:
            with contextlib.suppress(Exception):
                self.cc.stop(force=True)
            with contextlib.suppress(Exception):
                lifecycle.stop_running(self.cluster_id)
            self.cc = None

    def stop(self) -> None:
        """Stop the cluster, end every marked process, give the environment back."""
        self._stop_cluster()
        if self.mark:
            kill_marked(self.mark)
        for k, v in self._saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    def __enter__(self) -> GradingCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
