"""The stress run: every notebook, source and student release, N times in a row, counting the
lesson cells that fail. Outside the default suite (it takes hours at N = 10):

    .venv/bin/python -m tests.stress --runs 10                 # every unit, both versions
    .venv/bin/python -m tests.stress --runs 3 03 06 --version release

Each run is a fresh kernel (the course kernel of this interpreter, as nbval starts it) that
executes the notebook top to bottom, recording errors instead of stopping. A cell counts as
failed when it is a lesson cell (not a solution cell, and on the release not a graded test:
there the stubs make those fail by design) and its output holds an error. What the run looks
for is a cell that fails *now and then* (in some runs, not all): that, or a failure of a source
notebook, makes it exit 1. On the release, a lesson cell that uses an unsolved exercise fails in
every run, by design, and is listed as such. The summary (one line
per notebook and version, then every failed cell with its first error line) is printed and
written as JSON to ``--out``. ``tests/test_stress.py`` keeps the classification honest on a small
notebook; the default suite runs every notebook once (nbval) and a few twice
(``tests/notebook_items/rerun.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat
from nbformat import NotebookNode

from course_utils.notebook_cells import grade_id, is_solution_cell, is_test_cell

NOTEBOOK_DIR = Path(__file__).resolve().parents[1] / "notebooks"
CELL_TIMEOUT = 600


@dataclass
class Tally:
    """One notebook in one version over ``runs`` runs."""

    notebook: str
    version: str
    runs: int = 0
    failed_runs: int = 0
    seconds: list[float] = field(default_factory=list)
    #: cell label -> how many runs it failed in; and its first error line, per label
    cells: Counter = field(default_factory=Counter)
    first_error: dict[str, str] = field(default_factory=dict)

    def line(self) -> str:
        took = f"{min(self.seconds):.0f}-{max(self.seconds):.0f} s" if self.seconds else "-"
        return (f"{self.notebook} [{self.version}]: {self.runs - self.failed_runs}/{self.runs} "
                f"runs clean ({took} each)")

    def now_and_then(self) -> list[str]:
        """The cells that failed in some runs but not in all: the flakes this run looks for."""
        return [label for label, n in self.cells.items() if 0 < n < self.runs]

    def verdict(self, label: str) -> str:
        """How a failed cell failed: in some runs only (a flake), or in every run; on the
        release a lesson cell that uses an unsolved exercise fails in every run by design."""
        n = self.cells[label]
        if n < self.runs:
            return "NOW AND THEN"
        return "every run (it uses an exercise left unsolved)" if self.version == "release" \
            else "every run"

    def as_json(self) -> dict:
        return {**asdict(self), "cells": dict(self.cells)}  # asdict makes a Counter of pairs


def cell_label(index: int, cell: NotebookNode) -> str:
    return grade_id(cell) or cell.get("id") or f"cell {index}"


def failed_lesson_cells(executed: NotebookNode, release: bool) -> dict[str, str]:
    """Label -> first error line, for each lesson cell of an executed notebook that failed."""
    failed = {}
    for index, cell in enumerate(executed.cells):
        if cell.cell_type != "code" or is_solution_cell(cell):
            continue
        if release and is_test_cell(cell):
            continue
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if errors:
            failed[cell_label(index, cell)] = f"{errors[0].get('ename')}: " \
                f"{str(errors[0].get('evalue', '')).splitlines()[:1]}"
    return failed


def current_env_kernel():
    """A manager for the kernel of this interpreter, as nbval's --nbval-current-env starts it.
    nbclient never shuts down a kernel manager it was handed: whoever makes one stops it
    (:func:`execute` does; one left running per run filled this machine's memory)."""
    from jupyter_client import KernelManager
    from nbval.kernel import CURRENT_ENV_KERNEL_NAME, NbvalKernelspecManager

    return KernelManager(kernel_name=CURRENT_ENV_KERNEL_NAME,
                         kernel_spec_manager=NbvalKernelspecManager())


def execute(nb: NotebookNode, cwd: Path, km=None) -> NotebookNode:
    """Run every cell in a fresh kernel of this interpreter, errors recorded, not raised;
    the kernel is shut down afterwards."""
    from nbclient import NotebookClient

    km = km or current_env_kernel()
    client = NotebookClient(nb, km=km, timeout=CELL_TIMEOUT, allow_errors=True,
                            kernel_name=km.kernel_name,
                            resources={"metadata": {"path": str(cwd)}})
    try:
        client.execute(cwd=str(cwd))
    finally:
        if km.has_kernel:
            km.shutdown_kernel(now=True)
    return nb


def versions_of(path: Path, version: str) -> list[tuple[str, NotebookNode]]:
    out = []
    if version in ("source", "both"):
        out.append(("source", nbformat.read(path, as_version=4)))
    if version in ("release", "both"):
        from course_utils.assignments.release import student_notebook

        out.append(("release", student_notebook(path)))
    return out


def stress(paths: list[Path], runs: int, version: str, emit=print) -> list[Tally]:
    tallies = []
    for path in paths:
        for name, nb in versions_of(path, version):
            tally = Tally(path.name, name)
            for run in range(runs):
                t0 = time.perf_counter()
                failed = failed_lesson_cells(execute(nbformat.from_dict(nb), NOTEBOOK_DIR),
                                             release=name == "release")
                tally.seconds.append(time.perf_counter() - t0)
                tally.runs += 1
                tally.failed_runs += bool(failed)
                for label, error in failed.items():
                    tally.cells[label] += 1
                    tally.first_error.setdefault(label, error)
                emit(f"  {path.name} [{name}] run {run + 1}/{runs}: "
                     f"{'clean' if not failed else 'FAILED ' + ', '.join(failed)} "
                     f"({tally.seconds[-1]:.0f} s)")
            tallies.append(tally)
            emit(tally.line())
    return tallies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.stress", description=__doc__.split(
        "\n\n")[0])
    parser.add_argument("units", nargs="*", help="unit numbers (default: every notebook)")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--version", choices=("source", "release", "both"), default="both")
    parser.add_argument("--out", type=Path, default=Path("stress.json"))
    args = parser.parse_args(argv)
    paths = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
    if args.units:
        paths = [p for p in paths if p.name[:2] in {u.zfill(2) for u in args.units}]
    tallies = stress(paths, args.runs, args.version)
    print("\n".join(["", "stress run:"] + [t.line() for t in tallies]))
    for t in tallies:
        for label, count in t.cells.items():
            print(f"  {t.notebook} [{t.version}] {label}: failed {count}/{t.runs}, "
                  f"{t.verdict(label)}: {t.first_error[label]}")
    args.out.write_text(json.dumps([t.as_json() for t in tallies], indent=1))
    flakes = [f"{t.notebook} [{t.version}] {c}" for t in tallies for c in t.now_and_then()]
    broken = [t.line() for t in tallies if t.version == "source" and t.failed_runs]
    print(f"cells that failed now and then: {len(flakes)}; source notebooks that failed: "
          f"{len(broken)}")
    return 1 if flakes or broken else 0


if __name__ == "__main__":
    sys.exit(main())
