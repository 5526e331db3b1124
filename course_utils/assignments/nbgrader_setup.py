"""nbgrader, configured for a distributed course: three small preprocessors and one config call.

``nbgrader_config.py`` of a course folder (written by ``course release``) calls
:func:`configure`, so ``nbgrader generate_assignment/autograde/generate_feedback`` and formgrader
behave exactly as ``course release/grade/feedback`` do. nbgrader's own pipelines stay in place;
we only add or swap one step each:

* :class:`StubHints` (after ``ClearSolutions``): the stub says which exercise it is.
* :class:`RestoreDeletedTests` (before ``OverwriteCells``): a test cell a student deleted is put
  back where it was, so it runs and scores instead of vanishing. (nbgrader's own
  ``OverwriteCells.add_missing_cells`` fails when the cell before a test is a plain lesson cell.)
* :class:`CourseExecute` (instead of ``Execute``): a per-cell and a per-notebook time limit;
  after a cell hits its limit (a hang on the engines) the rest is not run, so a hanging notebook
  costs at most the limit, and every later test records why it did not pass.
"""

from __future__ import annotations

import re
import time
from typing import Any

from nbformat import NotebookNode
from nbgrader.preprocessors import (
    ClearSolutions,
    Execute,
    NbGraderPreprocessor,
    OverwriteCells,
)
from traitlets import Integer, Unicode

from ..notebook_cells import grade_id, is_solution_cell, is_test_cell
from . import integrity

STUB = "raise NotImplementedError()"
TIMEOUT_ENAME = "CellTimeoutError"
SKIPPED_ENAME = "NotRun"
DEAD_ENAME = "DeadKernelError"


class StubHints(NbGraderPreprocessor):
    """Give each solution stub a message: the exercise's heading and what to do.

    ``raise NotImplementedError()`` becomes ``raise NotImplementedError("Exercise 1 — ...:
    replace this line with your solution ...")``. A cell may set its own hint in
    ``metadata.course.hint``.
    """

    def preprocess(self, nb: NotebookNode, resources: dict) -> tuple[NotebookNode, dict]:
        from .release import stub_hint

        heading = ""
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                found = re.findall(r"^#{1,4}\s+(.+?)\s*$", cell.source, re.M)
                if found:
                    heading = re.sub(r"[`*_]", "", found[-1])
            elif cell.cell_type == "code" and is_solution_cell(cell) and STUB in cell.source:
                hint = cell.get("metadata", {}).get("course", {}).get("hint") or stub_hint(
                    heading, grade_id(cell))
                cell.source = cell.source.replace(STUB, f"raise NotImplementedError({hint!r})")
        return nb, resources


class RestoreDeletedTests(NbGraderPreprocessor):
    """Put back graded test cells missing from a submission, in their released position."""

    release_root = Unicode("", help="the course's release/ folder").tag(config=True)

    def preprocess(self, nb: NotebookNode, resources: dict) -> tuple[NotebookNode, dict]:
        import copy
        from pathlib import Path

        import nbformat

        info = resources.get("nbgrader", {})
        path = Path(self.release_root) / info.get("assignment", "") / (
            info.get("notebook", "") + ".ipynb")
        if not self.release_root or not path.exists():
            self.log.warning("RestoreDeletedTests: no released notebook at %s", path)
            return nb, resources
        released = nbformat.read(str(path), as_version=4)
        have = {grade_id(c) for c in nb.cells if grade_id(c)}
        for i, cell in enumerate(released.cells):
            gid = grade_id(cell)
            if not is_test_cell(cell) or gid in have:
                continue
            # After the nearest earlier released cell that the submission still has.
            where = 0
            for prev in reversed(released.cells[:i]):
                pid = grade_id(prev)
                idx = next((k for k, c in enumerate(nb.cells) if grade_id(c) == pid),
                           None) if pid else None
                if idx is not None:
                    where = idx + 1
                    break
            self.log.warning("Test cell %s was missing; restored at position %d", gid, where)
            nb.cells.insert(where, copy.deepcopy(cell))
            have.add(gid)
        return nb, resources


class CourseExecute(Execute):
    """nbgrader's ``Execute`` with a notebook-wide time limit and stop-after-hang."""

    notebook_timeout = Integer(
        0, help="seconds the whole notebook may take (0: no limit)").tag(config=True)

    def preprocess(self, nb: NotebookNode, resources: Any = None,
                   km: Any = None) -> tuple[NotebookNode, dict]:
        self._started = time.monotonic()
        self._stopped = ""
        return super().preprocess(nb, resources, km)

    def _remaining(self) -> float | None:
        if not self.notebook_timeout:
            return None
        return self.notebook_timeout - (time.monotonic() - self._started)

    def _get_timeout(self, cell: NotebookNode | None) -> int | None:
        timeout = super()._get_timeout(cell)
        left = self._remaining()
        if left is not None:
            timeout = max(1, int(left)) if timeout is None else max(1, min(timeout, int(left)))
        return timeout

    def preprocess_cell(self, cell: NotebookNode, resources: dict,
                        index: int) -> tuple[NotebookNode, dict]:
        from nbclient.exceptions import DeadKernelError

        if cell.cell_type != "code" or not cell.source.strip():
            return cell, resources
        left = self._remaining()
        if not self._stopped and left is not None and left < 1:
            self._stopped = (f"the notebook ran past its {self.notebook_timeout} s limit "
                             f"before this cell")
        if self._stopped:
            cell.outputs = [_error(SKIPPED_ENAME, f"not run: {self._stopped}")]
            return cell, self.resources
        name = grade_id(cell) or f"#{index}"
        limit = self._get_timeout(cell)
        try:
            if is_test_cell(cell) and self._helpers_replaced(cell, index):
                return cell, self.resources
            cell, resources = super().preprocess_cell(cell, resources, index)
        except DeadKernelError:
            cell.outputs.append(_error(DEAD_ENAME, "the notebook's kernel died in this cell"))
            self._stopped = f"the kernel died in cell {name}"
            return cell, self.resources
        if any(o.get("ename") == TIMEOUT_ENAME for o in cell.get("outputs", [])):
            for o in cell.outputs:
                if o.get("ename") == TIMEOUT_ENAME:
                    o["evalue"] = f"cell {name} ran past its {limit} s limit"
            self._stopped = f"cell {name} ran past its {limit} s limit (a hang?)"
        return cell, resources


    def _helpers_replaced(self, cell: NotebookNode, index: int) -> bool:
        """Run :mod:`.integrity`'s probe before a graded test; if the notebook replaced a
        helper, the test does not run and shows :data:`.integrity.ENAME` (0 points)."""
        probe = NotebookNode(cell_type="code", source=integrity.probe_code(), metadata={},
                             outputs=[], execution_count=None, id=f"integrity-{index}")
        try:
            self.execute_cell(probe, index, store_history=False)
        finally:  # nbclient writes the cell it ran into the notebook at ``index``: put it back
            self.nb["cells"][index] = cell
        result = integrity.read_probe(probe.outputs)
        if result is None:  # the probe itself failed: the log says so, and the test runs
            errors = [o for o in probe.outputs if o.get("output_type") == "error"]
            self.log.warning("helpers not checked before %s: %s", grade_id(cell), (
                f"{errors[0].get('ename')}: {errors[0].get('evalue')}" if errors else "no answer"))
            return False
        if not result["found"]:
            return False
        cell.outputs = [_error(integrity.ENAME, integrity.message(result["found"]))]
        return True


def _error(ename: str, evalue: str) -> NotebookNode:
    return NotebookNode(output_type="error", ename=ename, evalue=evalue,
                        traceback=[f"\x1b[0;31m{ename}\x1b[0m: {evalue}"])


def _path_has_this_environment() -> None:
    """nbgrader creates its gradebook by running the ``alembic`` command: find it in this
    environment's ``bin`` even when the environment is not activated (``.venv/bin/course``)."""
    import os
    import sys

    here = os.path.dirname(sys.executable)
    parts = os.environ.get("PATH", "").split(os.pathsep)
    if here not in parts:
        os.environ["PATH"] = os.pathsep.join([here, *parts])


def _default(cls: type, trait: str) -> list:
    return list(cls.class_traits()[trait].default())


def configure(c: Any, root: str, cell_timeout: int = 300, notebook_timeout: int = 1200) -> None:
    """Set up nbgrader config ``c`` for the course folder ``root`` (see the module doc)."""
    _path_has_this_environment()
    from pathlib import Path

    from nbconvert.preprocessors import ClearMetadataPreprocessor
    from nbgrader.converters import Autograde, GenerateAssignment

    gen = _default(GenerateAssignment, "preprocessors")
    gen.insert(gen.index(ClearSolutions) + 1, StubHints)
    c.GenerateAssignment.preprocessors = gen

    sanitize = _default(Autograde, "sanitize_preprocessors")
    sanitize.insert(sanitize.index(OverwriteCells), RestoreDeletedTests)
    c.Autograde.sanitize_preprocessors = sanitize
    auto = [CourseExecute if p is Execute else p
            for p in _default(Autograde, "autograde_preprocessors")]
    assert ClearMetadataPreprocessor in auto  # nbgrader's list, unchanged but for Execute
    c.Autograde.autograde_preprocessors = auto

    c.RestoreDeletedTests.release_root = str(Path(root) / "release")
    c.CourseExecute.timeout = cell_timeout
    c.CourseExecute.notebook_timeout = notebook_timeout
    c.CourseExecute.interrupt_on_timeout = True
    # nbgrader raises when a cell's output lags its reply by more than iopub_timeout (nbclient's
    # 4 s): on a loaded machine the output of a busy %%px cell can, and the whole notebook was
    # then lost ("could not grade it"). Seen at load 25 on 2 cores.
    c.CourseExecute.iopub_timeout = 30
    # One kernel start-up warning per student (TCP on loopback) would drown the progress lines.
    c.CourseExecute.extra_arguments = ["--IPKernelApp.log_level=ERROR"]
    c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\n" + STUB}
    # Ids are named in the gradebook by grade_id; keep our notebooks' ids as they are.
    c.CourseDirectory.root = str(root)
