"""Headless-browser test rig: Debian's ``chromium`` driven by Selenium, plus JupyterLab 4 helpers.

Only the Debian packages are used (``/usr/bin/chromium``, ``/usr/bin/chromedriver``); Selenium
Manager never runs because the Service is given the driver's path. Tests call
:func:`require_chromium` (through the ``chromium`` fixture), which installs the packages only when
``CI=true`` or ``COURSE_TEST_INSTALL=1``; a missing piece fails under ``CI=true`` and elsewhere
skips, naming the command that enables it (:func:`tests.rigs.common.unavailable`).

Fixtures (register with ``pytest_plugins = ["tests.rigs.browser"]``): ``chromium`` (one headless
driver per session) and ``browser_screenshot_dir``.

JupyterLab 4 facts this rig relies on (checked on JupyterLab 4.6 in Chromium 156):

- "Run > Run All Cells" is the menu item ``.lm-Menu-item[data-command="runmenu:run-all"]``; it has
  no default key binding. In the command palette (Ctrl+Shift+C) "Run All Cells" is the item
  ``.lm-CommandPalette-item[data-command="notebook:run-all-cells"]``. Both work headless once the
  notebook's kernel is idle; keys typed before the app is ready land in the notebook instead.
- A code cell's prompt reads ``[ ]:`` (not run), ``[*]:`` (queued or running) or ``[7]:``.
- The notebook toolbar's ``.jp-Notebook-ExecutionIndicator-tooltip`` says ``Kernel status: Idle``,
  but it says so for a moment before the kernel is connected, too; :func:`wait_kernel_idle` also
  asks the server and waits for the state to hold.
- Error outputs have no class of their own: a traceback renders as
  ``.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]``, exactly like a
  warning or ``print(..., file=sys.stderr)``. :func:`notebook_cells` tells them apart by the red
  ANSI span IPython puts on the exception name (``.ansi-red-fg``) or a ``Traceback`` header.
- After an error, Run All stops: later cells keep ``[ ]:``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from course_utils import procs
from course_utils.cluster.ports import free_port
from tests.rigs.common import RigError, apt_install, install_allowed, unavailable

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
APT_PACKAGES = ("chromium", "chromium-driver")
ENABLE_COMMAND = "COURSE_TEST_INSTALL=1 python -m pytest tests/test_rig_browser.py  # as root"
WINDOW_SIZE = (1400, 900)
STDERR_MIME = "application/vnd.jupyter.stderr"
STDERR_OUTPUT_CSS = f'.jp-OutputArea-output[data-mime-type="{STDERR_MIME}"]'
NOTEBOOK_PANEL_CSS = ".jp-NotebookPanel:not(.lm-mod-hidden)"
RUN_ALL_MENU_COMMAND = "runmenu:run-all"  # Run > Run All Cells
RUN_ALL_PALETTE_COMMAND = "notebook:run-all-cells"  # the palette's "Run All Cells"
PAGE_TEXT_CHARS = 3000


class PageWaitTimeout(AssertionError):
    """A bounded browser wait ran out; the message carries the page's visible text."""


# --------------------------------------------------------------------------- packages


def require_chromium() -> None:
    """Make sure Selenium, chromium and chromedriver are there: install them in CI, else skip."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        unavailable("selenium is not installed", "pip install -e '.[test]'")
    if CHROMIUM.exists() and CHROMEDRIVER.exists():
        return
    if not install_allowed():
        unavailable("chromium/chromedriver not installed", ENABLE_COMMAND)
    if os.geteuid() != 0:
        unavailable("installing chromium needs root",
                    "apt-get install -y " + " ".join(APT_PACKAGES) + "  # as root")
    try:  # with recommends: they bring fonts-liberation
        apt_install(APT_PACKAGES, recommends=True)
    except RigError as exc:
        pytest.fail(str(exc), pytrace=False)
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        pytest.fail(f"apt-get installed {APT_PACKAGES} but {CHROMIUM} or {CHROMEDRIVER} is missing",
                    pytrace=False)


# --------------------------------------------------------------------------- the browser


def chromium_processes(marker: str) -> list[int]:
    """Pids of live processes whose command line contains ``marker`` (a user-data-dir path)."""
    return list(procs.pids_running(marker))


def _kill_pids(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def headless_chromium(*, window: tuple[int, int] = WINDOW_SIZE, page_load_timeout: float = 30,
                      script_timeout: float = 30,
                      command_timeout: float = 60,
                      allow_hosts: Sequence[str] = ()) -> Iterator[WebDriver]:
    """A headless Chromium driven by /usr/bin/chromedriver, with its own throw-away profile.

    The page area (``innerWidth`` x ``innerHeight``) and so every screenshot is ``window``.
    Only localhost resolves, and the addresses in ``allow_hosts`` (e.g. the workshop rig's hub).

    Every page load, script and driver command is bounded. On exit (also after an error) the
    browser quits, any process still using the profile is killed by pid, and the profile
    directory is removed. ``driver.capabilities["chrome"]["userDataDir"]`` names the profile.
    """
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="course-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    opts.unhandled_prompt_behavior = "accept"  # e.g. "leave page?" after running a notebook
    args = ["--headless=new", "--disable-dev-shm-usage", f"--window-size={window[0]},{window[1]}",
            f"--user-data-dir={profile}", "--no-first-run", "--no-default-browser-check",
            "--disable-extensions", "--disable-background-networking", "--disable-sync",
            "--disable-component-update", "--disable-default-apps",
            # Nothing leaves this machine: every host name but localhost fails to resolve.
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1"
            + "".join(f", EXCLUDE {host}" for host in allow_hosts)]
    if os.geteuid() == 0:
        args.append("--no-sandbox")  # Chromium refuses to start as root with its sandbox on
    for arg in args:
        opts.add_argument(arg)
    log = Path(profile + ".chromedriver.log")
    service = Service(executable_path=str(CHROMEDRIVER), log_output=str(log))
    driver = None
    try:
        driver = webdriver.Chrome(service=service, options=opts)
        driver.command_executor.client_config.timeout = command_timeout
        # --window-size counts the (invisible) browser frame; make the page itself window-sized.
        frame = driver.execute_script("return outerHeight - innerHeight") or 0
        driver.set_window_size(window[0], window[1] + frame)
        driver.set_page_load_timeout(page_load_timeout)
        driver.set_script_timeout(script_timeout)
        driver.implicitly_wait(0)
        yield driver
    except Exception as exc:
        if driver is None and log.exists():
            exc.add_note(f"chromedriver log tail:\n{log.read_text(errors='replace')[-2000:]}")
        raise
    finally:
        if driver is not None:
            with contextlib.suppress(Exception):
                driver.quit()
        else:
            with contextlib.suppress(Exception):
                service.stop()
        deadline = time.monotonic() + 10
        while chromium_processes(profile) and time.monotonic() < deadline:
            time.sleep(0.1)
        _kill_pids(chromium_processes(profile))
        shutil.rmtree(profile, ignore_errors=True)
        log.unlink(missing_ok=True)


def page_text(driver: WebDriver) -> str:
    """The page's visible text (``document.body.innerText``)."""
    return driver.execute_script("return document.body ? document.body.innerText : ''") or ""


def screenshot_dir() -> Path:
    """Where :func:`screenshot` saves: ``$COURSE_SCREENSHOT_DIR``, else one temp dir per run.

    The folder is kept after the run so the pictures can be looked at.
    """
    env = os.environ.get("COURSE_SCREENSHOT_DIR")
    if env:
        folder = Path(env)
    else:
        global _tmp_screenshots
        if _tmp_screenshots is None:
            _tmp_screenshots = Path(tempfile.mkdtemp(prefix="course-screenshots-"))
        folder = _tmp_screenshots
    folder.mkdir(parents=True, exist_ok=True)
    return folder


_tmp_screenshots: Path | None = None


def screenshot(driver: WebDriver, name: str, folder: Path | None = None) -> Path:
    """Save a PNG of the browser window as ``<folder>/<name>.png`` and return its path."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "page"
    path = (folder or screenshot_dir()) / f"{safe}.png"
    if not driver.save_screenshot(str(path)) or path.stat().st_size == 0:
        raise AssertionError(f"the browser wrote no screenshot to {path}")
    return path


def wait_for(driver: WebDriver, condition: str | Callable[[WebDriver], Any], timeout: float,
             what: str, *, poll: float = 0.1) -> Any:
    """Wait until ``condition`` holds and return its value.

    ``condition`` is a CSS selector (wait for a displayed element, returned) or a function of the
    driver (wait for a truthy result; Selenium errors inside it count as "not yet"). On timeout
    raise :class:`PageWaitTimeout` naming ``what`` with the page's visible text and a screenshot.
    """
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By

    if isinstance(condition, str):
        css = condition

        def condition(drv: WebDriver) -> Any:
            return next((e for e in drv.find_elements(By.CSS_SELECTOR, css) if e.is_displayed()),
                        None)

    deadline = time.monotonic() + timeout
    last_error = ""
    while True:
        try:
            value = condition(driver)
            if value:
                return value
        except WebDriverException as exc:
            last_error = f"{type(exc).__name__}: {exc.msg}"
        if time.monotonic() >= deadline:
            break
        time.sleep(poll)
    raise PageWaitTimeout(_timeout_report(driver, what, timeout, last_error))


def _timeout_report(driver: WebDriver, what: str, timeout: float, last_error: str) -> str:
    parts = [f"waited {timeout:g} s for {what}, in vain."]
    if last_error:
        parts.append(f"last error from the browser: {last_error}")
    with contextlib.suppress(Exception):
        parts.append(f"url: {driver.current_url}  title: {driver.title!r}")
    with contextlib.suppress(Exception):
        parts.append(f"screenshot: {screenshot(driver, 'timeout-' + what[:60])}")
    try:
        text = page_text(driver)
        parts.append(f"visible text (first {PAGE_TEXT_CHARS} chars):\n{text[:PAGE_TEXT_CHARS]}")
    except Exception as exc:  # noqa: BLE001 - the report must not hide the timeout
        parts.append(f"(could not read the page text: {exc})")
    return "\n".join(parts)


# --------------------------------------------------------------------------- pytest fixtures


@pytest.fixture(scope="session")
def chromium() -> Iterator[WebDriver]:
    """One headless Chromium for the session (see :func:`headless_chromium`)."""
    require_chromium()
    with headless_chromium() as driver:
        yield driver


@pytest.fixture(scope="session")
def browser_screenshot_dir() -> Path:
    """The folder screenshots go to; printed so a person can open them."""
    folder = screenshot_dir()
    print(f"\nbrowser screenshots: {folder}")
    return folder


# --------------------------------------------------------------------------- JupyterLab server


def isolated_lab_args(state_dir: Path, quiet: bool = True) -> list[str]:
    """``jupyter lab`` options that keep a test's lab apart from a person's.

    Own settings and workspaces folders (no restored tabs), and (``quiet``) no "Jupyter news?"
    toast that would cover part of the notebook in screenshots. ``course lab`` turns that toast
    off itself: its tests pass ``quiet=False`` to see that it does. Works after
    ``course lab ... --``, too.
    """
    settings = Path(state_dir) / "settings"
    settings.mkdir(parents=True, exist_ok=True)
    (Path(state_dir) / "workspaces").mkdir(parents=True, exist_ok=True)
    args = [f"--LabApp.user_settings_dir={settings}",
            f"--LabApp.workspaces_dir={Path(state_dir) / 'workspaces'}"]
    if not quiet:
        return args
    notification = (settings / "@jupyterlab" / "apputils-extension"
                    / "notification.jupyterlab-settings")
    notification.parent.mkdir(parents=True, exist_ok=True)
    notification.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    return [*args, "--LabApp.news_url=None"]


def jupyter_lab_command(root_dir: Path, port: int, token: str, state_dir: Path) -> list[str]:
    """The plain ``jupyter lab`` command line the rig's own tests use."""
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}",
           "--ip=127.0.0.1", f"--IdentityProvider.token={token}",
           f"--ServerApp.root_dir={root_dir}", "--ServerApp.port_retries=0"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    return cmd + isolated_lab_args(state_dir)


@dataclass
class LabServer:
    """A JupyterLab server started by :func:`running_lab`."""

    port: int
    token: str
    process: subprocess.Popen
    log_path: Path
    started_in_s: float = 0.0
    descendants: set[int] = field(default_factory=set)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def notebook_url(self, path: str, *, reset: bool = True) -> str:
        """``/lab/tree/<path>?token=T``; ``reset`` opens it in an empty workspace (no old tabs)."""
        query = f"token={urllib.parse.quote(self.token)}" + ("&reset" if reset else "")
        return f"{self.url}/lab/tree/{urllib.parse.quote(path)}?{query}"

    def api(self, endpoint: str, timeout: float = 5) -> Any:
        """GET ``/api/<endpoint>`` with the token; the parsed JSON."""
        req = urllib.request.Request(f"{self.url}/api/{endpoint}",
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())

    def page(self, path: str, timeout: float = 10) -> str:
        """GET ``/<path>`` (an HTML page) with the token; its text."""
        req = urllib.request.Request(f"{self.url}/{path}",
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.read().decode()

    def log_tail(self, chars: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""


def _descendants(pid: int) -> set[int]:
    import psutil

    with contextlib.suppress(psutil.Error):
        return {p.pid for p in psutil.Process(pid).children(recursive=True)}
    return set()


@contextlib.contextmanager
def running_lab(command: list[str], *, port: int, token: str, cwd: Path | None = None,
                env: dict[str, str] | None = None, start_timeout: float = 60,
                stop_timeout: float = 20) -> Iterator[LabServer]:
    """Run ``command`` (``jupyter lab ...`` or ``course lab ... --``) until the block ends.

    Waits (bounded) for ``/api/status`` to answer with the token. On exit sends SIGTERM (the lab
    shuts its kernels down; ``course lab`` also stops its cluster), then SIGKILLs by pid whatever
    of the process and its children (kernels) is left.
    """
    log_path = Path(tempfile.mkstemp(prefix="course-lab-", suffix=".log")[1])
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    lab = LabServer(port=port, token=token, process=proc, log_path=log_path)
    t0 = time.monotonic()
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the lab exited with rc {proc.returncode} before it served "
                                   f"/api/status. Log:\n{lab.log_tail()}")
            with contextlib.suppress(OSError, ValueError):
                if "started" in lab.api("status", timeout=2):
                    break
            if time.monotonic() - t0 > start_timeout:
                raise TimeoutError(f"the lab did not answer /api/status on port {port} within "
                                   f"{start_timeout:g} s. Log:\n{lab.log_tail()}")
            time.sleep(0.2)
        lab.started_in_s = time.monotonic() - t0
        yield lab
    finally:
        lab.descendants = _descendants(proc.pid)
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=stop_timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        deadline = time.monotonic() + 5
        while _alive(lab.descendants) and time.monotonic() < deadline:
            time.sleep(0.1)
        _kill_pids(sorted(_alive(lab.descendants)))


def _alive(pids: set[int]) -> set[int]:
    import psutil

    alive = set()
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.add(pid)
    return alive


@contextlib.contextmanager
def jupyter_lab(root_dir: Path, *, token: str = "course-test-token",
                start_timeout: float = 60) -> Iterator[LabServer]:
    """A plain ``jupyter lab`` on 127.0.0.1 serving ``root_dir``, with isolated state.

    Kernels get the tests' environment minus ``MPLBACKEND``, so figures render inline.
    """
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="course-lab-state-") as state:
        env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(Path(state) / "runtime")}
        env.pop("MPLBACKEND", None)  # the tests' Agg would hide figures; a learner's lab has none
        cmd = jupyter_lab_command(Path(root_dir), port, token, Path(state))
        with running_lab(cmd, port=port, token=token, cwd=Path(root_dir), env=env,
                         start_timeout=start_timeout) as lab:
            yield lab


# --------------------------------------------------------------------------- notebooks in the UI


@dataclass
class CellOutput:
    """One rendered output: its MIME type (None for widgets) and visible text."""

    mime: str | None
    text: str
    red: bool = False  # has IPython's red ANSI span (the exception name of a traceback)

    @property
    def is_error(self) -> bool:
        return self.mime == STDERR_MIME and (self.red or bool(_TRACEBACK_RE.search(self.text)))


_TRACEBACK_RE = re.compile(r"Traceback \(most recent call last\)|^\w*(Error|Exception)\b",
                           re.MULTILINE)


@dataclass
class CellResult:
    """A notebook cell as the page shows it."""

    index: int
    kind: str  # "code", "markdown" or "raw"
    prompt: str
    source: str
    outputs: list[CellOutput]
    has_image: bool

    @property
    def execution_count(self) -> int | None:
        m = re.fullmatch(r"\[(\d+)\]:", self.prompt.strip())
        return int(m.group(1)) if m else None

    @property
    def text(self) -> str:
        return "".join(o.text for o in self.outputs)

    @property
    def error(self) -> bool:
        return any(o.is_error for o in self.outputs)

    @property
    def error_text(self) -> str:
        return "".join(o.text for o in self.outputs if o.is_error)


_CELLS_JS = """
const panel = document.querySelector(arguments[0]);
if (!panel) return null;
return [...panel.querySelectorAll('.jp-Notebook .jp-Cell')].map(c => ({
  kind: c.classList.contains('jp-CodeCell') ? 'code'
        : c.classList.contains('jp-MarkdownCell') ? 'markdown' : 'raw',
  prompt: (c.querySelector('.jp-InputArea-prompt') || {}).textContent || '',
  source: (c.querySelector('.jp-InputArea-editor .cm-content') || {}).innerText || '',
  has_image: !!c.querySelector('.jp-OutputArea-output img'),
  outputs: [...c.querySelectorAll('.jp-OutputArea-output')].map(o => ({
    mime: o.dataset.mimeType || null,
    text: o.innerText || '',
    red: !!o.querySelector('.ansi-red-fg, .ansi-red-intense-fg')})),
}));
"""


def notebook_cells(driver: WebDriver) -> list[CellResult]:
    """Every cell of the visible notebook with its prompt and outputs, read in one script."""
    raw = driver.execute_script(_CELLS_JS, NOTEBOOK_PANEL_CSS)
    if raw is None:
        raise AssertionError(f"no notebook is open on {driver.current_url}")
    return [CellResult(index=i, kind=c["kind"], prompt=c["prompt"], source=c["source"],
                       outputs=[CellOutput(**o) for o in c["outputs"]], has_image=c["has_image"])
            for i, c in enumerate(raw)]


def kernel_status(driver: WebDriver) -> str:
    """The visible notebook's kernel status as its toolbar says it ("idle", "busy", ...), else
    as the status bar says it ("<kernel name> | Idle"): under load JupyterLab once drew a
    notebook's toolbar with nbgrader's button alone, and the status bar was the only place
    that showed the kernel (a CI-like run here)."""
    text = driver.execute_script(
        "const e = document.querySelector("
        "  arguments[0] + ' .jp-Notebook-ExecutionIndicator-tooltip');"
        "if (e) return e.textContent;"
        "const bar = document.querySelector('#jp-main-statusbar');"
        "return bar ? 'status bar: ' + bar.innerText : '';", NOTEBOOK_PANEL_CSS) or ""
    m = (re.search(r"Kernel status:\s*(\w+)", text)
         or re.search(r"^status bar: .*?\|\s*(Idle|Busy|Starting|Restarting|Connecting|"
                      r"Disconnected|Dead|Unknown|Initializing|Terminating|Autorestarting)\b",
                      text, re.S))
    return m.group(1).lower() if m else ""


def _server_kernel_state(lab: LabServer | None, path: str | None) -> str | None:
    if lab is None or path is None:
        return "idle"
    with contextlib.suppress(OSError, ValueError):
        for session in lab.api("sessions"):
            if session.get("path") == path and session.get("kernel"):
                return session["kernel"].get("execution_state")
    return None


def wait_kernel_idle(driver: WebDriver, timeout: float = 60, *, lab: LabServer | None = None,
                     path: str | None = None, settle: float = 0.5) -> None:
    """Wait until the notebook's kernel is idle and stays so for ``settle`` seconds.

    The toolbar briefly says "Idle" before a kernel is connected, so the state must hold; with
    ``lab`` and ``path`` the server's session for the notebook must say "idle" as well.
    """
    since: list[float] = []

    def idle(drv: WebDriver) -> bool:
        ok = kernel_status(drv) == "idle" and _server_kernel_state(lab, path) == "idle"
        if not ok:
            since.clear()
            return False
        if not since:
            since.append(time.monotonic())
        return time.monotonic() - since[0] >= settle

    wait_for(driver, idle, timeout, "the kernel to be idle")


def open_notebook(driver: WebDriver, lab: LabServer, path: str, *, timeout: float = 90) -> None:
    """Open ``path`` (relative to the lab's root) by URL; wait for its cells and an idle kernel."""
    driver.get(lab.notebook_url(path))
    name = Path(path).name

    def shown(drv: WebDriver) -> bool:
        return bool(drv.execute_script(
            "const p = document.querySelector(arguments[0]);"
            "return !!(p && p.querySelector('.jp-Notebook .jp-Cell'));", NOTEBOOK_PANEL_CSS)
            and any(t.text.strip() == name for t in
                    drv.find_elements("css selector", ".lm-DockPanel-tabBar .lm-TabBar-tabLabel")))

    wait_for(driver, shown, timeout, f"notebook {path} to show its cells")
    wait_kernel_idle(driver, timeout, lab=lab, path=path)


def _prompts(driver: WebDriver) -> list[str]:
    return [c.prompt.strip() for c in notebook_cells(driver) if c.kind == "code"]


def _click_run_all_menu(driver: WebDriver, timeout: float) -> None:
    bar = wait_for(driver, lambda d: next(
        (e for e in d.find_elements("css selector", ".lm-MenuBar-item") if e.text.strip() == "Run"),
        None), timeout, "the Run menu in the menu bar")
    bar.click()
    item = wait_for(driver, f'.lm-Menu-item[data-command="{RUN_ALL_MENU_COMMAND}"]', timeout,
                    "'Run All Cells' in the Run menu")
    item.click()


def _palette_run_all(driver: WebDriver, timeout: float) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    ActionChains(driver).key_down(Keys.CONTROL).key_down(Keys.SHIFT).send_keys("c") \
        .key_up(Keys.SHIFT).key_up(Keys.CONTROL).perform()
    box = wait_for(driver, ".lm-CommandPalette-input", timeout, "the command palette")
    box.send_keys("Run All Cells")
    item = wait_for(driver, f'.lm-CommandPalette-item[data-command="{RUN_ALL_PALETTE_COMMAND}"]',
                    timeout, "'Run All Cells' in the command palette")
    item.click()


def run_all_cells(driver: WebDriver, *, lab: LabServer | None = None, path: str | None = None,
                  via: str = "menu", timeout: float = 120) -> list[CellResult]:
    """Run every cell of the visible notebook through the UI and return the cells afterwards.

    ``via="menu"`` clicks Run > Run All Cells (reliable headless); ``via="palette"`` uses the
    command palette. Waits until no cell is queued or running and the kernel is idle. A cell that
    raised stops the run, so later cells keep no execution count: check ``execution_count``.
    """
    if via not in ("menu", "palette"):
        raise ValueError(f"via must be 'menu' or 'palette', not {via!r}")
    before = _prompts(driver)

    def started(d: WebDriver) -> bool:
        return kernel_status(d) == "busy" or _prompts(d) != before

    for attempt in range(2):  # a click on a page still settling, on a loaded machine, is lost
        (_click_run_all_menu if via == "menu" else _palette_run_all)(driver, 10)
        try:
            wait_for(driver, started, 20, "the notebook to start running")
            break
        except PageWaitTimeout:
            if attempt:
                raise
    wait_for(driver, lambda d: "[*]:" not in _prompts(d) and kernel_status(d) == "idle", timeout,
             "every queued cell to finish")
    wait_kernel_idle(driver, timeout, lab=lab, path=path)
    return notebook_cells(driver)


def scroll_to_cell(driver: WebDriver, index: int) -> None:
    """Scroll the visible notebook so that cell ``index`` (negative: from the end) is in view."""
    driver.execute_script(
        "const cells = document.querySelectorAll(arguments[0] + ' .jp-Notebook .jp-Cell');"
        "const c = cells[arguments[1] < 0 ? cells.length + arguments[1] : arguments[1]];"
        "if (c) c.scrollIntoView({block: 'end'});", NOTEBOOK_PANEL_CSS, index)


def problems(cells: list[CellResult]) -> list[str]:
    """What is wrong after a run: code cells with an error output or without an execution count."""
    out = []
    for c in cells:
        if c.kind != "code":
            continue
        if c.error:
            out.append(f"cell {c.index} raised:\n{c.error_text[-1500:]}")
        elif c.execution_count is None and c.source.strip():
            out.append(f"cell {c.index} did not run (prompt {c.prompt!r})")
    return out
