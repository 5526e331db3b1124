"""``course release``: the student version of every unit, as an nbgrader course folder.

Nothing here re-implements nbgrader: the folder is laid out the way nbgrader expects
(``source/``, ``release/``, ``submitted/``, ``autograded/``, ``feedback/``, ``nbgrader_config.py``,
``gradebook.db``) and ``nbgrader generate_assignment`` itself makes each release (its
``ClearSolutions``, ``ClearHiddenTests``, ``ClearOutput``, ``LockCells`` and checksums). We add
one small preprocessor, :class:`StubHints`, so a learner's stub says which exercise it is. An
instructor who runs nbgrader or formgrader can ``cd`` into the folder and carry on.

Each unit is one nbgrader assignment, ``unit<N>``, holding the unit's notebook.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import tempfile
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbformat import NotebookNode

from ..errors import CourseError
from ..notebook_cells import grade_id, is_solution_cell, is_test_cell, nbgrader_meta
from ..settings import ENV_CACHE, env
from .lessons import NOTEBOOK_DIR, source_notebooks

COURSE_ID = "dist-training"
FOLDERS = ("source", "release", "submitted", "autograded", "feedback")
STUB = "raise NotImplementedError()"
#: Per-cell time limit for executing notebooks (nbgrader's own default of 30 s is too short for
#: process-group start-up and the training cells of units 3-5).
CELL_TIMEOUT = 300
#: A whole notebook may take at most this long when graded; a hang costs no more.
NOTEBOOK_TIMEOUT = 1200

_UNIT_RE = re.compile(r"^(\d+)_")
_SOLUTION_RE = re.compile(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", re.S)
_HIDDEN_RE = re.compile(r"### BEGIN HIDDEN TESTS\n(.*?)### END HIDDEN TESTS", re.S)


class ReleaseError(CourseError):
    """A release could not be made, or would leak a solution or hidden test."""


def unit_of(path: str | Path) -> int:
    """The unit number of a notebook file (``03_pytorch_ddp.ipynb`` -> 3)."""
    m = _UNIT_RE.match(Path(path).name)
    if not m:
        raise ReleaseError(f"{Path(path).name} does not start with a unit number",
                           "name lesson notebooks NN_topic.ipynb")
    return int(m.group(1))


def assignment_id(path: str | Path) -> str:
    """nbgrader assignment name of a lesson notebook: ``unit<N>``."""
    return f"unit{unit_of(path)}"


def lesson_notebooks(units: list[int] | None = None,
                     notebook_dir: Path | None = None) -> list[Path]:
    """The lesson notebooks (optionally only ``units``), in unit order."""
    paths = source_notebooks() if notebook_dir is None else sorted(
        p for p in Path(notebook_dir).glob("*.ipynb") if _UNIT_RE.match(p.name))
    paths = [p for p in paths if _UNIT_RE.match(p.name)]
    if units is not None:
        missing = sorted(set(units) - {unit_of(p) for p in paths})
        if missing:
            have = ", ".join(str(unit_of(p)) for p in paths)
            raise ReleaseError(f"no notebook for unit(s) {missing}", f"choose from: {have}")
        paths = [p for p in paths if unit_of(p) in units]
    return paths


# ---- nbgrader configuration ------------------------------------------------------------------
CONFIG_TEMPLATE = '''\
"""nbgrader configuration written by `course release` (safe to edit).

`nbgrader generate_assignment`, `autograde`, `generate_feedback` and formgrader, run from this
folder, behave as the `course` command does. Needs the course package importable
(`pip install -e .` of the course repository).
"""
import os

from course_utils.assignments import nbgrader_setup

c = get_config()  # noqa: F821
c.CourseDirectory.course_id = {course_id!r}
nbgrader_setup.configure(c, root=os.path.dirname(os.path.abspath(__file__)),
                         cell_timeout={cell_timeout}, notebook_timeout={notebook_timeout})
'''


def write_config(root: Path, course_id: str = COURSE_ID, cell_timeout: int = CELL_TIMEOUT,
                 notebook_timeout: int = NOTEBOOK_TIMEOUT) -> Path:
    """Write ``root/nbgrader_config.py`` (see :mod:`course_utils.assignments.nbgrader_setup`)."""
    path = Path(root) / "nbgrader_config.py"
    path.write_text(CONFIG_TEMPLATE.format(course_id=course_id, cell_timeout=cell_timeout,
                                           notebook_timeout=notebook_timeout))
    return path


#: The set-up module's earlier home: a config written before it moved imports it from there.
_OLD_IMPORT = "from course_utils.instructor import nbgrader_setup"


def update_config(root: Path) -> None:
    """Point an existing ``nbgrader_config.py`` at :mod:`.nbgrader_setup`'s present module,
    keeping the instructor's edits (course folders and the learner's cache outlive a move)."""
    path = Path(root) / "nbgrader_config.py"
    text = path.read_text()
    if _OLD_IMPORT in text:
        path.write_text(text.replace(_OLD_IMPORT, "from course_utils.assignments import "
                                                  "nbgrader_setup"))


def load_config(root: str | Path):  # noqa: ANN201 - traitlets Config
    """The traitlets config of the course folder ``root`` (its ``nbgrader_config.py``)."""
    from traitlets.config.loader import Config, PyFileConfigLoader

    root = Path(root).resolve()
    cfg = Config()
    if (root / "nbgrader_config.py").exists():
        cfg.merge(PyFileConfigLoader("nbgrader_config.py", path=str(root)).load_config())
    cfg.CourseDirectory.root = str(root)
    return cfg


def course_directory(root: str | Path):  # noqa: ANN201 - nbgrader CourseDirectory
    from nbgrader.coursedir import CourseDirectory

    return CourseDirectory(config=load_config(root))


def run_app(app) -> dict:  # noqa: ANN001 - an nbgrader converter
    """``app.start()`` with nbgrader's log captured: ``{"success", "log", "error"?}``."""
    from nbgrader.utils import capture_log

    return capture_log(app)


# ---- release ---------------------------------------------------------------------------------
@dataclass
class UnitRelease:
    unit: int
    assignment: str
    source: Path
    release: Path
    exercises: list[str]
    tests: dict[str, float]  # autograded test cells: grade_id -> points
    seconds: float
    answers: dict[str, float] = field(default_factory=dict)  # written answers, graded by hand

    @property
    def points(self) -> float:
        return sum(self.tests.values()) + sum(self.answers.values())


@dataclass
class Release:
    root: Path
    units: list[UnitRelease] = field(default_factory=list)

    def table(self) -> str:
        lines = [f"{'unit':<5} {'assignment':<11} {'tests':>5} {'by hand':>7} {'points':>6}  "
                 "release"]
        for u in self.units:
            lines.append(f"{u.unit:<5} {u.assignment:<11} {len(u.tests):>5} {len(u.answers):>7} "
                         f"{u.points:>6g}  {u.release.relative_to(self.root)}")
        return "\n".join(lines)


def release(outdir: str | Path, units: list[int] | None = None,
            notebook_dir: str | Path | None = None, course_id: str = COURSE_ID,
            cell_timeout: int = CELL_TIMEOUT,
            notebook_timeout: int = NOTEBOOK_TIMEOUT) -> Release:
    """Make (or refresh) the nbgrader course folder ``outdir`` with the student version of each
    unit. Every release is checked for leaked solution or hidden-test text before it is kept.

    Runs ``nbgrader generate_assignment`` per unit; submissions, grades and feedback already in
    ``outdir`` are kept.
    """
    from nbgrader.converters import GenerateAssignment

    root = Path(outdir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    for name in FOLDERS:
        (root / name).mkdir(exist_ok=True)
    if not (root / "nbgrader_config.py").exists():
        write_config(root, course_id, cell_timeout, notebook_timeout)
    else:
        update_config(root)
    paths = lesson_notebooks(units, Path(notebook_dir) if notebook_dir else None)
    if not paths:
        raise ReleaseError(f"no lesson notebooks in {notebook_dir or NOTEBOOK_DIR}",
                           "point --notebooks at the folder with NN_topic.ipynb files")
    out = Release(root)
    for path in paths:
        t0 = time.perf_counter()
        aid = assignment_id(path)
        src_dir = root / "source" / aid
        src_dir.mkdir(parents=True, exist_ok=True)
        src = src_dir / path.name
        shutil.copyfile(path, src)
        coursedir = course_directory(root)
        coursedir.assignment_id = aid
        app = GenerateAssignment(coursedir=coursedir, config=coursedir.config)
        app.force = True
        app.create_assignment = True
        result = run_app(app)
        rel = root / "release" / aid / path.name
        if not result["success"] or not rel.exists():
            raise ReleaseError(
                f"nbgrader generate_assignment failed for {aid} ({path.name}):\n"
                + _tail(result.get("error", "") or result.get("log", "")),
                "read nbgrader's message above; a solution region outside a cell marked "
                "'solution' in its nbgrader metadata is the usual cause")
        source_nb, release_nb = read_nb(src), read_nb(rel)
        leaks = leaked_lines(source_nb, release_nb)
        if leaks:
            rel.unlink()
            raise ReleaseError(
                f"the release of {path.name} still contains {len(leaks)} line(s) of solution "
                f"or hidden-test text, e.g. {leaks[0]!r}",
                "put that code between ### BEGIN/END SOLUTION (or HIDDEN TESTS) markers, or "
                "do not repeat it outside them")
        out.units.append(UnitRelease(
            unit=unit_of(path), assignment=aid, source=src, release=rel,
            exercises=[grade_id(c) for c in source_nb.cells
                       if is_solution_cell(c)],
            tests={grade_id(c): float(nbgrader_meta(c).get("points", 0))
                   for c in source_nb.cells if is_test_cell(c)},
            answers={grade_id(c): float(nbgrader_meta(c).get("points", 0))
                     for c in source_nb.cells
                     if nbgrader_meta(c).get("grade") and is_solution_cell(c)},
            seconds=time.perf_counter() - t0))
    close_instructor_parts(root)
    return out


#: What of a course folder is the instructor's alone: every solution and hidden test, the
#: grades, the submissions and their feedback. (``release/`` stays readable: a workshop's hub
#: copies it as each learner.)
INSTRUCTOR_PARTS = ("source", "gradebook.db", "submitted", "autograded", "feedback")


def close_instructor_parts(root: Path) -> None:
    """Close :data:`INSTRUCTOR_PARTS` of ``root`` to group and others (the owner keeps their
    rights); others may still pass through ``root`` to reach ``release/``."""
    root.chmod(root.stat().st_mode & ~0o077 | 0o711)
    for name in INSTRUCTOR_PARTS:
        top = root / name
        if not top.exists():
            continue
        paths = [top] + ([Path(d) / n for d, dirs, files in os.walk(top)
                          for n in dirs + files] if top.is_dir() else [])
        for path in paths:
            if not path.is_symlink():
                path.chmod(path.stat().st_mode & ~0o077)


def _tail(text: str, n: int = 1500) -> str:
    return text[-n:] if text else "(no output)"


def read_nb(path: str | Path) -> NotebookNode:
    return nbformat.read(str(path), as_version=4)


# ---- the learner's copy: a release, cached ----------------------------------------------------
LOCK_TIMEOUT = 120.0


def cache_dir() -> Path:
    """Where released student notebooks are cached: ``$COURSE_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/dist-training-course`` (``~/.cache/dist-training-course``)."""
    cached = env(ENV_CACHE)
    if cached:
        return Path(cached).expanduser()
    base = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(base) if base else Path.home() / ".cache") / "dist-training-course"


def _release_code_key() -> bytes:
    """What else decides a release's bytes: nbgrader's version and our release code."""
    import nbgrader

    here = Path(__file__).resolve().parent
    h = hashlib.sha256(str(nbgrader.__version__).encode())
    for name in ("release.py", "nbgrader_setup.py"):
        h.update((here / name).read_bytes())
    return h.digest()


@contextlib.contextmanager
def _locked(path: Path, timeout: float = LOCK_TIMEOUT) -> Iterator[None]:
    """An exclusive file lock (two ``course lab`` starts share one cache), bounded wait."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise ReleaseError(f"{path} stayed locked for {timeout:.0f} s (another "
                                       "`course lab` making student notebooks?)",
                                       f"wait for it, or delete {path.parent}") from None
                time.sleep(0.1)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def student_notebook(source: str | Path, cache: str | Path | None = None) -> NotebookNode:
    """The student version of one lesson notebook, exactly as ``course release`` hands it out
    (:func:`release`: nbgrader's stubs with our hints, hidden tests removed, outputs cleared,
    cells locked, checksums kept). ``course lab`` (unit 0 onwards) gives learners this copy.

    Cached (see :func:`student_notebooks`), so only a changed unit costs a release.
    """
    return student_notebooks([Path(source)], cache)[0]


def student_notebooks(sources: list[Path], cache: str | Path | None = None
                      ) -> list[NotebookNode]:
    """:func:`student_notebook` of each source, the missing ones released in one go.

    Cached in ``cache`` (default :func:`cache_dir`) by the source's name and bytes, nbgrader's
    version and this code; the cache keeps one entry per notebook name.
    """
    root = Path(cache) if cache is not None else cache_dir()
    folder = root / "student"
    code = _release_code_key()
    datas = [Path(s).read_bytes() for s in sources]
    keys = [hashlib.sha256(code + Path(s).name.encode() + d).hexdigest()[:24] for s, d in
            zip(sources, datas, strict=True)]
    hits = [folder / f"{Path(s).stem}-{k}.ipynb" for s, k in zip(sources, keys, strict=True)]
    if not all(h.exists() for h in hits):
        with _locked(root / "release.lock"), tempfile.TemporaryDirectory() as tmp:
            todo = {}
            for src, data, hit in zip(sources, datas, hits, strict=True):
                if not hit.exists():  # exactly the bytes hashed, one notebook per unit
                    (Path(tmp) / Path(src).name).write_bytes(data)
                    todo[unit_of(src)] = hit
            if todo:
                course = root / "course"
                for unit in todo:
                    shutil.rmtree(course / "source" / f"unit{unit}", ignore_errors=True)
                made = release(course, units=sorted(todo), notebook_dir=tmp)
                folder.mkdir(parents=True, exist_ok=True)
                for u in made.units:
                    hit = todo[u.unit]
                    for old in folder.glob(f"{u.source.stem}-*.ipynb"):
                        old.unlink()
                    part = hit.with_suffix(".part")
                    shutil.copyfile(u.release, part)
                    os.replace(part, hit)
    return [read_nb(h) for h in hits]


# ---- what must not survive -------------------------------------------------------------------
def secret_lines(source: NotebookNode, min_chars: int = 8) -> list[str]:
    """Lines of the source's solution and hidden-test regions that a release must not contain.

    Lines that also occur outside those regions (lesson code the solution repeats), and short
    or purely structural lines (``)``, ``pass``, ``else:``), are left out: they prove nothing.
    """
    regions, public = [], []
    for cell in source.cells:
        text = cell.source
        inside = [m.group(1) for rx in (_SOLUTION_RE, _HIDDEN_RE) for m in rx.finditer(text)]
        regions += inside
        for rx in (_SOLUTION_RE, _HIDDEN_RE):
            text = rx.sub("", text)
        public.append(text)
    public_lines = {ln.strip() for chunk in public for ln in chunk.splitlines()}
    out = []
    for region in regions:
        for ln in region.splitlines():
            s = ln.strip()
            if (len(s) >= min_chars and s not in public_lines and not s.startswith("#")
                    and re.search(r"[A-Za-z]{2}", s)):
                out.append(s)
    return list(dict.fromkeys(out))


def leaked_lines(source: NotebookNode, released: NotebookNode) -> list[str]:
    """Solution or hidden-test lines of ``source`` found as a line anywhere in ``released``
    (cell sources and outputs), plus any surviving BEGIN/END markers."""
    texts = []
    for cell in released.cells:
        texts.append(cell.source)
        for out in cell.get("outputs", []):
            texts += [out.get("text", ""), out.get("evalue", ""), *out.get("traceback", [])]
            texts += [v if isinstance(v, str) else "\n".join(v)
                      for k, v in out.get("data", {}).items() if k.startswith("text/")]
    lines = {ln.strip() for t in texts for ln in str(t).splitlines()}
    blob = "\n".join(texts)
    found = [s for s in secret_lines(source) if s in lines]
    found += [m for m in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS",
                          "END HIDDEN TESTS") if m in blob]
    return found


def stub_hint(heading: str, grade_id: str) -> str:
    """The message a learner's stub raises."""
    where = re.sub(r"\s*\(\d+(\.\d+)? points?\)\s*$", "", heading) or grade_id
    return textwrap.shorten(
        f"{where}: replace this line with your code (instructions above), then run the "
        f"test cell below", 200)


def bare_asserts(nb: NotebookNode) -> list[tuple[str, int, str, bool]]:
    """``assert`` statements without a message in graded test cells, as
    ``(grade_id, line number, line, in hidden tests)``: a learner who fails one sees a bare
    ``AssertionError`` with nothing about what was expected or found."""
    import ast

    out = []
    for cell in nb.cells:
        if not is_test_cell(cell):
            continue
        src = "\n".join("" if ln.lstrip().startswith("%") else ln
                        for ln in cell.source.splitlines())
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        hidden = set()
        for m in _HIDDEN_RE.finditer(cell.source):
            first = cell.source[: m.start()].count("\n") + 1
            hidden |= set(range(first, first + m.group(0).count("\n") + 1))
        lines = src.splitlines()
        for node in ast.walk(tree):
            if isinstance(node, ast.Assert) and node.msg is None:
                out.append((grade_id(cell), node.lineno,
                            lines[node.lineno - 1].strip(), node.lineno in hidden))
    return out
