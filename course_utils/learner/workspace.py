"""The learner's working folder: their own copies of the units, without the answers.

``course lab`` opens this folder (``$COURSE_WORKDIR``, default ``~/dist-training-course``), not
``notebooks/`` (the instructor's source, with every solution and hidden test: ``course lab
--source`` opens that). Layout::

    ~/dist-training-course/
      START_HERE.ipynb          the course home (generated: learner/home.py)
      00_cluster_tour.ipynb ... the learner's copies: the notebooks `course release` hands out
                                (solutions stubbed with hints, hidden tests removed, checksums)
      data/, saved_models/      what the notebooks write (they use paths relative to themselves)
      .course/manifest.json     which release each copy was made from (hidden in JupyterLab)

Rules (:func:`sync`, run by every ``course lab``):

- a unit with no copy yet is added (also when the learner deleted theirs: that is how to get a
  fresh copy);
- a copy is never overwritten once the learner saved it. When the course's version of a unit
  changed since the copy was made (the *learner version* differs: a changed solution or hidden
  test does not count), the new version goes beside it, ``01_collectives.updated.ipynb``;
  a copy the learner never saved (same bytes as written) is simply replaced.

A stuck learner gets one exercise's solution with ``course solution UNIT EXERCISE``, but only
after the exercise's visible test ran at least once: the saved copy's test cell has an
execution count or an output (so: run the test cell, save with Ctrl-S, then ask).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbformat import NotebookNode

from .. import notebook_cells
from ..assignments import lessons
from ..errors import CourseError
from ..settings import ENV_WORKDIR
from ..settings import env as settings_env
from .kernelspec import set_kernelspec

MANIFEST = Path(".course") / "manifest.json"
UPDATED_SUFFIX = ".updated"
_UNIT_RE = re.compile(r"^(\d+)_[^.]+\.ipynb$")


class WorkspaceError(CourseError):
    """The working folder cannot be used as asked."""


def default_workdir() -> Path:
    """``$COURSE_WORKDIR``, else ``~/dist-training-course``."""
    env = settings_env(ENV_WORKDIR)
    return Path(env).expanduser() if env else Path.home() / "dist-training-course"


def learner_version(source: str | os.PathLike[str]) -> NotebookNode:
    """The unit as a learner gets it: the student notebook ``course release`` hands out for the
    source notebook at ``source`` (:func:`.release.student_notebook`, cached), asking for the
    course kernel.

    Solution regions become stubs that say which exercise they are, hidden tests are removed,
    outputs cleared, test and read-only cells locked, nbgrader's checksums kept.
    """
    return learner_versions([Path(source)])[0]


def learner_versions(sources: list[Path]) -> list[NotebookNode]:
    """:func:`learner_version` of each source; units not cached yet are released together."""
    from ..assignments.release import student_notebooks

    return [set_kernelspec(nb) for nb in student_notebooks(sources)]


def notebook_bytes(nb: NotebookNode) -> bytes:
    return (nbformat.writes(nb) + "\n").encode()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_sha(path: Path) -> str | None:
    try:
        return sha256(path.read_bytes())
    except OSError:
        return None


# --------------------------------------------------------------------------- manifest


def load_manifest(workdir: Path) -> dict:
    path = Path(workdir) / MANIFEST
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {"version": 1, "units": {}, "solutions_shown": {}}
    except (OSError, ValueError) as exc:
        raise WorkspaceError(f"{path} is unreadable ({exc})",
                             f"delete {path}; your notebooks stay, updates are then offered "
                             "beside them") from None
    data.setdefault("units", {})
    data.setdefault("solutions_shown", {})
    return data


def save_manifest(workdir: Path, manifest: dict) -> None:
    path = Path(workdir) / MANIFEST
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    os.replace(tmp, path)


# --------------------------------------------------------------------------- sync


@dataclass
class SyncResult:
    """What :func:`sync` did, one list of file names per outcome."""

    workdir: Path
    added: list[str] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    offered: list[tuple[str, str]] = field(default_factory=list)  # (learner's copy, new version)
    unchanged: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = []
        if self.added:
            out.append(f"added {', '.join(self.added)}")
        if self.restored:
            out.append(f"restored (you had deleted them) {', '.join(self.restored)}")
        if self.replaced:
            out.append(f"updated (you had not saved them yet) {', '.join(self.replaced)}")
        for mine, new in self.offered:
            out.append(f"the course changed {mine}; your copy is kept, the new version is {new}")
        if self.unchanged and not out:
            out.append(f"{len(self.unchanged)} units, all up to date")
        return out


def _offer_name(workdir: Path, name: str, ours: str | None) -> str:
    """``NN_x.updated.ipynb``, or ``NN_x.updated-2.ipynb``... if the learner edited that one."""
    stem = name[: -len(".ipynb")]
    n = 1
    while True:
        candidate = f"{stem}{UPDATED_SUFFIX}{'' if n == 1 else f'-{n}'}.ipynb"
        sha = _file_sha(workdir / candidate)
        if sha is None or sha == ours:
            return candidate
        n += 1


def sync(workdir: str | os.PathLike[str], sources: list[Path] | None = None) -> SyncResult:
    """Bring the working folder up to date with the course without touching the learner's work."""
    workdir = Path(workdir).expanduser()
    workdir.mkdir(parents=True, exist_ok=True)
    manifest = load_manifest(workdir)
    result = SyncResult(workdir)
    sources = list(sources if sources is not None else lessons.source_notebooks())
    for src, learner in zip(sources, learner_versions(sources), strict=True):
        name = src.name
        release = notebook_bytes(learner)
        release_sha = sha256(release)
        entry = manifest["units"].get(name)
        dest = workdir / name
        copy_sha = _file_sha(dest)
        record = {"release_sha256": release_sha, "written_sha256": sha256(release),
                  "source_sha256": sha256(src.read_bytes()), "written_at": time.time()}
        if copy_sha is None:
            dest.write_bytes(release)
            (result.restored if entry else result.added).append(name)
            manifest["units"][name] = record
        elif entry is None:
            # A file we did not write (or a lost manifest): adopt it, never overwrite it.
            same = copy_sha == release_sha
            manifest["units"][name] = {**record, "written_sha256": release_sha if same else None,
                                       "release_sha256": release_sha if same else None}
            if not same:
                new = _offer_name(workdir, name, None)
                (workdir / new).write_bytes(release)
                manifest["units"][name]["offered"] = {**record, "file": new}
                result.offered.append((name, new))
            else:
                result.unchanged.append(name)
        elif entry.get("release_sha256") == release_sha:
            result.unchanged.append(name)
        elif copy_sha == entry.get("written_sha256"):
            dest.write_bytes(release)
            result.replaced.append(name)
            manifest["units"][name] = record
        elif entry.get("offered", {}).get("release_sha256") == release_sha:
            result.unchanged.append(name)  # offered before (kept or deleted: the learner chose)
        else:
            ours = entry.get("offered", {}).get("written_sha256")
            new = _offer_name(workdir, name, ours)
            (workdir / new).write_bytes(release)
            entry["offered"] = {**record, "file": new}
            result.offered.append((name, new))
    save_manifest(workdir, manifest)
    return result


# --------------------------------------------------------------------------- units and tests


def unit_copies(workdir: str | os.PathLike[str]) -> list[Path]:
    """The learner's copies in unit order (``NN_name.ipynb``; offered updates not included)."""
    return sorted(p for p in Path(workdir).glob("*.ipynb") if _UNIT_RE.match(p.name))


def find_unit(workdir: str | os.PathLike[str], unit: str) -> Path:
    """The copy of ``unit``: a number (``3``, ``03``), a file name or its stem."""
    copies = unit_copies(workdir)
    key = unit.strip().removesuffix(".ipynb")
    for p in copies:
        number = _UNIT_RE.match(p.name).group(1)
        if key in (p.stem, p.name) or (key.isdigit() and int(key) == int(number)):
            return p
    have = ", ".join(p.stem for p in copies) or "none"
    raise WorkspaceError(f"no unit {unit!r} in {workdir} (units: {have})",
                         "give the unit's number, e.g. `course solution 3 ex1`, or run "
                         "`course lab` once to create the working folder")


def exercises(nb: NotebookNode) -> dict[str, dict[str, list[int]]]:
    """``{"ex1": {"solution": [cell indices], "tests": [cell indices]}}`` in notebook order,
    paired by each cell's ``metadata.course.exercise`` (:func:`.notebook_cells.exercise_cells`)."""
    return notebook_cells.exercise_cells(nb.cells)


def exercise_named(nb: NotebookNode, name: str) -> str:
    """The exercise a learner names: an exercise (``ex2``) or one of its cells' grade_ids
    (``ex2-test-bytes``); ``name`` itself when neither is found (the caller says so)."""
    name = name.strip()
    if name in exercises(nb):
        return name
    cell = notebook_cells.find_cell(nb.cells, name)
    return (notebook_cells.exercise(cell) if cell is not None else "") or name


def _has_error(cell: NotebookNode) -> bool:
    return any(o.get("output_type") == "error" for o in cell.get("outputs", []))


def test_state(cell: NotebookNode) -> str:
    """A visible test cell as saved: ``passed`` (ran, no error), ``failed`` or ``not run``."""
    if _has_error(cell):
        return "failed"
    if cell.get("execution_count") is not None:
        return "passed"
    return "not run"


def attempted(cell: NotebookNode) -> bool:
    """The saved cell shows it ran: an execution count or any output."""
    return cell.get("execution_count") is not None or bool(cell.get("outputs"))


@dataclass
class UnitStatus:
    """How a learner's copy stands, from its saved outputs."""

    file: str
    tests: dict[str, str]  # grade_id -> passed / failed / not run

    @property
    def passed(self) -> int:
        return sum(s == "passed" for s in self.tests.values())

    @property
    def failed(self) -> list[str]:
        return [g for g, s in self.tests.items() if s == "failed"]

    def summary(self) -> str:
        n = len(self.tests)
        if n == 0:
            return "no graded tests"
        if self.passed == n:
            return f"passes its visible tests ({n} of {n})"
        if self.passed == 0 and not self.failed:
            return "not run yet"
        text = f"{self.passed} of {n} visible tests pass"
        if self.failed:
            text += f"; failing: {', '.join(self.failed)}"
        return text


def unit_status(path: str | os.PathLike[str]) -> UnitStatus:
    """The visible tests' states in the saved copy ``path``."""
    nb = lessons.read(path)
    return UnitStatus(Path(path).name, {notebook_cells.grade_id(c): test_state(c)
                                        for c in nb.cells if notebook_cells.is_test_cell(c)})


# --------------------------------------------------------------------------- solutions


_SOLUTION_RE = re.compile(r"### BEGIN SOLUTION\n(.*?)[ \t]*### END SOLUTION", re.S)


def solution_text(source: NotebookNode, exercise: str) -> str:
    """The instructor's solution of ``exercise``: each solution cell's region, dedented."""
    import textwrap

    parts = []
    for cell in source.cells:
        gid = notebook_cells.grade_id(cell)
        if notebook_cells.is_solution_cell(cell) and notebook_cells.exercise(cell) == exercise:
            for m in _SOLUTION_RE.finditer(cell.source):
                parts.append(f"# {gid}\n{textwrap.dedent(m.group(1)).rstrip()}")
    return "\n\n".join(parts)


def _with_exercises(mine: NotebookNode, src: Path) -> NotebookNode:
    """``mine``, its cells named by exercise from the course's ``src`` when it is a copy saved
    before cells carried ``metadata.course`` (grade_ids are the same in both)."""
    if exercises(mine):
        return mine
    named = {notebook_cells.grade_id(c): notebook_cells.course_meta(c)
             for c in lessons.read(src).cells if notebook_cells.exercise(c)}
    for cell in mine.cells:
        if notebook_cells.grade_id(cell) in named:
            cell.metadata["course"] = named[notebook_cells.grade_id(cell)]
    return mine


def reveal_solution(workdir: str | os.PathLike[str], unit: str, exercise: str,
                    source_dir: Path | None = None) -> str:
    """One exercise's solution, once its visible test ran in the learner's saved copy.

    Records the reveal in the manifest (the course home lists it).
    """
    workdir = Path(workdir).expanduser()
    path = find_unit(workdir, unit)
    src = (source_dir or lessons.NOTEBOOK_DIR) / path.name
    if not src.is_file():  # a workshop's learners' environment carries no source
        raise WorkspaceError(
            f"this installation of the course carries no solutions ({src} is not here)",
            "in a workshop, solutions come from your instructor: ask them")
    mine = _with_exercises(lessons.read(path), src)
    exercise = exercise_named(mine, exercise)
    found = exercises(mine)
    if exercise not in found or not found[exercise]["tests"]:
        have = ", ".join(k for k, v in found.items() if v["tests"]) or "none"
        raise WorkspaceError(f"{path.name} has no exercise {exercise!r} (exercises: {have})",
                             f"`course solution {unit} ex1` names the exercise by its number")
    tests = [mine.cells[i] for i in found[exercise]["tests"]]
    if not any(attempted(c) for c in tests):
        ids = ", ".join(notebook_cells.grade_id(c) for c in tests)
        raise WorkspaceError(
            f"the visible test of {exercise} in {path.name} ({ids}) has not been run in the "
            "saved notebook",
            "try it first: run the exercise's test cell, save the notebook (Ctrl-S), "
            "then ask again")
    text = solution_text(lessons.read(src), exercise)
    if not text:
        raise WorkspaceError(f"the course has no solution for {exercise} of {path.name}",
                             "ask the instructor")
    manifest = load_manifest(workdir)
    shown = manifest["solutions_shown"].setdefault(path.name, [])
    if exercise not in shown:
        shown.append(exercise)
        save_manifest(workdir, manifest)
    return text
