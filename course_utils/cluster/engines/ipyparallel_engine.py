"""A local engine process: ``python -m course_utils.cluster.engines.ipyparallel_engine ARGS``.

A local cluster starts its engines together with the controller, not after it (Python and
ipyparallel take about as long to import as the controller takes to come up, so the two
overlap). An engine then waits here for the controller's connection file. ipyparallel's own
wait (``IPEngine.wait_for_url_file``) reads the file as soon as it exists, but the controller
creates it empty and writes it next, so a read in between fails; this waits until the file
parses, then runs ``ipyparallel.engine`` with the same arguments, in this process (its pid and
command line name the engine, as process scans expect).

Also imported here, while the controller starts: the engine side of the course
(:mod:`course_utils.cluster.engines.engine`, which the first call on an engine needs), and the
modules named in ``$COURSE_ENGINE_PRELOAD`` (comma-separated), in a background thread that the
engine does not wait for: a later ``import`` of one of them waits for that import to finish
instead of doing it again.

With forking on (the default, see :mod:`..launchers.fork_client`) a local engine is instead a
child of :mod:`..launchers.ipyparallel_fork_server`, which runs :func:`run_engine` in it.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import threading
import time

from ... import settings
from ...settings import ENV_ENGINE_PRELOAD, env


def connection_file(environ: dict[str, str] | None = None) -> str:
    """The engine connection file of the cluster this engine belongs to (the launcher sets
    ``IPP_PROFILE_DIR`` and ``IPP_CLUSTER_ID``)."""
    env = os.environ if environ is None else environ
    cid = env.get("IPP_CLUSTER_ID", "")
    name = f"ipcontroller-{cid}-engine.json" if cid else "ipcontroller-engine.json"
    return os.path.join(env.get("IPP_PROFILE_DIR", ""), "security", name)


def wait_for_connection_file(path: str, timeout: float) -> bool:
    """True once ``path`` holds complete JSON; False after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError, ValueError), open(path) as f:
            json.load(f)
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


def preload(names: list[str]) -> None:
    """Import each of ``names``; one that fails is skipped (the code that needs it says so)."""
    for name in names:
        with contextlib.suppress(Exception):
            importlib.import_module(name)


#: What local engines run (``python -m MODULE ARGS``), and its file (their ``sys.argv[0]``).
MODULE = "course_utils.cluster.engines.ipyparallel_engine"
ENGINE_FILE = __file__


#: The variable that names the modules an engine imports before its first call.
PRELOAD_ENV = ENV_ENGINE_PRELOAD


def preload_names(environ: dict[str, str] | None = None) -> list[str]:
    """The modules named in ``$COURSE_ENGINE_PRELOAD`` (comma-separated)."""
    return [n.strip() for n in env(PRELOAD_ENV, environ).split(",") if n.strip()]


def run_engine() -> None:
    """Be an engine: ``ipyparallel.engine`` with ``sys.argv``, once the connection file is
    complete. Exec'd engines run it from :func:`main`, forked ones in the fork server's child
    (:mod:`.ipyparallel_fork_server`)."""
    names = preload_names()
    if names:
        threading.Thread(target=preload, args=(names,), name="course-preload",
                         daemon=True).start()
    # Imported while the controller starts: the engine needs both anyway.
    from ipyparallel.engine.app import main as engine_main

    from ..launchers.fork_protocol import FORK_SERVER

    if "IPP_CONNECTION_INFO" not in os.environ:
        # After $COURSE_START_TIMEOUT the engine goes on: ipyparallel reports the missing file.
        wait_for_connection_file(connection_file(), settings.start_timeout())
    if FORK_SERVER:  # its nanny is forked too
        from .forked_engine_app import ForkedIPEngine

        ForkedIPEngine.launch_instance()
    else:
        engine_main()


def main() -> None:
    run_engine()


if __name__ == "__main__":
    main()
