"""Shared test set-up: isolate the test clusters from a learner's running ``course lab``, and
share the work between ``pytest-xdist`` workers (``make test`` runs two)."""

from __future__ import annotations

import fcntl
import os
import tempfile
import time

import pytest


def pytest_configure(config) -> None:
    # torch before TensorFlow in every test process, as the notebooks do it: once a process
    # has imported TensorFlow, torch cannot load triton (course_utils/compat.py refuses, to
    # turn a crash into an error), so an in-process TF test followed by a torch test would
    # fail. The whole suite imports torch at collection anyway (test_torch_track.py); a run of
    # a few files may not. Here, not at the top: scripts that import conftest stay light.
    import torch  # noqa: F401

# Notebook kernels (nbval) inherit this environment, so they use the test cluster id, too.
os.environ.setdefault("COURSE_CLUSTER_ID", "pytest")
# Under xdist every worker gets its own cluster id (and working folder), so each has its own
# engines. Workers inherit the main process's environment, which already holds the id.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER and not os.environ["COURSE_CLUSTER_ID"].endswith(f"-{_WORKER}"):
    os.environ["COURSE_CLUSTER_ID"] += f"-{_WORKER}"
    os.environ.pop("COURSE_WORKDIR", None)
os.environ.setdefault("IPP_NONINTERACTIVE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# `course lab` in tests works in a throw-away learner's folder, never in ~/dist-training-course.
os.environ.setdefault("COURSE_WORKDIR", os.path.join(
    tempfile.gettempdir(), f"course-workdir-{os.environ['COURSE_CLUSTER_ID']}"))

#: How each notebook is run again in nbval's kernel, after its cells ran once as written:
#: ``B`` every code cell but the teardown, ``T`` the teardown, ``S`` the set-up cells. A plan
#: spells the whole sequence in one kernel, the notebook's own run first (``B`` ... ``T``):
#: ``BTBT`` the whole notebook twice (set-up and teardown are idempotent); ``BBT`` every cell
#: again against the live cluster and process group, then the teardown.
RERUN_PLANS = {
    "00_cluster_tour.ipynb": "BTBT",
    "01_collectives.ipynb": "BBT",
    "02_data_parallel_from_scratch.ipynb": "BBT",
    "03_pytorch_ddp.ipynb": "BBT",
    "04_tf_classic_ps.ipynb": "BTBT",
    "05_tf2_parameter_server_strategy.ipynb": "BTBT",
    "06_two_hosts.ipynb": "BTBT",
    "07_performance.ipynb": "BTBT",
    "08_hangs_and_faults.ipynb": "BBT",
    # The capstone again in the same kernel: the checkpoint of the first pass is deleted by the
    # test cell, the second training starts from scratch, resumes, and meets the bar again.
    "09_capstone.ipynb": "BBT",
}


def _grade_id(item) -> str:
    return item.cell.metadata.get("nbgrader", {}).get("grade_id", "")


def with_reruns(items: list) -> list:
    """nbval's items with each notebook's :data:`RERUN_PLANS` added: a cell's first run is
    nbval's own item, every later one a copy named ``Cell N (pass K)``, in the same kernel."""
    from nbval.plugin import IPyNbCell

    out: list = []
    i = 0
    while i < len(items):
        parent = items[i].parent
        j = i
        while j < len(items) and items[j].parent is parent:
            j += 1
        group, i = items[i:j], j
        plan = RERUN_PLANS.get(parent.path.name) if isinstance(group[0], IPyNbCell) else None
        if not plan:
            out += group
            continue
        kind = {"B": [it for it in group if "teardown" not in _grade_id(it)],
                "T": [it for it in group if "teardown" in _grade_id(it)],
                "S": [it for it in group if _grade_id(it).startswith("setup")]}
        seen: set[str] = set()
        for n, step in enumerate(plan, start=1):
            for it in kind[step]:
                if it.name not in seen:
                    seen.add(it.name)
                    out.append(it)
                else:
                    out.append(IPyNbCell.from_parent(
                        parent, name=f"{it.name} (pass {n})", cell_num=it.cell_num,
                        cell=it.cell, options=it.options))
    return out


#: Files whose tests must run in one worker together: they share a rig (network namespaces,
#: Slurm daemons, Chromium) or module fixtures across files.
SHARED = {
    "test_two_hosts.py": "rig-twohosts", "test_rig_twohosts.py": "rig-twohosts",
    "test_slurm.py": "rig-slurm", "test_rig_slurm.py": "rig-slurm",
    "test_lab_browser.py": "rig-browser", "test_rig_browser.py": "rig-browser",
}
#: Files whose tests are independent of one another (each starts its own kernel or process):
#: xdist may hand them out one by one.
SPREAD = {"test_instructor_release.py", "test_mistakes.py"}
#: Started first, so the longest groups do not end up last on one worker.
FIRST = ("test_instructor_grade.py", "rig-twohosts", "test_viz_gallery.py", "notebooks",
         "rig-slurm", "rig-browser")


#: Tests that pass or fail on timing (performance figures, a training budget, an accuracy bar
#: reached within it): under xdist they run alone, the other worker waiting between its tests.
#: Node-id prefixes; a notebook's cells keep the machine from the first to the last.
ALONE = (
    "notebooks/07_performance.ipynb", "notebooks/09_capstone.ipynb",
    "tests/test_tf_perf_capstone.py", "tests/test_perf_faults.py",
)


def scope_of(nodeid: str) -> str:
    """The unit of work one xdist worker runs in order: a file (a notebook's cells share a
    kernel, a module's fixtures its set-up), a rig shared by several files, or a single test."""
    name = nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    if name in SPREAD:
        return nodeid
    return SHARED.get(name, nodeid.split("::", 1)[0])


def pytest_collection_modifyitems(config, items) -> None:
    """Each notebook's re-run passes (:func:`with_reruns`); under xdist, the longest groups
    first (a stable sort keeps each file's order)."""
    items[:] = with_reruns(items)
    if not _WORKER:
        return

    def rank(item) -> int:
        if alone(item.nodeid):  # last: by then the other worker has little left to hold up
            return len(FIRST) + 1
        name = item.path.name
        group = "notebooks" if item.path.suffix == ".ipynb" else \
            name if name in SPREAD else SHARED.get(name, name)
        return FIRST.index(group) if group in FIRST else len(FIRST)

    items.sort(key=rank)


def alone(nodeid: str) -> bool:
    return nodeid.startswith(ALONE)


class MachineLock:
    """A readers-writer lock between xdist workers, on two files (``flock``): every test holds
    it shared, an :data:`ALONE` test exclusively. A waiting writer holds the turnstile, so the
    other worker cannot keep taking the shared lock test after test and starve it."""

    def __init__(self, folder: str) -> None:
        self.turnstile = open(os.path.join(folder, "course-xdist-turnstile.lock"), "a")
        self.machine = open(os.path.join(folder, "course-xdist-machine.lock"), "a")
        self.held = ""
        self.waited = 0.0

    def take(self, kind: str) -> None:
        if self.held == kind:
            return
        self.release()
        t0 = time.monotonic()
        fcntl.flock(self.turnstile, fcntl.LOCK_EX)
        if kind == "shared":  # pass the turnstile, then share the machine
            fcntl.flock(self.turnstile, fcntl.LOCK_UN)
            fcntl.flock(self.machine, fcntl.LOCK_SH)
        else:  # keep the turnstile until the machine is ours
            fcntl.flock(self.machine, fcntl.LOCK_EX)
            fcntl.flock(self.turnstile, fcntl.LOCK_UN)
        self.waited += time.monotonic() - t0
        self.held = kind

    def release(self) -> None:
        if self.held:
            fcntl.flock(self.machine, fcntl.LOCK_UN)
            self.held = ""


_LOCK: MachineLock | None = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Under xdist, hold the :class:`MachineLock` around each test (see :data:`ALONE`)."""
    global _LOCK
    if not _WORKER:
        yield
        return
    if _LOCK is None:
        folder = os.path.join(tempfile.gettempdir(), "course-xdist-"
                              + os.environ.get("PYTEST_XDIST_TESTRUNUID", "run"))
        os.makedirs(folder, exist_ok=True)
        _LOCK = MachineLock(folder)
    kind = "exclusive" if alone(item.nodeid) else "shared"
    _LOCK.take(kind)
    try:
        yield
    finally:
        keep = kind == "exclusive" and nextitem is not None and alone(nextitem.nodeid) \
            and nextitem.path == item.path and item.path.suffix == ".ipynb"
        if not keep:
            _LOCK.release()


try:
    from xdist.scheduler import LoadScopeScheduling
except ImportError:  # xdist missing: the suite runs in one process
    LoadScopeScheduling = None
else:
    class CourseScheduling(LoadScopeScheduling):
        """``--dist loadscope`` with the course's scopes (:func:`scope_of`)."""

        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    def pytest_xdist_make_scheduler(config, log):
        # Keep the order pytest_collection_modifyitems gave (xdist would sort the scopes by
        # their number of tests, which puts a notebook's many cells before the one long test).
        config.option.loadscopereorder = False
        return CourseScheduling(config, log)


def pytest_sessionstart(session) -> None:
    # The course's Jupyter kernel, as `course lab` / `make lab` install it: `course doctor`
    # checks it. Idempotent (nbval runs notebooks with --nbval-current-env, not through it);
    # locked, because xdist workers start together.
    from course_utils.learner import kernelspec

    with open(os.path.join(tempfile.gettempdir(), "course-kernelspec.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        kernelspec.install()
