"""Mutants of the solutions (``tools/mutation``), run like the catalogue's mistakes: just before
nbval's item for the solution cell, the mutated cell runs, then the cells after it up to the
last visible test of its exercise (the test cells as ``course release`` hands them out, the
lesson cells as they are). The outcome:

* ``killed``: a visible test of the exercise failed (its message is recorded);
* ``survived``: they all passed: a gap in the visible tests, unless the mutant is listed in
  ``tests/mistakes/equivalent_mutants.toml`` with one line on why it computes the same thing
  (``equivalent``);
* ``timeout``: a cell ran past ``CELL_LIMIT_S``: the learner waits with no message.

``damaged`` says whether the mutant left the ranks' process group unusable for the next cell
(the catalogue then restarts the engines, as after a mistake). A mutant item fails unless the
mutant was killed or is equivalent, and a damaged group fails it too.

Which mutants run: ``COURSE_MUTANTS_PER_EXERCISE`` per solution cell (``all``, a count, or 0,
the default) and ``COURSE_MUTANTS_PER_RUN`` more across the quick cells (``make test`` draws a
few each run), drawn among those not listed as equivalent by ``COURSE_MUTANTS_SEED`` (else a
seed of the run's own, the same on every xdist worker; pytest's header prints it, to replay a
run). ``COURSE_MUTANTS_OUT`` names a JSON-lines file each outcome
is appended to; ``python -m tools.mutation.report`` makes the report from it (``make mutants``).
"""

from __future__ import annotations

import functools
import json
import os
import random
import time
import tomllib
import zlib
from pathlib import Path
from typing import NamedTuple

from course_utils.assignments.lessons import NOTEBOOK_DIR, read
from course_utils.assignments.release import lesson_notebooks
from course_utils.notebook_cells import grade_id, is_teardown, nbgrader_meta, source_text
from tools.mutation.operators import Mutant, bound_names, mutants

from .entries import MISTAKE_DIR, Stub, stubs_of
from .kernel import Walk, execute

EQUIVALENT_FILE = MISTAKE_DIR / "equivalent_mutants.toml"
#: Seconds one cell of a mutant's run may take before it counts as a hang (``timeout``).
CELL_LIMIT_S = 90


class MutantEntry(NamedTuple):
    """One mutant of the solution cell of ``stub`` (at ``at`` in ``notebook``)."""

    notebook: str
    at: int
    stub: Stub
    mutant: Mutant

    @property
    def id(self) -> str:
        """Short and stable (pytest-xdist compares the workers' ids): the mutant's own id,
        which names the change, is in the item's output and the report."""
        return (f"mut_{self.notebook[:2]}_{self.stub.grade_id}_"
                f"{zlib.crc32(self.mutant.id.encode()):08x}")


def equivalent() -> dict[tuple[str, str], str]:
    """(notebook, mutant id) -> why it computes what the solution computes (the reviewer's
    list; grade_ids repeat across notebooks)."""
    if not EQUIVALENT_FILE.exists():
        return {}
    listed = tomllib.loads(EQUIVALENT_FILE.read_text()).get("mutant", [])
    return {(e["notebook"], e["mutant"]): e["why"] for e in listed}


@functools.cache
def all_mutants() -> tuple[MutantEntry, ...]:
    """Every mutant of every graded solution cell, in notebook order."""
    out = []
    for path in lesson_notebooks():
        cells = read(NOTEBOOK_DIR / path.name).cells
        for stub in stubs_of(path.name):
            scope = frozenset().union(*(bound_names(source_text(c)) for c in cells[:stub.at]
                                        if c.cell_type == "code"))
            out += [MutantEntry(path.name, stub.at, stub, m)
                    for m in mutants(source_text(cells[stub.at]), stub.grade_id, scope)]
    return tuple(out)


#: Solution cells whose visible tests take minutes (the mutant reruns them): never in the run's
#: sample (``COURSE_MUTANTS_PER_RUN``), only in draws per exercise and in ``make mutants``.
SLOW_CELLS = {("09_capstone.ipynb", "partb-solution"): "its visible test trains for 90 s",
              ("04_tf_classic_ps.ipynb", "ex3-solution"):
                  "a loop that never reaches its last step waits out run_training's 60 s",
              # run alone its mutants end cleanly; with three workers running every mutant,
              # the item after one of them can hang (cause not found): out of CI's draw
              ("04_tf_classic_ps.ipynb", "ex1-servers-solution"): "can hang the next item"}


class Selection(NamedTuple):
    """Which mutants a run draws: ``per_exercise`` ("all", or a count per solution cell),
    ``per_run`` (a count in all, drawn across the quick cells) and the ``seed``."""

    per_exercise: str
    per_run: int
    seed: int

    @property
    def any(self) -> bool:
        return self.per_exercise != "0" or self.per_run > 0


def selection() -> Selection:
    """The environment's ``COURSE_MUTANTS_PER_EXERCISE`` (default 0), ``COURSE_MUTANTS_PER_RUN``
    (default 0; ``make test`` sets it) and ``COURSE_MUTANTS_SEED`` (else the run's own)."""
    seed = os.environ.get("COURSE_MUTANTS_SEED") or str(
        zlib.crc32(os.environ.get("PYTEST_XDIST_TESTRUNUID", str(time.time())).encode())
        % 100000)
    return Selection(os.environ.get("COURSE_MUTANTS_PER_EXERCISE", "0"),
                     int(os.environ.get("COURSE_MUTANTS_PER_RUN", "0") or 0), int(seed))


def drawn(per_exercise: str, seed: int, per_run: int = 0) -> list[MutantEntry]:
    """``per_exercise`` ("all", or a count) mutants of each solution cell, drawn with ``seed``
    among those not listed as equivalent ("all": every one, equivalent or not); and
    ``per_run`` more drawn across every quick cell (not :data:`SLOW_CELLS`)."""
    every = all_mutants()
    if per_exercise == "all":
        return list(every)
    skip, rng, out = equivalent(), random.Random(seed), []
    by_cell: dict[tuple[str, int], list[MutantEntry]] = {}
    for e in every:
        if (e.notebook, e.mutant.id) not in skip:
            by_cell.setdefault((e.notebook, e.at), []).append(e)
    for group in by_cell.values():
        out += rng.sample(group, min(int(per_exercise), len(group)))
    rest = [e for group in by_cell.values() for e in group if e not in out
            and (e.notebook, e.stub.grade_id) not in SLOW_CELLS]
    out += rng.sample(rest, min(per_run, len(rest)))
    return sorted(out, key=lambda e: (e.notebook, e.at, e.mutant.id))


def run_mutant(entry: MutantEntry, walk: Walk) -> dict:
    """Plant the mutant, run its exercise's visible tests, and say what happened."""
    stub, m = entry.stub, entry.mutant
    handed_out = {grade_id(c): c for c in walk.released().cells if grade_id(c)}
    last = max((i for i, c in enumerate(walk.nb.cells) if grade_id(c) in stub.tests),
               default=stub.at)
    outcome = {"mutant": m.id, "notebook": entry.notebook, "exercise": stub.grade_id,
               "operator": m.operator, "status": "survived", "test": "", "message": "",
               "seconds": 0.0}
    t0 = time.perf_counter()
    for i in range(stub.at, last + 1):
        cell = walk.nb.cells[i]
        gid = grade_id(cell)
        if cell.cell_type != "code" or is_teardown(cell):
            continue
        source = m.source if i == stub.at else (
            handed_out[gid].source if gid in stub.tests else cell.source)
        try:
            errors, _, _ = execute(walk.nbfile.kernel, source, timeout=CELL_LIMIT_S)
        except AssertionError:
            outcome.update(status="timeout", test=gid or f"cell {i}")
            walk.wait_until_idle()
            break
        if gid in stub.tests and errors:
            outcome.update(status="killed", test=gid, message=errors[0][:600])
            break
        if errors and not nbgrader_meta(cell).get("grade"):
            walk.wait_until_idle()  # a lesson cell failed: the learner reads it and goes on
    outcome["seconds"] = round(time.perf_counter() - t0, 1)
    if outcome["status"] == "survived" and (entry.notebook, m.id) in equivalent():
        outcome["status"] = "equivalent"
    return outcome


def record(outcome: dict) -> None:
    """Append ``outcome`` to ``COURSE_MUTANTS_OUT`` (the workers share it: one short line)."""
    out = os.environ.get("COURSE_MUTANTS_OUT")
    if out:
        with Path(out).open("a") as f:
            f.write(json.dumps(outcome) + "\n")
