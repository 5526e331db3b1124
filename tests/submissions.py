"""Submissions a class hands in, built from the release itself (never typed in here): shared by
the grading tests (tests/test_instructor_grade.py, tests/test_grade_sandbox.py) and the
workshop rig's (tests/test_workshop.py)."""

from __future__ import annotations

import copy
import re

import nbformat

from course_utils.notebook_cells import nbgrader_meta

#: A student's swaps that would make unit 0 ex2's stub pass its test: the kernel's helpers (the
#: cluster's methods) and an engine-side check, replaced from cells before the test.
SWAPS = ('cluster.run = lambda f, *a, **k: [{"result": 5.0, "calls": {"all_reduce": 1}}] * 2\n'
         'cluster.call = lambda name, *a, **k: [5.0, 5.0]\n',
         "%%px\nimport course_utils.checks.collective_calls as m\n"
         "m.engine_check_collectives = lambda *a, **k: {'result': 5.0, "
         "'calls': {'all_reduce': 1}}\n")


#: The start of a hostile learner's probe cell: ``_try(what, fn)`` prints one JSON line per
#: attempt (ALLOWED or DENIED); ``root`` is the course folder, seen from nbgrader's
#: ``autograded/<student>/<unit>/``. :func:`probe_verdicts` reads the lines back.
PROBE_PREAMBLE = r'''
import json, os, socket
def _try(what, fn):
    try:
        got = fn()
        print(json.dumps([what, "ALLOWED", str(got)[:60]]))
    except Exception as exc:
        print(json.dumps([what, "DENIED", type(exc).__name__]))
root = os.path.abspath("../../..")
'''


def probe_verdicts(graded) -> dict[str, str]:
    """What each ``_try`` of :data:`PROBE_PREAMBLE` printed in the graded notebook ``graded``:
    attempt -> ALLOWED/DENIED."""
    import json

    lines = [json.loads(ln) for c in graded.cells if c.cell_type == "code"
             for o in c.get("outputs", []) if o.get("name") == "stdout"
             for ln in o.get("text", "").splitlines() if ln.startswith('["')]
    return {what: how for what, how, _ in lines}


def grade_id(cell) -> str:
    return nbgrader_meta(cell).get("grade_id", "")


def solved(released, source):
    """The release with the instructor's solution typed in, as a good student would."""
    nb = copy.deepcopy(released)
    src = {grade_id(c): c.source for c in source.cells}
    for cell in nb.cells:
        if nbgrader_meta(cell).get("solution"):
            cell.source = re.sub(r"[ \t]*### (BEGIN|END) SOLUTION\n", "", src[grade_id(cell)])
    return nb


def insert_after(nb, gid, code):
    """``nb`` with a new code cell ``code`` right after cell ``gid``."""
    at = next(i for i, c in enumerate(nb.cells) if grade_id(c) == gid)
    nb.cells.insert(at + 1, nbformat.v4.new_code_cell(code))
    return nb


def swap_helpers(nb):
    """Unit 0 with :data:`SWAPS` after ex2's solution cell, engines' swap first."""
    for code in SWAPS:  # engines first: the kernel's swapped cluster.run is then in place
        insert_after(nb, "ex2-solution", code)
    return nb
