"""What the catalogue plants, read without a kernel: the mistakes (``tests/mistakes/u*.py``,
format in ``tests/mistakes/README.md``) and the student version of every exercise (a
:class:`Stub` per solution cell, paired with its tests by ``metadata.course.exercise``)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

from course_utils.assignments.lessons import NOTEBOOK_DIR, read
from course_utils.assignments.release import lesson_notebooks
from course_utils.instructor.graded_tests import solution_region
from course_utils.notebook_cells import exercise_cells, grade_id, nbgrader_meta

MISTAKE_DIR = Path(__file__).parent.parent / "mistakes"


def cell_order(path: Path) -> tuple[str, int, str]:
    """Notebook, then the position of the planted solution cell: the catalogue runs forwards
    through each notebook (one kernel), so a mistake in exercise 1 must come before one in 2."""
    text = path.read_text()
    consts = {k: v for k, v in (ln.split(" = ", 1) for ln in text.splitlines()
                                if ln.startswith(("NOTEBOOK = ", "GRADE_ID = ")))}
    notebook, grade = (ast.literal_eval(consts[k]) for k in ("NOTEBOOK", "GRADE_ID"))
    cells = read(NOTEBOOK_DIR / notebook).cells
    at = next((i for i, c in enumerate(cells) if nbgrader_meta(c).get("grade_id") == grade), -1)
    return notebook, at, path.name


MISTAKES = sorted(MISTAKE_DIR.glob("u*.py"), key=cell_order)
MISTAKES_NOTEBOOKS = sorted({p.name for p in NOTEBOOK_DIR.glob("*.ipynb")})


class Stub(NamedTuple):
    """The student version of one exercise: solution cell ``grade_id`` (at ``at``) and the
    graded tests of its exercise after it, which must fail on its stub."""

    notebook: str
    at: int
    grade_id: str
    tests: tuple[str, ...]

    @property
    def id(self) -> str:
        return f"stub_{self.notebook[:2]}_{self.grade_id}"


def stubs_of(name: str) -> list[Stub]:
    """Each solution cell of notebook ``name``, with the test cells after it that belong to its
    exercise (``metadata.course.exercise``)."""
    cells = read(NOTEBOOK_DIR / name).cells
    out = []
    for cells_of in exercise_cells(cells).values():
        for s in cells_of["solution"]:
            tests = tuple(grade_id(cells[t]) for t in cells_of["tests"] if t > s)
            out.append(Stub(name, s, grade_id(cells[s]), tests))
    return sorted(out)


STUBS = [st for path in lesson_notebooks() for st in stubs_of(path.name)]
#: Mistakes and stubs together, forwards through each notebook (one kernel for all).
ENTRIES = sorted([*MISTAKES, *STUBS], key=lambda e: (e.notebook, e.at, e.id) if isinstance(
    e, Stub) else cell_order(e))
FIELDS = ("NOTEBOOK", "GRADE_ID", "FAILS", "MESSAGE", "WITHIN_S")


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"mistake_{path.stem}", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    missing = [f for f in FIELDS if not hasattr(mod, f)]
    assert not missing, f"{path.name} lacks {missing}"
    assert 0 < mod.WITHIN_S <= 30, f"{path.name}: WITHIN_S must be in (0, 30]"
    assert hasattr(mod, "BODY") != hasattr(mod, "REPLACE"), f"{path.name}: BODY or REPLACE"
    if hasattr(mod, "REPLACE"):
        mod.BODY = planted(path.name, read(NOTEBOOK_DIR / mod.NOTEBOOK), mod.GRADE_ID,
                           mod.REPLACE, getattr(mod, "REGION", 0))
    return mod


def planted(name: str, nb, grade_id: str, replace: list[tuple[str, str]], region: int = 0
            ) -> str:
    """The solution region with each ``(old, new)`` of ``REPLACE`` made once: the mistake as
    a change of the working code, so that it follows the solution when that is edited."""
    body = solution_region(nb, grade_id, region)
    for old, new in replace:
        assert body.count(old) == 1, (
            f"{name}: {old!r} occurs {body.count(old)} times in {grade_id}'s solution, not once")
        body = body.replace(old, new)
    return body


def index_of(nb, grade_id: str) -> int:
    for i, c in enumerate(nb.cells):
        if nbgrader_meta(c).get("grade_id") == grade_id:
            return i
    raise KeyError(f"no cell with grade_id {grade_id!r}")
