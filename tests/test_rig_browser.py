"""The headless-browser rig (tests/rigs/browser.py): Chromium, waits, screenshots, JupyterLab UI."""

from __future__ import annotations

import time
from pathlib import Path

import nbformat
import pytest

from tests.rigs import browser as rig

# The rig's fixtures, made visible to this module's tests.
chromium = rig.chromium
browser_screenshot_dir = rig.browser_screenshot_dir

CLEAN_CELLS = [
    'print("hello from the rig")',
    "import matplotlib.pyplot as plt\n"
    "plt.plot([1, 2, 3], [1, 4, 9])\nplt.title('squares')\nplt.show()",
    "import time\nfrom tqdm.auto import tqdm\n"
    "for _ in tqdm(range(5)):\n    time.sleep(0.02)\nprint('loop done')",
]
ERROR_CELLS = [
    # stderr that is not an error: a warning and a plain print
    'import sys, warnings\nwarnings.warn("only a warning")\n'
    'print("note on stderr", file=sys.stderr)',
    # an error rendered the way course_utils.errors.CourseError renders (no Python traceback)
    "class RigError(RuntimeError):\n"
    "    def _render_traceback_(self):\n"
    "        return ['\\x1b[31mRigError\\x1b[0m: the cause', 'Fix: the fix']\n"
    # The pause lets Run All's later requests reach the kernel first: ipykernel 7 aborts only
    # the requests queued when the error is handled (one that came later ran, on a busy CI).
    "import time; time.sleep(1)\n"
    "raise RigError('the cause')",
    'print("never printed")',
]
TRACEBACK_CELLS = ["x = 1", "1 / 0"]


def write_notebook(path: Path, sources: list[str]) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in sources]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, path)


# --------------------------------------------------------------------------- no browser needed


def test_cell_output_error_rules():
    err = rig.STDERR_MIME
    tb = "-----\nZeroDivisionError    Traceback (most recent call last)\nCell In[2], line 1\n"
    assert rig.CellOutput(err, tb).is_error
    assert rig.CellOutput(err, "RigError: cause\nFix: fix", red=True).is_error
    syntax = "  Cell In[1], line 1\n    1/\n      ^\nSyntaxError: invalid syntax"
    assert rig.CellOutput(err, syntax).is_error
    warning = "/x.py:2: UserWarning: only a warning\n  warnings.warn("
    assert not rig.CellOutput(err, warning).is_error
    assert not rig.CellOutput(err, "100%|##########| 5/5 [00:00<00:00]").is_error
    assert not rig.CellOutput("application/vnd.jupyter.stdout", "ValueError: printed").is_error


def test_cell_result_and_problems():
    ok = rig.CellResult(0, "code", "[3]:", "print(1)", [rig.CellOutput(None, "1")], False)
    bad = rig.CellResult(1, "code", "[4]:", "1/0",
                         [rig.CellOutput(rig.STDERR_MIME, "ZeroDivisionError: x", red=True)], False)
    skipped = rig.CellResult(2, "code", "[ ]:", "print(2)", [], False)
    empty = rig.CellResult(3, "code", "[ ]:", "", [], False)
    assert (ok.execution_count, bad.execution_count, skipped.execution_count) == (3, 4, None)
    assert rig.problems([ok, empty]) == []
    found = rig.problems([ok, bad, skipped])
    assert len(found) == 2 and "cell 1 raised" in found[0] and "cell 2 did not run" in found[1]


def test_isolated_lab_args_and_helpers(tmp_path, monkeypatch):
    args = rig.isolated_lab_args(tmp_path)
    settings = (tmp_path / "settings/@jupyterlab/apputils-extension"
                / "notification.jupyterlab-settings")
    assert '"fetchNews": "false"' in settings.read_text()
    assert f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}" in args
    monkeypatch.setenv("COURSE_SCREENSHOT_DIR", str(tmp_path / "shots"))
    assert rig.screenshot_dir() == tmp_path / "shots" and (tmp_path / "shots").is_dir()


def test_require_chromium_skips_with_the_enabling_command(tmp_path, monkeypatch):
    import selenium  # noqa: F401  (a test dependency: its absence is a failure, not a skip)

    monkeypatch.setattr(rig, "CHROMIUM", tmp_path / "no-chromium")
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("COURSE_TEST_INSTALL", raising=False)
    with pytest.raises(pytest.skip.Exception, match="COURSE_TEST_INSTALL=1 python -m pytest"):
        rig.require_chromium()
    monkeypatch.setenv("COURSE_TEST_INSTALL", "1")
    monkeypatch.setattr(rig.os, "geteuid", lambda: 1000)
    with pytest.raises(pytest.skip.Exception, match="needs root"):
        rig.require_chromium()
    monkeypatch.setenv("CI", "True")  # under CI (any case) a missing piece fails instead
    with pytest.raises(pytest.fail.Exception, match="CI must run every rig: .*needs root"):
        rig.require_chromium()


# --------------------------------------------------------------------------- Chromium


@pytest.mark.timeout(120)
def test_chromium_starts_waits_and_leaves_nothing_behind(browser_screenshot_dir):
    rig.require_chromium()
    t0 = time.perf_counter()
    with rig.headless_chromium() as driver:
        started = time.perf_counter() - t0
        profile = driver.capabilities["chrome"]["userDataDir"]
        assert rig.chromium_processes(profile), "no chromium process uses the profile"
        driver.get("data:text/html,<h1 id='t'>rig page</h1><p>second line</p>")
        assert rig.wait_for(driver, "#t", 5, "the heading").text == "rig page"
        assert "second line" in rig.page_text(driver)
        assert driver.execute_script("return [innerWidth, innerHeight]") == list(rig.WINDOW_SIZE)
        with pytest.raises(rig.PageWaitTimeout) as caught:
            rig.wait_for(driver, "#never", 0.5, "an element that never comes")
        msg = str(caught.value)
        assert "an element that never comes" in msg and "rig page" in msg and "second line" in msg
        shot = rig.screenshot(driver, "rig page")
        assert shot.parent == browser_screenshot_dir and shot.read_bytes()[:4] == b"\x89PNG"
    print(f"\nChromium start (driver + browser): {started:.2f} s")
    assert rig.chromium_processes(profile) == [] and not Path(profile).exists()
    # A failure inside the block still quits the browser.
    with pytest.raises(RuntimeError, match="boom"), rig.headless_chromium() as driver:
        profile = driver.capabilities["chrome"]["userDataDir"]
        raise RuntimeError("boom")
    assert rig.chromium_processes(profile) == []


# --------------------------------------------------------------------------- JupyterLab


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    rig.require_chromium()
    root = tmp_path_factory.mktemp("lab")
    write_notebook(root / "clean.ipynb", CLEAN_CELLS)
    write_notebook(root / "error.ipynb", ERROR_CELLS)
    write_notebook(root / "traceback.ipynb", TRACEBACK_CELLS)
    with rig.jupyter_lab(root) as server:
        print(f"\nJupyterLab answered /api/status after {server.started_in_s:.1f} s")
        yield server
    assert server.process.returncode is not None
    assert rig._alive(server.descendants) == set(), "kernels outlived the lab"


@pytest.mark.timeout(180)
def test_lab_runs_a_notebook_through_the_ui(chromium, lab, browser_screenshot_dir):
    t0 = time.perf_counter()
    rig.open_notebook(chromium, lab, "clean.ipynb")
    opened = time.perf_counter() - t0
    t0 = time.perf_counter()
    cells = rig.run_all_cells(chromium, lab=lab, path="clean.ipynb", via="menu")
    ran = time.perf_counter() - t0
    print(f"\nopen notebook + kernel idle: {opened:.1f} s; Run All of 3 cells: {ran:.1f} s")
    assert rig.problems(cells) == []
    assert [c.execution_count for c in cells] == [1, 2, 3]
    assert "hello from the rig" in cells[0].text
    assert cells[1].has_image, f"no figure rendered; outputs: {cells[1].outputs}"
    assert "5/5" in cells[2].text and "loop done" in cells[2].text
    assert rig.kernel_status(chromium) == "idle"
    shot = rig.screenshot(chromium, "lab-clean-notebook")
    rig.scroll_to_cell(chromium, -1)
    end = rig.screenshot(chromium, "lab-clean-notebook-end")
    print(f"screenshots: {shot} {end}")
    # A blank page compresses to a few kB; the notebook with its figure is ~70 kB.
    assert shot.stat().st_size > 20_000 and end.stat().st_size > 20_000


@pytest.mark.timeout(180)
def test_lab_run_all_reports_an_error_cell(chromium, lab):
    rig.open_notebook(chromium, lab, "error.ipynb")
    cells = rig.run_all_cells(chromium, lab=lab, path="error.ipynb", via="palette")
    rig.screenshot(chromium, "lab-error-notebook")
    warn, err, after = cells
    assert any(o.mime == rig.STDERR_MIME for o in warn.outputs), warn.outputs
    assert "only a warning" in warn.text and not warn.error
    assert err.error and "RigError: the cause" in err.error_text and "Fix: the fix" in err.text
    assert after.execution_count is None and "never printed" not in after.text
    found = rig.problems(cells)
    assert len(found) == 2 and "cell 1 raised" in found[0] and "cell 2 did not run" in found[1]
    # A plain Python traceback is an error, too.
    rig.open_notebook(chromium, lab, "traceback.ipynb")
    cells = rig.run_all_cells(chromium, lab=lab, path="traceback.ipynb")
    assert not cells[0].error and cells[1].error
    assert "ZeroDivisionError" in cells[1].error_text and "Traceback" in cells[1].error_text

