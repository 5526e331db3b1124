"""The engine application of a forked local engine (:mod:`..launchers.fork_client`): ipyparallel's
``IPEngine``, but its nanny (the process that relays signals to the engine and reports its
death at once) is forked by the engine's fork server instead of being a fresh ``python`` that
imports ipyparallel again (about 0.6 s of CPU and as much of the engine's start-up). A server
that cannot fork it leaves the nanny to ipyparallel, with a warning in the engine's log.
"""

from __future__ import annotations

import os
import pickle
from typing import Any

from ipyparallel.engine.app import IPEngine
from traitlets.config import Config

from ..launchers import fork_protocol

#: What the forked nanny runs: ipyparallel's own entry point (its kwargs pickled on stdin).
NANNY_ENTRY = "ipyparallel.engine.nanny:main"


def nanny_kwargs(app: IPEngine, control_url: str) -> dict[str, Any]:
    """What ipyparallel's nanny is started with for engine ``app`` (as
    ``IPEngine.start_nanny`` passes it), plus the engine's pid."""
    config = Config()
    config.Session = app.config.Session
    return {"engine_id": app.id, "identity": app.bident, "control_url": control_url,
            "curve_serverkey": app.curve_serverkey, "curve_secretkey": app.curve_secretkey,
            "curve_publickey": app.curve_publickey, "registration_url": app.registration_url,
            "config": config, "pid": os.getpid()}


def fork_nanny(server: str, kwargs: dict[str, Any]) -> tuple[str, fork_protocol.ForkedChild]:
    """Have ``server`` fork the nanny: its stdin gets ``kwargs`` pickled, its stdout is a pipe
    on which it says the URL the engine's control socket must connect to, its stderr is the
    engine's. Returns the URL and the nanny (which watches that pipe: it exits when the
    engine, holding the other end, is gone)."""
    r_in, w_in = os.pipe()
    r_out, w_out = os.pipe()
    try:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        pid = fork_protocol.fork_call(server, NANNY_ENTRY, [], [r_in, w_out, 2], env,
                                      os.getcwd())
    except BaseException:
        for fd in (w_in, r_out):
            os.close(fd)
        raise
    finally:
        os.close(r_in)
        os.close(w_out)
    with os.fdopen(w_in, "wb") as f:
        f.write(pickle.dumps(kwargs))
    out = os.fdopen(r_out, "rb")
    url = out.readline().decode("utf8").strip()
    nanny = fork_protocol.ForkedChild(pid, keep=(out,))
    if not url:
        nanny.terminate()
        out.close()
        # OSError: start_nanny then starts ipyparallel's own nanny process instead
        raise OSError("the forked nanny exited before it wrote its control URL")
    return url, nanny


class ForkedIPEngine(IPEngine):
    """``IPEngine`` whose nanny its fork server forks (see the module)."""

    def start_nanny(self, control_url: str) -> Any:
        server = fork_protocol.FORK_SERVER
        if server:
            try:
                return fork_nanny(server, nanny_kwargs(self, control_url))
            except (OSError, AttributeError) as exc:
                self.log.warning(f"nanny: starting its own python ({exc})")
        return super().start_nanny(control_url)
