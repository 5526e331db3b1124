"""Shared test set-up: isolate the test clusters from a learner's running ``course lab`` and
give each ``pytest-xdist`` worker its own cluster (``make test`` runs three workers; pyproject's
``--dist loadfile`` keeps a file's tests, and a notebook's cells, on one worker)."""

from __future__ import annotations

import fcntl
import os
import tempfile
import time

import pytest

#: Inside nbval's run of each notebook: the mistakes catalogue, the stubs and the re-runs
#: (tests/notebook_items, one plugin).
pytest_plugins = ["tests.notebook_items"]


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


def pytest_collection_modifyitems(config, items) -> None:
    # the longest files first, so that no long file starts at the end (tests/file_order.py)
    from tests import file_order

    file_order.sort_items(items, config.rootpath)


def pytest_sessionstart(session) -> None:
    # The course's Jupyter kernel, as `course lab` / `make lab` install it: `course doctor`
    # checks it. Idempotent (nbval runs notebooks with --nbval-current-env, not through it);
    # locked, because xdist workers start together.
    from course_utils.learner import kernelspec

    with open(os.path.join(tempfile.gettempdir(), "course-kernelspec.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        kernelspec.install()


#: The cluster id every test of this process uses, and the notebooks whose own ids were handed out.
_BASE_ID = os.environ["COURSE_CLUSTER_ID"]
_NOTEBOOK_IDS: dict[str, str] = {}


def _notebook_of(item) -> str | None:
    path = getattr(item.parent, "path", None)
    return path.stem if path is not None and path.suffix == ".ipynb" else None


def _stop_left_over(cluster_id: str) -> None:
    """Stop a notebook's cluster if its kernel died before its teardown cell (a timeout): its
    engines would keep their imports and load, and nothing else would ever join them."""
    from course_utils.cluster.kernel.lifecycle import stop_running

    try:
        stop_running(cluster_id)
    except Exception as exc:  # a clean-up: say so, never fail the next test for it
        print(f"conftest: could not stop cluster {cluster_id!r}: {exc}")


#: Seconds after which every test not yet started fails at once: a suite that takes 15 minutes
#: and has hung (each hang ends at pytest-timeout's 600 s) still ends, with its summary and the
#: stacks faulthandler printed, well inside CI's 90 minutes, instead of being cut off silently.
SUITE_BUDGET_S = 50 * 60
_STARTED = time.monotonic()


def pytest_runtest_setup(item) -> None:
    spent = time.monotonic() - _STARTED
    if spent > SUITE_BUDGET_S:
        pytest.fail(f"not run: the suite has run {spent / 60:.0f} minutes, past its budget of "
                    f"{SUITE_BUDGET_S // 60} (a hang above it: see the stacks printed after 5 "
                    "minutes and the tests that timed out)", pytrace=False)
    # Each notebook gets a cluster id of its own: nbval starts its kernel at the notebook's
    # first cell and the kernel reads the id then. So a notebook never joins engines another
    # notebook or test left behind (a TF notebook's engines would refuse torch afterwards), and
    # a notebook that hung cannot hold up the next one. Other tests use the worker's id.
    stem = _notebook_of(item)
    if stem is None:
        os.environ["COURSE_CLUSTER_ID"] = _BASE_ID
        return
    if stem not in _NOTEBOOK_IDS:
        for earlier in _NOTEBOOK_IDS.values():
            _stop_left_over(earlier)
        _NOTEBOOK_IDS[stem] = f"{_BASE_ID}-nb{stem[:2]}"
    os.environ["COURSE_CLUSTER_ID"] = _NOTEBOOK_IDS[stem]


def pytest_sessionfinish(session) -> None:
    for cluster_id in _NOTEBOOK_IDS.values():
        _stop_left_over(cluster_id)
    os.environ["COURSE_CLUSTER_ID"] = _BASE_ID
