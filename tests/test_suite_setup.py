"""How the suite shares its work between xdist workers (pyproject.toml's addopts): a notebook's
cells stay on one worker, since nbval runs them in order in one kernel."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]


def test_a_notebooks_cells_run_on_one_worker(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(f"x = {i}") for i in range(8)])
    nbformat.write(nb, tmp_path / "cells.ipynb")
    for name in ("test_a.py", "test_b.py"):
        (tmp_path / name).write_text("".join(f"def test_{i}():\n    pass\n" for i in range(4)))
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir",
         str(tmp_path), "-n", "2", "-v", "-p", "no:randomly", "--timeout=120", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    workers: dict[str, set[str]] = {}
    for worker, nodeid in re.findall(r"\[(gw\d)\][^\n]*PASSED (\S+)", out.stdout):
        # xdist prints a notebook's cell as "cells::ipynb::Cell 0"
        workers.setdefault(nodeid.split("::")[0].removesuffix(".ipynb"), set()).add(worker)
    assert set(workers) == {"cells", "test_a.py", "test_b.py"}, out.stdout[-3000:]
    assert all(len(w) == 1 for w in workers.values()), workers


def _checks_something(fn: ast.AST, helpers: set[str]) -> bool:
    """An ``assert``, a ``pytest.raises``/``fail``/``warns`` or a call of a helper that does."""
    for node in ast.walk(fn):
        if isinstance(node, ast.Assert):
            return True
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(
                node.func, "id", "")
            if name in {"raises", "fail", "warns", "deprecated_call"} | helpers:
                return True
    return False


def test_every_test_has_a_check_that_can_fail():
    """A test that asserts nothing passes whatever the code does: every ``test_*`` function
    asserts, expects an exception, or calls a helper of the suite that does."""
    here = Path(__file__).parent
    files = [*sorted(here.glob("test_*.py")), *sorted(here.glob("rigs/*.py")),
             here.parent / "conftest.py"]
    trees = {p: ast.parse(p.read_text(), str(p)) for p in files}
    helpers: set[str] = set()
    for _ in range(3):  # helpers calling helpers
        for tree in trees.values():
            helpers |= {f.name for f in ast.walk(tree)
                        if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
                        and not f.name.startswith("test_") and _checks_something(f, helpers)}
    empty = [f"{p.name}::{f.name}" for p, tree in trees.items() for f in ast.walk(tree)
             if isinstance(f, ast.FunctionDef) and f.name.startswith("test_")
             and not _checks_something(f, helpers)]
    assert not empty, f"tests that check nothing: {empty}"


def test_the_longest_files_are_queued_first_and_a_files_items_keep_their_order():
    from types import SimpleNamespace

    from tests import file_order

    root = Path("/repo")
    names = [("tests/test_small.py", "a"), ("notebooks/04_tf_classic_ps.ipynb", "Cell 0"),
             ("tests/test_small.py", "b"), ("tests/test_workshop.py", "x"),
             ("notebooks/04_tf_classic_ps.ipynb", "Cell 1"), ("tests/test_other.py", "c")]
    items = [SimpleNamespace(path=root / f, name=n) for f, n in names]
    file_order.sort_items(items, root)
    assert [(file_order.file_of(i.path, root), i.name) for i in items] == [
        ("tests/test_workshop.py", "x"), ("notebooks/04_tf_classic_ps.ipynb", "Cell 0"),
        ("notebooks/04_tf_classic_ps.ipynb", "Cell 1"), ("tests/test_small.py", "a"),
        ("tests/test_small.py", "b"), ("tests/test_other.py", "c")]


def test_every_file_the_order_names_is_in_the_suite():
    from tests import file_order

    gone = [f for f in file_order.SECONDS if not (ROOT / f).is_file()]
    assert not gone, f"tests/file_order.py names files that are gone: {gone}"
    assert "--no-loadscope-reorder" in (ROOT / "pyproject.toml").read_text()
