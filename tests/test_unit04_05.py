"""Units 4-5's graded checks, beyond structure: the probes behind unit 4's exercise 2 run in
this process on the notebook's own ``build_graph`` (the solution, and each of the mistakes of
``tests/mistakes/u04_*.py`` planted in it), with no cluster: building a graph contacts no
server, and the value probe runs a local session on a copy of the graph with its devices
cleared. The notebooks' graded tests call the same probes on the engines.
"""

from __future__ import annotations

import copy
import importlib.util
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from course_utils import tf_dist
from course_utils.assignments.lessons import NOTEBOOK_DIR, read
from course_utils.checks import tf_graph
from course_utils.instructor.graded_tests import with_solution
from course_utils.notebook_cells import nbgrader_meta

NB4 = NOTEBOOK_DIR / "04_tf_classic_ps.ipynb"
MISTAKES = Path(__file__).parent / "mistakes"
SPEC = {"ps": ["127.0.0.1:2223"], "worker": ["127.0.0.1:2222", "127.0.0.1:2224"]}


def _cell(nb, grade_id: str) -> str:
    cell = next(c for c in nb.cells if nbgrader_meta(c).get("grade_id") == grade_id)
    return cell.source.replace("%%px\n", "", 1)


def _install(monkeypatch, body: str | None = None) -> None:
    """Define the notebook's ``build_graph`` (with ``body`` planted, if given) in ``__main__``,
    where the engine probes look for it, as the ``%%px`` cell does on an engine."""
    nb = read(NB4)
    if body is not None:
        nb = with_solution(copy.deepcopy(nb), "ex2-solution", body)
    main = sys.modules["__main__"]
    for name in ("build_graph", "KEYS", "tf", "tf_cluster", "worker_index"):
        monkeypatch.setattr(main, name, None, raising=False)   # undone after the test
    main.tf, main.tf_cluster, main.worker_index = tf_dist.quiet_tensorflow(), SPEC, 1
    exec(_cell(nb, "ex2-solution"), vars(main))


def _body(name: str) -> tuple[str, str]:
    from tests.notebook_items.entries import load  # BODY, or the solution with REPLACE's edits made

    mod = load(MISTAKES / f"{name}.py")
    return mod.BODY, mod.MESSAGE


def test_reference_batch_matches_a_plain_numpy_softmax_regression():
    ref = tf_graph.reference_batch()
    z = ref["x"] @ ref["W"] + ref["b"]
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    assert ref["loss"] == pytest.approx(-np.log(p[np.arange(16), ref["y"]]).mean(), rel=1e-5)
    assert ref["accuracy"] == 0.5 and ref["loss_sum"] == pytest.approx(16 * ref["loss"])


def test_solution_graph_computes_numpys_loss_and_accuracy_and_syncs_only_when_asked(
        monkeypatch):
    _install(monkeypatch)
    got = tf_graph.engine_graph_values()
    assert got["loss"] == pytest.approx(got["want_loss"], rel=1e-4)
    assert got["accuracy"] == got["want_accuracy"] == 0.5
    sync = tf_graph.engine_graph_sync(workers=3)
    assert sync["async"]["accumulators"] == 0 and not sync["async"]["hooks"]
    assert sync["sync"]["accumulators"] == 2 and sync["sync"]["replicas_to_aggregate"] == [3]
    assert sync["sync"]["hooks"] == ["_SyncReplicasOptimizerHook"]
    assert sync["sync"]["loss"].startswith("/job:worker/task:2")
    assert sync["sync"]["W"].startswith("/job:ps/task:0")
    assert sys.modules["__main__"].tf_cluster is SPEC   # restored after the 3-worker build


@pytest.mark.parametrize("name", ["u04_constant_accuracy", "u04_loss_sum_not_mean",
                                  "u04_loss_on_softmax"])
def test_value_mistakes_differ_from_numpy_and_the_fix_is_named(monkeypatch, name):
    body, message = _body(name)
    _install(monkeypatch, body)
    got = tf_graph.engine_graph_values()
    loss_ok = got["loss"] == pytest.approx(got["want_loss"], rel=1e-4)
    acc_ok = got["accuracy"] == got["want_accuracy"]
    assert not (loss_ok and acc_ok), f"{name}: the values match NumPy's"
    if not loss_ok:
        assert message in got["loss_fix"]


def test_torch_argument_order_is_reported_with_the_keyword_fix(monkeypatch):
    body, message = _body("u04_loss_args_torch_order")
    _install(monkeypatch, body)
    got = tf_graph.engine_check_train_graph()
    assert got["error"] and message in got["error_fix"]


@pytest.mark.parametrize("name,mode,key", [("u04_sync_ignored", "sync", "accumulators"),
                                           ("u04_sync_no_hook", "sync", "hooks"),
                                           ("u04_sync_two_replicas", "sync",
                                            "replicas_to_aggregate")])
def test_sync_mistakes_show_in_the_three_worker_graph(monkeypatch, name, mode, key):
    _install(monkeypatch)
    right = tf_graph.engine_graph_sync(workers=3)[mode][key]
    _install(monkeypatch, _body(name)[0])
    wrong = tf_graph.engine_graph_sync(workers=3)[mode][key]
    assert wrong != right


@pytest.mark.parametrize("path", sorted(MISTAKES.glob("u0[45]_*.py")), ids=lambda p: p.stem)
def test_the_aimed_test_cell_names_each_mistakes_fix(path):
    """Static, no kernel: each unit 4/5 mistake's MESSAGE is written in the test cell it aims at
    (or in the probe behind unit 4's exercise 2), so the catalogue run can find it there."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    text = _cell(read(NOTEBOOK_DIR / mod.NOTEBOOK), mod.FAILS)
    if mod.FAILS == "ex2-test" and mod.NOTEBOOK == NB4.name:
        text += Path(tf_graph.__file__).read_text()
    text = re.sub(r'"\s*\n\s*f?"', "", text)   # join implicitly concatenated strings
    assert mod.MESSAGE in text, f"{path.name}: {mod.MESSAGE!r} appears nowhere in {mod.FAILS}"
