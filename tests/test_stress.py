"""The stress run's counting (``tests/stress.py``): which failed cells are the lesson's."""

from __future__ import annotations

import json

import nbformat

from tests import stress


def _nb():
    def meta(gid, **kw):
        return {"nbgrader": {"grade_id": gid, "points": 0, "grade": False, "solution": False,
                             "locked": True, **kw}}

    v4 = nbformat.v4
    return v4.new_notebook(cells=[
        v4.new_markdown_cell("# a unit"),
        v4.new_code_cell("x = 1", metadata=meta("setup")),
        v4.new_code_cell("raise NotImplementedError('Exercise 1')",
                         metadata=meta("ex1-solution", solution=True, locked=False)),
        v4.new_code_cell("assert x == 2, 'x should be 2'",
                         metadata=meta("ex1-test", grade=True, points=1)),
        v4.new_code_cell("1 / 0", metadata=meta("lesson")),
        v4.new_code_cell("print('done')", metadata=meta("teardown")),
    ])


def test_a_run_counts_lesson_cells_only_and_on_the_release_not_the_tests(tmp_path):
    km = stress.current_env_kernel()
    executed = stress.execute(_nb(), tmp_path, km=km)
    assert not km.has_kernel  # no kernel outlives its run (65 did once, filling memory)
    assert stress.failed_lesson_cells(executed, release=True) == {
        "lesson": "ZeroDivisionError: ['division by zero']"}
    source = stress.failed_lesson_cells(executed, release=False)
    assert set(source) == {"ex1-test", "lesson"}  # on the source a failing test is a failure
    assert "x should be 2" in source["ex1-test"]


def test_the_tally_counts_runs_and_cells(tmp_path, monkeypatch):
    path = tmp_path / "99_tiny.ipynb"
    nbformat.write(_nb(), path)
    lines: list[str] = []
    [tally] = stress.stress([path], runs=2, version="source", emit=lines.append)
    assert (tally.runs, tally.failed_runs) == (2, 2)
    assert tally.cells == {"ex1-test": 2, "lesson": 2}
    assert tally.line().startswith("99_tiny.ipynb [source]: 0/2 runs clean")
    assert len(lines) == 3 and "run 2/2: FAILED ex1-test, lesson" in lines[1]
    assert tally.now_and_then() == [] and tally.verdict("lesson") == "every run"
    assert json.loads(json.dumps(tally.as_json()))["cells"] == {"ex1-test": 2, "lesson": 2}
    tally.cells["lesson"] = 1  # failed in one run of two: what the stress run is for
    assert tally.now_and_then() == ["lesson"] and tally.verdict("lesson") == "NOW AND THEN"
    tally.version = "release"
    assert tally.verdict("ex1-test").startswith("every run (it uses an exercise")
