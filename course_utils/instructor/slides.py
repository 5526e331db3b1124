"""``course slides``: reveal.js decks of the lessons, built by nbconvert, usable offline.

Slide structure comes from each notebook's own ``slideshow`` metadata when it has any; else
:func:`assign_slide_metadata` derives it from the notebook's structure (in memory), the same
function ``course slides --write-metadata`` uses to store it in the notebooks:

* the first markdown cell is the **title slide** (its first heading alone; the rest follows as a
  sub-slide in the deck);
* every ``##`` heading starts a **slide**, every ``###`` heading a **sub-slide**;
* the cells after a heading continue its slide (code appears as a **fragment**) until about
  :data:`LINES_PER_SLIDE` lines are on it; then a **sub-slide** starts;
* a cell that draws a **figure** (it has an image output, or calls ``viz.``/``plt.``/``show(``)
  gets a sub-slide of its own;
* the instructions of an exercise (the markdown before a solution cell) are a **"Your turn"**
  slide;
* solution cells, test cells and setup/teardown code are **skip**.

Decks never contain solution cells, test cells (with their hidden tests) or any line of a
solution region: :func:`deck_notebook` drops them whatever the metadata says, and
:func:`build_decks` checks the result against the source's solution and hidden-test lines.
The reveal.js files come from the ``sphinx-revealjs`` package (reveal.js 5, MIT licence) and are
copied next to the decks; no page loads anything from a network.
"""

from __future__ import annotations

import copy
import html
import importlib.util
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import nbformat
from nbformat import NotebookNode

from ..assignments.release import lesson_notebooks, secret_lines, unit_of
from ..errors import CourseError
from ..notebook_cells import is_teardown, nbgrader_meta
from ..settings import course_root

SLIDES_DIR = course_root() / "slides"
TEMPLATES = Path(__file__).resolve().parent / "templates"
TEMPLATE_NAME = "course_reveal"
REVEAL_DIR = "reveal.js"
THEME = "white"  # its fonts ship with reveal.js; "simple" imports Google fonts
LINES_PER_SLIDE = 16
#: Files of reveal.js a deck needs (relative to the package's reveal.js folder).
REVEAL_FILES = ("LICENSE", "dist/reveal.css", "dist/reveal.js", f"dist/theme/{THEME}.css",
                "dist/theme/fonts/source-sans-pro", "plugin/notes")

_FIGURE_RE = re.compile(r"\bviz\.\w+\(|\bplt\.|\bshow\(|\.imshow\(|\.plot\(")
_HEADING_RE = re.compile(r"^(#{1,6})\s+(.+?)\s*$", re.M)
_REGION_RE = re.compile(r"[ \t]*### BEGIN (SOLUTION|HIDDEN TESTS)\n.*?### END \1[^\n]*\n?", re.S)


class SlidesError(CourseError):
    """A deck could not be built, or would show solution text."""


# ---- structure -------------------------------------------------------------------------------
def _role(cell: NotebookNode) -> str:
    m = nbgrader_meta(cell)
    if m.get("solution"):
        return "solution"
    if m.get("grade"):
        return "test"
    gid = m.get("grade_id", "")
    if is_teardown(cell) or (cell.cell_type == "code" and re.search(r"(^|-)setup(-|$)", gid)):
        return "plumbing"
    return "lesson"


def _heading_level(cell: NotebookNode) -> int:
    if cell.cell_type != "markdown":
        return 0
    first = cell.source.lstrip().splitlines()[0] if cell.source.strip() else ""
    m = re.match(r"^(#{1,6})\s", first)
    return len(m.group(1)) if m else 0


def _lines(cell: NotebookNode) -> int:
    n = len(cell.source.splitlines())
    for out in cell.get("outputs", []):
        data = out.get("data", {})
        if any(k.startswith("image/") for k in data):
            n += 14
        else:
            text = out.get("text") or data.get("text/plain") or ""
            n += min(len("".join(text).splitlines()), 12)
    return n


def is_figure(cell: NotebookNode) -> bool:
    """A code cell that draws a figure: an image output, or a plotting call in its source."""
    if cell.cell_type != "code":
        return False
    if any(k.startswith("image/") for o in cell.get("outputs", []) for k in o.get("data", {})):
        return True
    return bool(_FIGURE_RE.search(cell.source))


def exercise_intros(nb: NotebookNode) -> set[int]:
    """Indices of the markdown cells that introduce an exercise (the last markdown cell before
    each solution cell)."""
    out = set()
    for i, cell in enumerate(nb.cells):
        if _role(cell) == "solution":
            j = i - 1
            while j >= 0 and nb.cells[j].cell_type != "markdown":
                j -= 1
            if j >= 0:
                out.add(j)
    return out


def assign_slide_metadata(nb: NotebookNode) -> NotebookNode:
    """Give every cell ``metadata.slideshow.slide_type`` from the notebook's structure (see the
    module doc). Deterministic; replaces any slide types already there. Returns ``nb``."""
    first_md = next((i for i, c in enumerate(nb.cells) if c.cell_type == "markdown"), None)
    intros = exercise_intros(nb)
    used = 0
    for i, cell in enumerate(nb.cells):
        role, level, lines = _role(cell), _heading_level(cell), _lines(cell)
        if role in ("solution", "test", "plumbing"):
            kind = "skip"
        elif i == first_md or level in (1, 2) or i in intros:
            kind, used = "slide", lines
        elif level >= 3 or is_figure(cell) or used + lines > LINES_PER_SLIDE:
            kind, used = "subslide", lines
        else:
            kind = "fragment" if cell.cell_type == "code" else "-"
            used += lines
        cell.metadata["slideshow"] = {"slide_type": kind}
    return nb


def slide_types(nb: NotebookNode) -> list[str]:
    return [c.get("metadata", {}).get("slideshow", {}).get("slide_type", "-") for c in nb.cells]


def deck_notebook(nb: NotebookNode) -> NotebookNode:
    """The notebook as a deck shows it: slide metadata (the notebook's own, else derived),
    solution, test and skipped cells removed, any solution or hidden-test region cut, the
    title on a slide of its own, exercises headed "Your turn"."""
    nb = copy.deepcopy(nb)
    if not any(c.get("metadata", {}).get("slideshow") for c in nb.cells):
        assign_slide_metadata(nb)
    intros = exercise_intros(nb)
    cells = []
    for i, cell in enumerate(nb.cells):
        kind = cell.get("metadata", {}).get("slideshow", {}).get("slide_type", "-")
        if _role(cell) in ("solution", "test") or kind == "skip":
            continue
        cell.source = _REGION_RE.sub("", cell.source)
        if i in intros:
            cell.source = _your_turn(cell.source)
            cell.metadata["slideshow"] = {"slide_type": "slide"}
        cells.append(cell)
    if cells and cells[0].cell_type == "markdown":
        cells[0:1] = _split_title(cells[0])
    nb.cells = cells
    return nb


def _your_turn(source: str) -> str:
    m = _HEADING_RE.search(source)
    if m and source[: m.start()].strip() == "":
        title = re.sub(r"^Exercise\b", "Exercise", m.group(2))
        return source[: m.start()] + f"{m.group(1)} Your turn: {title}" + source[m.end():]
    return "## Your turn\n\n" + source


def _split_title(cell: NotebookNode) -> list[NotebookNode]:
    """The first cell's first heading alone on the title slide; the rest on a sub-slide."""
    m = _HEADING_RE.search(cell.source)
    if not m:
        return [cell]
    rest = cell.source[m.end():].strip()
    title = copy.deepcopy(cell)
    title.source = cell.source[: m.end()].strip()
    title.metadata["slideshow"] = {"slide_type": "slide"}
    if not rest:
        return [title]
    body = copy.deepcopy(cell)
    if "id" in cell:
        body["id"] = f"{cell['id']}-more"[:64]
    body.source = rest
    body.metadata["slideshow"] = {"slide_type": "subslide"}
    return [title, body]


# ---- text checks -----------------------------------------------------------------------------
class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag in ("script", "style"):
            self._skip += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style") and self._skip:
            self._skip -= 1

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.parts.append(data)


def html_text(page: str) -> str:
    """The visible text of an HTML page (scripts and styles left out)."""
    p = _Text()
    p.feed(page)
    return html.unescape("".join(p.parts))


def leaked_in_html(source: NotebookNode, page: str) -> list[str]:
    """Solution or hidden-test lines of ``source`` that appear as a line of the page's text."""
    lines = {ln.strip() for ln in html_text(page).splitlines()}
    found = [s for s in secret_lines(source) if s in lines]
    found += [m for m in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS",
                          "END HIDDEN TESTS") if m in page]
    return found


def count_slides(page: str) -> int:
    """Slides (horizontal and vertical) in a reveal.js page: innermost ``<section>`` elements."""
    opens = [m.start() for m in re.finditer(r"<section\b", page)]
    count = 0
    for k, pos in enumerate(opens):
        nxt = opens[k + 1] if k + 1 < len(opens) else len(page)
        # A section that contains another section is only a stack of vertical slides.
        if "</section>" in page[pos:nxt] or k + 1 == len(opens):
            count += 1
    return count


# ---- building --------------------------------------------------------------------------------
def reveal_source() -> Path:
    """The reveal.js folder of the installed ``sphinx-revealjs`` package."""
    spec = importlib.util.find_spec("sphinx_revealjs")
    if spec is None or not spec.submodule_search_locations:
        raise SlidesError("the package sphinx-revealjs (which ships reveal.js) is not installed",
                          "pip install -e '.[test]' (or: pip install sphinx-revealjs)")
    folder = Path(list(spec.submodule_search_locations)[0]) / "_static" / "revealjs"
    if not (folder / "dist" / "reveal.js").exists():
        raise SlidesError(f"no reveal.js in {folder}",
                          "reinstall sphinx-revealjs (pip install --force-reinstall ...)")
    return folder


def copy_reveal(outdir: Path) -> Path:
    """Copy the reveal.js files a deck needs (with reveal.js's licence) to ``outdir/reveal.js``."""
    src, dest = reveal_source(), Path(outdir) / REVEAL_DIR
    for rel in REVEAL_FILES:
        s, d = src / rel, dest / rel
        d.parent.mkdir(parents=True, exist_ok=True)
        if s.is_dir():
            shutil.copytree(s, d, dirs_exist_ok=True)
        else:
            shutil.copyfile(s, d)
    return dest


@dataclass
class Deck:
    unit: int
    notebook: Path
    html: Path
    slides: int
    used_notebook_metadata: bool


def exporter():  # noqa: ANN201 - nbconvert SlidesExporter
    from nbconvert import SlidesExporter
    from traitlets.config import Config

    c = Config()
    c.SlidesExporter.template_name = TEMPLATE_NAME
    c.SlidesExporter.extra_template_basedirs = [str(TEMPLATES)]
    c.SlidesExporter.reveal_url_prefix = REVEAL_DIR
    c.SlidesExporter.reveal_theme = THEME
    c.SlidesExporter.reveal_number = "c/t"
    c.SlidesExporter.reveal_width = "1280"
    c.SlidesExporter.reveal_height = "800"
    c.SlidesExporter.exclude_input_prompt = True
    c.SlidesExporter.exclude_output_prompt = True
    c.SlidesExporter.anchor_link_text = ""  # a "¶" after every heading means nothing on a slide
    return SlidesExporter(config=c)


def build_deck(path: str | Path, outdir: str | Path = SLIDES_DIR,
               nb: NotebookNode | None = None) -> Deck:
    """Build ``outdir/<notebook stem>.slides.html`` from the lesson notebook ``path`` (or from
    ``nb``, e.g. an executed copy of it); refuse to write a deck that shows solution text."""
    path, outdir = Path(path), Path(outdir)
    source = nbformat.read(str(path), as_version=4)
    nb = source if nb is None else nb
    had_meta = any(c.get("metadata", {}).get("slideshow") for c in nb.cells)
    deck = deck_notebook(nb)
    title = nb.metadata.get("course", {}).get("title") or path.stem
    body, _ = exporter().from_notebook_node(deck, resources={"metadata": {"name": title}})
    leaks = leaked_in_html(source, body)
    if leaks:
        raise SlidesError(f"the deck of {path.name} would show solution or hidden-test text: "
                          f"{leaks[0]!r}", "keep solution code inside the solution markers")
    outdir.mkdir(parents=True, exist_ok=True)
    out = outdir / f"{path.stem}.slides.html"
    out.write_text(body)
    return Deck(unit_of(path), path, out, count_slides(body), had_meta)


def build_decks(units: list[int] | None = None, outdir: str | Path = SLIDES_DIR,
                notebook_dir: str | Path | None = None, execute: bool = False,
                cell_timeout: int = 300,
                progress: Callable[[str], None] | None = print) -> list[Deck]:
    """One deck per lesson notebook (or per unit in ``units``) in ``outdir``, plus reveal.js.

    ``execute=True`` first runs each notebook (solutions in, on a fresh cluster) so the decks
    show real outputs and figures; by default decks show the stored notebooks, which are kept
    without outputs.
    """
    say = progress or (lambda _msg: None)
    outdir = Path(outdir)
    copy_reveal(outdir)
    decks = []
    for path in lesson_notebooks(units, Path(notebook_dir) if notebook_dir else None):
        nb = execute_notebook(path, cell_timeout) if execute else None
        d = build_deck(path, outdir, nb)
        decks.append(d)
        how = "notebook's slide metadata" if d.used_notebook_metadata else "derived structure"
        say(f"unit {d.unit}: {d.html} ({d.slides} slides, {how})")
    return decks


def execute_notebook(path: Path, cell_timeout: int = 300) -> NotebookNode:
    """Run a lesson notebook top to bottom on a fresh cluster (errors recorded, not raised)."""
    import tempfile

    from nbclient import NotebookClient

    from .grading_cluster import GradingCluster

    nb = nbformat.read(str(path), as_version=4)
    with GradingCluster() as gc, tempfile.TemporaryDirectory(prefix="course-slides-") as tmp:
        gc.restart()
        NotebookClient(nb, timeout=cell_timeout, kernel_name="python3", allow_errors=True,
                       resources={"metadata": {"path": tmp}}).execute()
    return nb


def write_metadata(units: list[int] | None = None, notebook_dir: str | Path | None = None,
                   progress: Callable[[str], None] | None = print) -> list[Path]:
    """Store in the lesson notebooks themselves what the instructor's tools read: the slide
    types of :func:`assign_slide_metadata` (cell metadata), and the unit's time, objectives and
    prerequisites parsed from its intro plus the course's kernel (notebook metadata), which the
    course home and a learner's JupyterLab use. Sources and outputs are never changed."""
    from ..learner.home import set_unit_metadata
    from ..learner.kernelspec import set_kernelspec

    say = progress or (lambda _msg: None)
    written = []
    for path in lesson_notebooks(units, Path(notebook_dir) if notebook_dir else None):
        nb = nbformat.read(str(path), as_version=4)
        before = nbformat.writes(nb)
        assign_slide_metadata(nb)
        course = nb.metadata.get("course", {})
        for key in ("minutes", "objectives", "prerequisites"):  # re-read from the prose
            course.pop(key, None)
        set_unit_metadata(nb, path.name)
        set_kernelspec(nb)
        if nbformat.writes(nb) != before:
            nbformat.write(nb, str(path))
            written.append(path)
        after = slide_types(nb)
        counts = {k: after.count(k) for k in ("slide", "subslide", "fragment", "skip")}
        say(f"{path.name}: {counts}" + ("" if path in written else " (unchanged)"))
    return written
