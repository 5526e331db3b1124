"""The learner's JupyterLab, in a real browser: ``course lab`` as a learner meets it (issue 13).

One ``course lab --no-browser`` (token, free port, working folder and kernel prefix in a temp
dir, its own cluster id) serves every test here, in file order:

1. the course home (``START_HERE.ipynb``) lists every unit, the cluster, and "not run yet";
2. unit 0, the learner's copy with its exercise completed (the instructor's solution typed into
   the stub, as a learner who solved it would have it), runs through Run > Run All Cells with no
   error, every rank's output labelled by rank; saved, the home then shows it passing and
   ``course solution`` is allowed;
3. unit 3's data and training cells (the learner's copy cut to setup, data, the three solved
   exercise cells, training and its check; the rest of the unit costs a minute more and shows
   nothing new here) draw rank 0's tqdm bar as ONE line per epoch, in place;
4. the IPython Parallel panel lists the course's cluster with its 2 engines, and its STOP
   button says why it does not stop it;
5. the learner's lab shows none of nbgrader's instructor tools (no "Create Assignment" side
   bar, no Nbgrader menu) and never asks about Jupyter news; the instructor's
   ``course lab --source`` keeps the tools (a second lab, started for that check).

Screenshots go to the folder printed at the start (``$COURSE_SCREENSHOT_DIR`` to choose it).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

from course_utils import notebook_cells
from course_utils.assignments import lessons
from course_utils.cluster.ports import free_port
from course_utils.learner import home, kernelspec, workspace
from tests.rigs import browser as rig

chromium = rig.chromium
browser_screenshot_dir = rig.browser_screenshot_dir

TOKEN = "course-lab-test"
UNIT0 = "00_cluster_tour.ipynb"
UNIT3 = "03_pytorch_ddp.ipynb"
UNIT3_TRAIN = "03_train_only.ipynb"
UNIT3_CELLS = ("setup", "data", "data-note", "ex1-solution", "ex2-solution", "ex3-solution",
               "train", "train-check", "teardown")
_BAR_RE = re.compile(r"epoch (\d+):\s+\d+%\|")


@dataclass
class LearnerLab:
    server: rig.LabServer
    workdir: Path
    cluster_key: str

    def open(self, driver, path: str, timeout: float = 120) -> None:
        rig.open_notebook(driver, self.server, path, timeout=timeout)


def solve(copy: Path, exercises_wanted: set[str] | None = None) -> nbformat.NotebookNode:
    """The learner's copy with the instructor's solution in each exercise cell (markers gone)."""
    nb = lessons.read(copy)
    source = lessons.read(lessons.NOTEBOOK_DIR / copy.name)
    solved = {notebook_cells.grade_id(c): c for c in source.cells
              if notebook_cells.is_solution_cell(c)}
    for cell in nb.cells:
        gid = notebook_cells.grade_id(cell)
        if gid in solved and (exercises_wanted is None
                              or notebook_cells.exercise(solved[gid]) in exercises_wanted):
            cell.source = "\n".join(ln for ln in solved[gid].source.splitlines()
                                    if "### BEGIN SOLUTION" not in ln
                                    and "### END SOLUTION" not in ln)
    return nb


def only_cells(nb: nbformat.NotebookNode, grade_ids: tuple[str, ...]) -> nbformat.NotebookNode:
    by_id = {notebook_cells.nbgrader_meta(c).get("grade_id"): c for c in nb.cells}
    missing = [g for g in grade_ids if g not in by_id]
    assert not missing, f"unit 3 has no cells {missing}: update UNIT3_CELLS"
    nb.cells = [by_id[g] for g in grade_ids]
    return nb


@pytest.fixture(scope="module")
def learner_lab(tmp_path_factory, browser_screenshot_dir):
    rig.require_chromium()
    base = tmp_path_factory.mktemp("learner-lab")
    workdir, state, prefix = base / "work", base / "state", base / "kernel-prefix"
    port = free_port()
    cid = os.environ.get("COURSE_CLUSTER_ID", "pytest") + "-lab"
    env = {**os.environ, kernelspec.ENV_KERNEL_PREFIX: str(prefix), "COURSE_CLUSTER_ID": cid,
           "JUPYTER_PATH": str(prefix / "share" / "jupyter"),
           "JUPYTER_RUNTIME_DIR": str(state / "runtime"), "COURSE_ENGINES": "2"}
    for name in ("MPLBACKEND", "IPP_NONINTERACTIVE"):  # a learner's lab has neither
        env.pop(name, None)
    lab_args = rig.isolated_lab_args(state, quiet=False)  # course lab must silence the news
    # Render every cell (JupyterLab 4 skips off-screen cells, whose text then reads as empty).
    tracker = (state / "settings" / "@jupyterlab" / "notebook-extension"
               / "tracker.jupyterlab-settings")
    tracker.parent.mkdir(parents=True, exist_ok=True)
    tracker.write_text(json.dumps({"windowingMode": "none"}))
    cmd = [sys.executable, "-m", "course_utils.cli", "lab", "--no-browser", "--port", str(port),
           "--workdir", str(workdir), "--", f"--IdentityProvider.token={TOKEN}",
           "--ServerApp.port_retries=0", *lab_args]
    t0 = time.monotonic()
    with rig.running_lab(cmd, port=port, token=TOKEN, env=env, start_timeout=180) as server:
        print(f"\ncourse lab (cluster + JupyterLab) answered after {time.monotonic() - t0:.1f} s")
        key = f"{os.environ.get('COURSE_IPYTHON_PROFILE') or 'course'}:{cid}"
        yield LearnerLab(server, workdir, key)
    from course_utils.cluster.kernel.lifecycle import cluster_file

    assert not cluster_file(cid).exists(), f"course lab left its cluster running:\n" \
        f"{server.log_tail(3000)}"


@pytest.mark.timeout(300)
def test_home_lists_units_cluster_and_status(chromium, learner_lab, browser_screenshot_dir):
    lab = learner_lab
    assert json.loads((lab.workdir / ".course" / "manifest.json").read_text())["units"]
    assert "dist-training-course" in lab.server.api("kernelspecs")["kernelspecs"]
    lab.open(chromium, home.HOME_NAME)
    text = rig.page_text(chromium)
    for info in home.units():
        assert info.title in text, f"{info.title!r} not on the home page"
    assert "2 ranks" in text and "not run yet" in text, text[:2000]
    assert "Distributed training course" in text  # the kernel the page runs on
    # The learner's copy has stubs, not solutions, and no hidden tests.
    mine = lessons.read(lab.workdir / UNIT3)
    solutions = [c.source for c in mine.cells if notebook_cells.is_solution_cell(c)]
    assert solutions and all("raise NotImplementedError(" in s for s in solutions)
    source = lessons.read(lessons.NOTEBOOK_DIR / UNIT3)
    hidden = [ln.strip() for c in source.cells if notebook_cells.is_test_cell(c)
              for region in re.findall(r"BEGIN HIDDEN TESTS\n(.*?)### END", c.source, re.S)
              for ln in region.splitlines() if ln.strip()]
    visible = "\n".join(c.source for c in mine.cells if notebook_cells.is_test_cell(c))
    assert hidden and not [ln for ln in hidden if ln in visible]
    rig.screenshot(chromium, "1-home-page")
    rig.scroll_to_cell(chromium, 3)
    rig.screenshot(chromium, "1-home-page-objectives")
    # Its last cell recomputes the status in the course kernel.
    cells = rig.run_all_cells(chromium, lab=lab.server, path=home.HOME_NAME, timeout=60)
    assert rig.problems(cells) == [], "\n".join(rig.problems(cells))
    assert "Unit 5: TF2 ParameterServerStrategy" in cells[-1].text, cells[-1].text
    assert cells[-1].text.count("not run yet") == len(home.units())
    rig.scroll_to_cell(chromium, -1)
    rig.screenshot(chromium, "1-home-page-refreshed")


@pytest.mark.timeout(300)
def test_unit0_runs_clean_with_every_rank_labelled(chromium, learner_lab):
    lab = learner_lab
    copy = lab.workdir / UNIT0
    nbformat.write(solve(copy), str(copy))
    # Open it as a learner does: the link on the home page.
    lab.open(chromium, home.HOME_NAME)
    link = rig.wait_for(chromium, lambda d: next(
        (a for a in d.find_elements("css selector", ".jp-RenderedMarkdown a")
         if a.text.strip() == "Unit 0: Cluster tour"), None), 20, "the home's link to unit 0")
    link.click()
    rig.wait_for(chromium, lambda d: any(
        t.text.strip() == UNIT0 and "jp-mod-current" in (t.get_attribute("class") or "")
        for t in d.find_elements("css selector", ".lm-DockPanel-tabBar .lm-TabBar-tab")), 30,
        "unit 0 to open from the home's link")
    rig.wait_kernel_idle(chromium, 120, lab=lab.server, path=UNIT0)
    t0 = time.monotonic()
    cells = rig.run_all_cells(chromium, lab=lab.server, path=UNIT0, timeout=240)
    print(f"\nunit 0, Run All Cells: {time.monotonic() - t0:.1f} s")
    assert rig.problems(cells) == [], "\n".join(rig.problems(cells))
    assert _stderr(cells) == [], "start-up noise or warnings on screen"
    chromium.execute_script(
        "const c = document.querySelector(arguments[0] + ' .jp-Notebook .jp-Cell');"
        "if (c) c.scrollIntoView({block: 'start'});", rig.NOTEBOOK_PANEL_CSS)
    rig.screenshot(chromium, "2-unit0-top")
    hello = next(c for c in cells if c.source.startswith("%%px") and "rank {rank} of" in c.source)
    for r in range(2):
        assert re.search(rf"\[rank {r}, engine \d+\] rank {r} of 2 on", hello.text), hello.text
    rig.scroll_to_cell(chromium, hello.index + 1)
    rig.screenshot(chromium, "2-unit0-every-rank")
    # The hang cell replaced the engines (new engine ids): the labels still name each rank.
    after = next(c for c in cells if "after restart" in c.source)
    for r in range(2):
        m = re.search(rf"\[rank {r}, engine (\d+)\] rank {r} after restart: 3", after.text)
        assert m and int(m.group(1)) >= 2, after.text
    rig.scroll_to_cell(chromium, -1)
    rig.screenshot(chromium, "2-unit0-end")

    # Save (Ctrl+S): the saved copy records the test ran, so the home shows the pass and
    # `course solution` agrees to show the solution.
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    ActionChains(chromium).key_down(Keys.CONTROL).send_keys("s").key_up(Keys.CONTROL).perform()
    rig.wait_for(chromium, lambda d: _saved_passes(copy), 20,
                 "the saved unit 0 to record its passing test")
    n_tests = len(workspace.unit_status(copy).tests)
    assert workspace.unit_status(copy).summary() == \
        f"passes its visible tests ({n_tests} of {n_tests})"
    assert "dist." in workspace.reveal_solution(lab.workdir, "0", "ex1")  # the group wiring
    home.write_home(lab.workdir)
    lab.open(chromium, home.HOME_NAME)
    text = rig.page_text(chromium)
    assert f"passes its visible tests ({n_tests} of {n_tests})" in text
    assert "solution shown for ex1" in text
    rig.screenshot(chromium, "3-home-after-unit0")


@pytest.mark.timeout(300)
def test_unit3_training_shows_one_progress_bar_per_epoch(chromium, learner_lab):
    lab = learner_lab
    nb = only_cells(solve(lab.workdir / UNIT3), UNIT3_CELLS)
    nbformat.write(nb, str(lab.workdir / UNIT3_TRAIN))
    lab.open(chromium, UNIT3_TRAIN)
    t0 = time.monotonic()
    train_at = UNIT3_CELLS.index("train")
    seen = run_all_watching(chromium, lab.server, UNIT3_TRAIN, train_at, timeout=240)
    cells = rig.notebook_cells(chromium)
    print(f"\nunit 3 data + training, Run All Cells: {time.monotonic() - t0:.1f} s")
    assert rig.problems(cells) == [], "\n".join(rig.problems(cells))
    assert _stderr(cells) == [], "start-up noise or warnings on screen"
    train = cells[train_at]
    rig.scroll_to_cell(chromium, train.index)
    rig.screenshot(chromium, "4-unit3-training")
    # While it ran and at the end: one bar line per epoch, redrawn in place.
    for text in [*seen, train.text]:
        bars = [ln for ln in text.splitlines() if _BAR_RE.search(ln)]
        epochs = [int(_BAR_RE.search(ln).group(1)) for ln in bars]
        assert epochs == sorted(set(epochs)), "more than one line for a bar:\n" + "\n".join(bars)
    final = [ln for ln in train.text.splitlines() if _BAR_RE.search(ln)]
    epochs = int(re.search(r"EPOCHS, BATCH, LR = (\d+)", nbformat.writes(nb)).group(1))
    assert len(final) == epochs and all("100%" in ln for ln in final), "\n".join(final)
    states = {ln for text in seen for ln in text.splitlines() if _BAR_RE.search(ln)}
    print(f"{len(seen)} looks at the training cell while it ran; {len(states)} bar states seen")
    assert "[rank 0, engine" in train.text and "[rank 1, engine" not in train.text, train.text
    assert cells[UNIT3_CELLS.index("train-check")].has_image
    # What the run wrote went to the learner's folder (the notebooks use relative paths).
    assert (lab.workdir / "saved_models" / f"cnn-epoch{epochs}.pt").exists()
    assert (lab.workdir / "data").is_dir()


@pytest.mark.timeout(120)
def test_cluster_panel_lists_the_course_cluster(chromium, learner_lab):
    lab = learner_lab
    lab.open(chromium, home.HOME_NAME)
    tab = rig.wait_for(chromium, lambda d: next(
        (t for t in d.find_elements("css selector", ".jp-SideBar .lm-TabBar-tab")
         if "IPython Parallel" in (t.get_attribute("title") or "")), None), 20,
        "the IPython Parallel tab in the left side bar")
    tab.click()
    item = rig.wait_for(chromium, lambda d: next(
        (e for e in d.find_elements("css selector", ".ipp-ClusterListingItem")
         if lab.cluster_key in e.text), None), 30, f"the cluster {lab.cluster_key} in the panel")
    assert "Number of engines: 2" in item.text and "State: running" in item.text, item.text
    rig.screenshot(chromium, "5-cluster-panel")
    item.find_element("css selector", ".ipp-ClusterListingItem-stop").click()
    dialog = rig.wait_for(chromium, ".jp-Dialog", 15, "the panel's answer to STOP")
    assert "belongs to `course lab`" in dialog.text, dialog.text
    rig.screenshot(chromium, "5-cluster-panel-stop-refused")
    dialog.find_element("css selector", ".jp-Dialog-button").click()
    listed = {c["id"]: c for c in _ipp_clusters(lab.server)}  # the cluster still runs:
    state = (listed.get(lab.cluster_key, {}).get("controller") or {}).get("state", {})
    assert state.get("state") == "running", json.dumps(listed, indent=1)[:3000]


def _menus(driver) -> list[str]:
    return [e.text for e in driver.find_elements("css selector", ".lm-MenuBar-itemLabel")]


def _side_tabs(driver) -> list[str]:
    return [(t.get_attribute("title") or "") + " " + t.text
            for t in driver.find_elements("css selector", ".jp-SideBar .lm-TabBar-tab")]


def _news_question(driver) -> list[str]:
    return [e.text for e in driver.find_elements("css selector", ".Toastify__toast")
            if "Jupyter news" in e.text]


@pytest.mark.timeout(120)
def test_a_learner_sees_no_instructor_tools_and_no_news_question(chromium, learner_lab):
    learner_lab.open(chromium, home.HOME_NAME)
    rig.wait_for(chromium, lambda d: "File" in _menus(d), 30, "the menu bar")
    time.sleep(3)  # JupyterLab asks its news question a moment after the page is up
    assert "Nbgrader" not in _menus(chromium), _menus(chromium)
    tabs = _side_tabs(chromium)
    assert any("IPython Parallel" in t for t in tabs), tabs  # the side bars are there
    assert not [t for t in tabs if "Assignment" in t], tabs
    assert not _news_question(chromium), _news_question(chromium)
    rig.screenshot(chromium, "6-learner-lab-menus")


@pytest.mark.timeout(300)
def test_the_instructors_source_lab_keeps_nbgraders_tools(chromium, tmp_path):
    port, cid = free_port(), os.environ.get("COURSE_CLUSTER_ID", "pytest") + "-src"
    env = {**os.environ, "COURSE_CLUSTER_ID": cid, "COURSE_ENGINES": "1",
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    cmd = [sys.executable, "-m", "course_utils.cli", "lab", "--source", "--no-browser",
           "--engines", "1", "--port", str(port), "--", f"--IdentityProvider.token={TOKEN}",
           "--ServerApp.port_retries=0", *rig.isolated_lab_args(tmp_path / "state", quiet=False)]
    with rig.running_lab(cmd, port=port, token=TOKEN, env=env, start_timeout=180) as server:
        chromium.get(f"http://127.0.0.1:{port}/lab?token={TOKEN}")
        rig.wait_for(chromium, lambda d: "Nbgrader" in _menus(d), 60, "the Nbgrader menu")
        assert any("Create Assignment" in t for t in _side_tabs(chromium)), \
            _side_tabs(chromium)
        time.sleep(3)
        assert not _news_question(chromium), _news_question(chromium)
        rig.screenshot(chromium, "7-source-lab-menus")
        # the whole log: ipyparallel's extension logs other clusters' engine output too
        assert "INSTRUCTOR'S SOURCE" in server.log_path.read_text(errors="replace")


def run_all_watching(driver, server: rig.LabServer, path: str, index: int,
                     timeout: float) -> list[str]:
    """Run > Run All Cells, reading cell ``index``'s output at every poll until the notebook is
    done; return the distinct texts seen (what the learner saw while it ran)."""
    before = [c.prompt for c in rig.notebook_cells(driver)]
    rig._click_run_all_menu(driver, 10)
    rig.wait_for(driver, lambda d: rig.kernel_status(d) == "busy"
                 or [c.prompt for c in rig.notebook_cells(d)] != before, 15,
                 "the notebook to start running")
    seen: list[str] = []

    def done(d) -> bool:
        cells = rig.notebook_cells(d)
        if cells[index].text and (not seen or seen[-1] != cells[index].text):
            seen.append(cells[index].text)
        return not any(c.prompt.strip() == "[*]:" for c in cells) and \
            rig.kernel_status(d) == "idle"

    rig.wait_for(driver, done, timeout, "every queued cell to finish")
    rig.wait_kernel_idle(driver, timeout, lab=server, path=path)
    return seen


def _stderr(cells: list[rig.CellResult]) -> list[str]:
    """Every stderr output: the kernel's own, and the engines' (``[..., stderr]`` labels)."""
    return [f"cell {c.index}: {o.text[:500]}" for c in cells for o in c.outputs
            if o.mime == rig.STDERR_MIME or re.match(r"\[(rank \d+, engine \d+, )?stderr", o.text)]


def _saved_passes(path: Path) -> bool:
    try:
        status = workspace.unit_status(path)
        return status.passed >= 1 and status.passed == len(status.tests)
    except Exception:  # noqa: BLE001 - read while the server writes it: not yet
        return False


def _ipp_clusters(server: rig.LabServer) -> list[dict]:
    import urllib.request

    req = urllib.request.Request(f"{server.url}/ipyparallel/clusters",
                                 headers={"Authorization": f"token {server.token}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())
