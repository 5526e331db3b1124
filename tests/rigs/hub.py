"""A real JupyterHub on the workshop rig (tests/rigs/workshop.py), and learners who use it.

:func:`running_hub` starts ``jupyterhub -f <the config course workshop wrote>`` as root in the
hub host's network namespace (``nsenter --net``, as the rig's ``slurmd``), so the hub, its
proxy, every learner's JupyterLab and the learners' controllers live on that host. Its proxy,
``configurable-http-proxy``, comes from npm: :func:`proxy_command` installs it into a cache
folder under ``CI=true`` or ``COURSE_TEST_INSTALL=1`` (else the test skips naming the command).

:class:`LearnerLab` is one learner in the hub's REST API: a token of their own (made by the
check service), their lab started, a kernel in it, and code run there over the kernel's
websocket, as a browser does.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from course_utils.workshop.check import hub_call
from tests.rigs.common import RigError, RigUnavailable, apt_install, install_allowed

PROXY_PACKAGE = "configurable-http-proxy@5.3.0"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "course-test-rigs"
ENABLE = f"npm install -g {PROXY_PACKAGE}   (or run the tests with COURSE_TEST_INSTALL=1)"


def proxy_command() -> str:
    """The ``configurable-http-proxy`` program: installed, cached, or installed now if allowed."""
    found = shutil.which("configurable-http-proxy")
    cached = CACHE / "chp" / "node_modules" / ".bin" / "configurable-http-proxy"
    if found or cached.exists():
        return found or str(cached)
    if not install_allowed():
        raise RigUnavailable("configurable-http-proxy (the hub's proxy, from npm) is missing",
                             ENABLE)
    if shutil.which("npm") is None:
        apt_install(["npm"])
    done = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix",
                           str(CACHE / "chp"), PROXY_PACKAGE], capture_output=True, text=True,
                          timeout=600, check=False)
    if done.returncode != 0 or not cached.exists():
        raise RigError(f"npm install {PROXY_PACKAGE} failed ({done.returncode}): "
                       f"{(done.stdout + done.stderr)[-1500:]}", ENABLE)
    return str(cached)


def _get(url: str, token: str = "", method: str = "GET", body: dict | None = None,
         timeout: float = 60.0) -> tuple[int, dict]:
    return hub_call(url, token, method, body, timeout)  # generous: 2 shared cores


@contextlib.contextmanager
def running_hub(config: Path, netns: str, hub_url: str, log: Path,
                timeout: float = 240.0) -> Iterator[subprocess.Popen]:
    """``jupyterhub -f config`` in ``netns``; waits until ``hub_url`` answers; on exit stops
    the hub (it stops the labs and its proxy) and kills what is left of its session."""
    proxy = proxy_command()
    env = dict(os.environ, PATH=f"{Path(proxy).parent}{os.pathsep}{os.environ['PATH']}")
    with open(log, "wb") as out:
        proc = subprocess.Popen(["nsenter", f"--net=/run/netns/{netns}", sys.executable, "-m",
                                 "jupyterhub", "-f", str(config)], cwd=config.parent, env=env,
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError):
                if _get(hub_url + "/hub/api", timeout=3)[0] == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RigError(f"the hub did not answer at {hub_url} within {timeout:.0f} s "
                               f"(exit {proc.poll()})", "read its log below",
                               log.read_text(errors="replace")[-3000:])
            time.sleep(0.3)
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)  # the hub stops each lab and its proxy
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


@dataclass
class LearnerLab:
    """One learner in the hub: their own token, their lab, one kernel in it."""

    hub_url: str
    user: str
    service_token: str
    token: str = ""
    kernel: str = ""
    #: output that came with another request's parent header (a failure's message shows it)
    stray: list[str] = field(default_factory=list)

    def login(self) -> None:
        """A token of the learner's own (what their browser's login gives them)."""
        code, body = _get(f"{self.hub_url}/hub/api/users/{self.user}/tokens",
                          self.service_token, "POST", {"note": "workshop rig", "expires_in": 3600})
        if code != 201:
            raise RigError(f"could not make a token for {self.user}: HTTP {code}")
        self.token = body["token"]

    def start_lab(self, timeout: float = 240.0) -> float:
        """Start the learner's lab as they would; seconds until the hub says it is ready."""
        t0 = time.monotonic()
        code, _ = _get(f"{self.hub_url}/hub/api/users/{self.user}/server", self.token, "POST",
                       timeout=timeout)
        if code not in (201, 202, 400):  # 400: it runs already (an earlier test started it)
            raise RigError(f"starting {self.user}'s lab: HTTP {code}")
        while time.monotonic() - t0 < timeout:
            _, model = _get(f"{self.hub_url}/hub/api/users/{self.user}", self.token)
            if (model.get("servers", {}).get("") or {}).get("ready"):
                return time.monotonic() - t0
            time.sleep(0.3)
        raise RigError(f"{self.user}'s lab was not ready within {timeout:.0f} s")

    def api(self, path: str, method: str = "GET", body: dict | None = None) -> tuple[int, dict]:
        return _get(f"{self.hub_url}/user/{self.user}/api{path}", self.token, method, body)

    def save(self, path: str, nb: dict) -> None:
        """Save notebook ``nb`` at ``path`` (under the lab's root, ``~/course``) as the
        learner's browser does on Ctrl-S: through their lab's contents API."""
        code, _ = self.api(f"/contents/{path}", "PUT",
                           {"type": "notebook", "format": "json", "content": nb})
        if code not in (200, 201):
            raise RigError(f"{self.user}: saving {path} gave HTTP {code}")

    def start_kernel(self, timeout: float = 60.0) -> None:
        """A kernel of the lab's default kernelspec. The hub may call a lab ready a moment
        before its proxy routes to it (a clean run here got 404 for one of four learners who
        logged in at once): the lab's API is asked until it answers."""
        deadline = time.monotonic() + timeout
        code, specs = self.api("/kernelspecs")
        while code in (404, 424, 502, 503) and time.monotonic() < deadline:
            time.sleep(0.5)
            code, specs = self.api("/kernelspecs")
        if code != 200:
            raise RigError(f"{self.user}: the lab's kernelspecs gave HTTP {code}")
        code, model = self.api("/kernels", "POST", {"name": specs.get("default", "python3")})
        if code != 201:
            raise RigError(f"{self.user}: starting a kernel gave HTTP {code}")
        self.kernel = model["id"]

    def run(self, code: str, timeout: float = 120.0) -> tuple[str, str]:
        """Run ``code`` in the learner's kernel over its websocket; (stdout, stderr + errors)."""
        import websocket  # websocket-client, which selenium brings

        url = (self.hub_url.replace("http://", "ws://")
               + f"/user/{self.user}/api/kernels/{self.kernel}/channels")
        conn = websocket.create_connection(url, header=[f"Authorization: token {self.token}"],
                                           timeout=timeout)
        msg_id = uuid.uuid4().hex
        conn.send(json.dumps({
            "header": {"msg_id": msg_id, "username": self.user, "session": uuid.uuid4().hex,
                       "msg_type": "execute_request", "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell",
            "content": {"code": code, "silent": False, "store_history": False,
                        "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}}))
        # a display with an id is shown as its last update, as the browser shows it (``%%px``
        # output is one display per rank and stream, replaced as output arrives)
        out: dict[str, str] = {}
        err: list[str] = []
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                msg = json.loads(conn.recv())
                kind, content = msg["msg_type"], msg["content"]
                if msg.get("parent_header", {}).get("msg_id") != msg_id:
                    if kind in ("stream", "display_data", "update_display_data"):
                        self.stray.append(str(content.get("text") or content.get("data")))
                    continue
                if kind == "stream" and content["name"] != "stdout":
                    err.append(content["text"])
                elif kind == "stream":
                    out[f"stream {len(out)}"] = content["text"]
                elif kind == "error":
                    err.append(f"{content['ename']}: {content['evalue']}")
                elif kind in ("execute_result", "display_data", "update_display_data"):
                    key = (content.get("transient") or {}).get("display_id") or len(out)
                    out[f"display {key}"] = content["data"].get("text/plain", "")
                elif kind == "status" and content["execution_state"] == "idle":
                    return "".join(out.values()), "".join(err)
        finally:
            conn.close()
        raise RigError(f"{self.user}'s cell did not finish within {timeout:.0f} s: "
                       f"{''.join(out.values())[-500:]} {''.join(err)[-500:]}")
