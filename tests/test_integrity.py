"""The grader's check that a submission did not replace the helpers a graded test calls
(:mod:`course_utils.assignments.integrity`); end to end, with engines, in
``test_instructor_grade.py`` (student ``b_raises_and_swaps``)."""

from __future__ import annotations

import nbformat
from nbclient import NotebookClient

from course_utils.assignments import integrity

AFTER = "print(sorted(k for k in globals() if 'integrity' in k))"


def _in_a_kernel(*sources: str) -> list[dict]:
    """Run ``sources`` as cells, then the probe, then :data:`AFTER`, in a real kernel; the
    outputs of the probe and of AFTER."""
    cells = [nbformat.v4.new_code_cell(s) for s in (*sources, integrity.probe_code(), AFTER)]
    nb = nbformat.v4.new_notebook(cells=cells)
    NotebookClient(nb, timeout=60, kernel_name="python3", allow_errors=True).execute()
    return nb.cells[-2].outputs + nb.cells[-1].outputs


def test_a_clean_kernel_has_nothing_replaced():
    result = integrity.read_probe(_in_a_kernel(
        "import course_utils as cu\nfrom course_utils import checks\n"
        "def my_answer():\n    return 1\n"))
    assert result == {"found": [], "engines": "no cluster"}


def test_the_usual_swaps_are_found_and_the_probe_leaves_no_names():
    outputs = _in_a_kernel(
        "import builtins\nimport course_utils.checks.collective_calls as m\n"
        "from course_utils.errors import CourseError\n"
        "m.engine_check_collectives = lambda *a: {'result': 5.0}\n"
        "CourseError.__str__ = lambda self: 'fine'\n"
        "builtins.all = lambda xs: True\n"
        "err = CourseError('a', 'b')\nerr._render_traceback_ = lambda: []\n")
    result = integrity.read_probe(outputs)
    assert result["found"] == [
        "kernel: builtins.all", "kernel: course_utils.checks.collective_calls."
        "engine_check_collectives", "kernel: course_utils.errors.CourseError.__str__",
        "kernel: err._render_traceback_"], result
    assert outputs[-1]["text"] == "[]\n"  # the probe defined nothing in the notebook


def test_the_message_reads_back():
    found = ["kernel: cluster.call", "rank 0: course_utils.checks.x"]
    out = {"output_type": "error", "ename": integrity.ENAME, "evalue": integrity.message(found)}
    assert integrity.replaced_in([out]) == found
    assert integrity.replaced_in([{"output_type": "error", "ename": "AssertionError",
                                   "evalue": "x"}]) == []
    assert integrity.read_probe([{"output_type": "stream", "text": "nothing\n"}]) is None
