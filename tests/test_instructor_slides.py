"""``course slides``: slide structure from the notebook, decks without solutions, offline, and a
real headless Chromium that shows the title slide and moves through the deck."""

from __future__ import annotations

import copy
import re
import shutil
from pathlib import Path

import nbformat
import pytest

from course_utils.assignments.release import lesson_notebooks, read_nb, secret_lines, unit_of
from course_utils.instructor import slides
from tests.rigs import browser as rig

chromium = rig.chromium
browser_screenshot_dir = rig.browser_screenshot_dir

UNITS = lesson_notebooks()
MIN_SLIDES = 8


def _md(text: str, gid: str = "") -> nbformat.NotebookNode:
    meta = {"nbgrader": {"grade_id": gid, "grade": False, "solution": False}} if gid else {}
    return nbformat.v4.new_markdown_cell(text, metadata=meta)


def _code(text: str, gid: str = "", **nbg) -> nbformat.NotebookNode:
    meta = {"nbgrader": {"grade_id": gid, "grade": False, "solution": False, **nbg}} if gid else {}
    return nbformat.v4.new_code_cell(text, metadata=meta)


def _teardown(text: str) -> nbformat.NotebookNode:
    cell = _code(text, "stop")
    cell.metadata["course"] = {"teardown": True}
    return cell


def lesson() -> nbformat.NotebookNode:
    return nbformat.v4.new_notebook(cells=[
        _md("# Unit 9 — Title\n\nIntro text.", "intro"),          # 0 title
        _md("## Setup", "setup-md"),                              # 1 slide
        _code("import course_utils as cu", "setup"),              # 2 skip (plumbing)
        _md("## An idea", "idea-md"),                             # 3 slide
        _code("x = 1\nprint(x)", "idea"),                         # 4 fragment
        _md("More words.", "idea-more"),                          # 5 continues
        _code("\n".join(f"y{i} = {i}" for i in range(20)), "long"),  # 6 too long: subslide
        _code("viz.plot_ranks(data)", "fig"),                     # 7 figure: subslide
        _md("### A detail", "detail-md"),                         # 8 subslide
        _md("Write `f`.", "ex1-md"),                              # 9 exercise intro: slide
        _code("def f():\n    ### BEGIN SOLUTION\n    return 42\n    ### END SOLUTION",
              "ex1-solution", solution=True),                     # 10 skip
        _code("assert f() == 42, f()\n### BEGIN HIDDEN TESTS\nassert f() + 1 == 43\n"
              "### END HIDDEN TESTS", "ex1-test", grade=True, points=1),  # 11 skip
        _md("## Teardown", "teardown-md"),                        # 12 slide
        _teardown("cu.stop()"),                                   # 13 skip
    ])


def test_slide_metadata_follows_the_notebook_structure():
    nb = slides.assign_slide_metadata(lesson())
    assert slides.slide_types(nb) == [
        "slide", "slide", "skip", "slide", "fragment", "-", "subslide", "subslide", "subslide",
        "slide", "skip", "skip", "slide", "skip"]
    again = slides.assign_slide_metadata(copy.deepcopy(nb))
    assert slides.slide_types(again) == slides.slide_types(nb)  # deterministic, idempotent


def test_deck_notebook_drops_solutions_and_tests_and_heads_exercises():
    deck = slides.deck_notebook(lesson())
    text = "\n".join(c.source for c in deck.cells)
    assert "return 42" not in text and "f() + 1" not in text and "assert f()" not in text
    assert "cu.stop()" not in text and "import course_utils" not in text
    assert deck.cells[0].source == "# Unit 9 — Title"  # the title alone
    assert deck.cells[1].source == "Intro text." and slides.slide_types(deck)[1] == "subslide"
    assert "## Your turn\n\nWrite `f`." in text
    assert len({c.get("id") for c in deck.cells}) == len(deck.cells)


def test_deck_notebook_keeps_the_notebooks_own_slide_metadata():
    nb = lesson()
    for c in nb.cells:
        c.metadata["slideshow"] = {"slide_type": "-"}
    nb.cells[3].metadata["slideshow"] = {"slide_type": "slide"}
    assert slides.slide_types(slides.deck_notebook(nb)).count("slide") == 3  # title, idea, ex


def test_count_slides_counts_vertical_slides_once_each():
    page = ("<section><p>a</p></section><section><section>b</section><section>c</section>"
            "</section>")
    assert slides.count_slides(page) == 3


@pytest.fixture(scope="module")
def decks(tmp_path_factory):
    out = tmp_path_factory.mktemp("slides")
    return out, slides.build_decks(outdir=out, progress=None)


@pytest.mark.parametrize("path", UNITS, ids=[p.name for p in UNITS])
def test_every_deck_has_a_title_many_slides_and_no_solution(decks, path):
    out, built = decks
    deck = next(d for d in built if d.notebook.name == path.name)
    page = deck.html.read_text()
    title = next(c for c in read_nb(path).cells if c.cell_type == "markdown").source
    title = re.match(r"#\s+(.+)", title).group(1)
    first = re.search(r"<section\b.*?</section>", page, re.S).group(0)
    assert re.search(r"<h1\b", first) and slides.html_text(first).strip().startswith(
        title.replace("`", "")[:20]), slides.html_text(first)[:200]
    assert deck.slides > MIN_SLIDES
    source = read_nb(path)
    assert secret_lines(source) and slides.leaked_in_html(source, page) == []
    text = slides.html_text(page)
    assert "Your turn" in text
    # Nothing is loaded from a network (scripts, images, stylesheets); a link to read is fine.
    loads = re.findall(r'(?:src="|<link[^>]+href=")((?:https?:)?//[^"]*)', page)
    assert not loads, f"a deck must not load from a network: {loads[:3]}"
    assert all((out / "reveal.js" / rel).exists() for rel in slides.REVEAL_FILES)
    assert "MIT" in (out / "reveal.js" / "LICENSE").read_text() or "Permission is hereby" in (
        out / "reveal.js" / "LICENSE").read_text()


def test_the_notebooks_carry_up_to_date_metadata(tmp_path):
    """Slide types, the intro's time/objectives/prerequisites and the course kernel are stored
    in the sources and match their text; else run ``course slides --write-metadata``."""
    for p in UNITS:
        shutil.copy(p, tmp_path / p.name)
    stale = slides.write_metadata(notebook_dir=tmp_path, progress=None)
    assert not stale, (f"{[p.name for p in stale]} differ from what `course slides "
                       "--write-metadata` writes: run it and commit the notebooks")
    for p in UNITS:
        nb = read_nb(p)
        assert nb.metadata.kernelspec.name == "dist-training-course"
        assert {"minutes", "objectives", "prerequisites"} <= set(nb.metadata.course), p.name


def test_write_metadata_stores_the_structure_and_changes_nothing_else(tmp_path):
    for p in UNITS:
        nb = read_nb(p)
        for c in nb.cells:  # as the notebooks were before slide metadata was stored
            c.metadata.pop("slideshow", None)
        nbformat.write(nb, str(tmp_path / p.name))
    written = slides.write_metadata(notebook_dir=tmp_path, progress=None)
    assert sorted(p.name for p in written) == sorted(p.name for p in UNITS)
    for p in UNITS:
        before, after = read_nb(p), read_nb(tmp_path / p.name)
        assert [c.source for c in before.cells] == [c.source for c in after.cells]
        assert all(c.metadata.get("slideshow") for c in after.cells)
        for b, a in zip(before.cells, after.cells, strict=True):
            rest = {k: v for k, v in a.metadata.items() if k != "slideshow"}
            assert rest == {k: v for k, v in b.metadata.items() if k != "slideshow"}
    assert slides.write_metadata(notebook_dir=tmp_path, progress=None) == []  # idempotent
    deck = slides.build_deck(tmp_path / UNITS[0].name, tmp_path / "out")
    assert deck.used_notebook_metadata and deck.slides > MIN_SLIDES


# ---- in a browser ----------------------------------------------------------------------------
def _dark_fraction(png: Path, box: tuple[int, int, int, int] | None = None) -> float:
    from PIL import Image

    img = Image.open(png).convert("L")
    if box:
        img = img.crop(box)
    hist = img.histogram()
    return sum(hist[:128]) / max(1, sum(hist))


def _ready(driver) -> bool:
    return bool(driver.execute_script(
        "return typeof Reveal !== 'undefined' && Reveal.isReady() && "
        "document.querySelector('.reveal').classList.contains('ready')"))


def _slide(driver) -> dict:
    return driver.execute_script(
        "const s = Reveal.getCurrentSlide(); const h = s.querySelector('h1, h2, h3');"
        "const r = h ? h.getBoundingClientRect() : null;"
        "return {idx: Reveal.getIndices(), total: Reveal.getTotalSlides(), text: s.innerText,"
        " heading: h ? h.textContent : '', size: h ? parseFloat(getComputedStyle(h).fontSize) : 0,"
        " box: r ? [r.left, r.top, r.right, r.bottom] : null}")


def test_deck_opens_offline_in_chromium_and_moves_between_slides(decks, chromium,
                                                                 browser_screenshot_dir):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    out, built = decks
    deck = next(d for d in built if unit_of(d.notebook) == 0)
    chromium.get(deck.html.as_uri())
    rig.wait_for(chromium, _ready, 20, "reveal.js to initialise the deck")
    title = _slide(chromium)
    shot = rig.screenshot(chromium, "deck-unit0-title", browser_screenshot_dir)
    print(f"\ntitle slide screenshot: {shot}")
    assert (title["idx"]["h"], title["idx"]["v"]) == (0, 0)
    assert title["total"] == deck.slides
    assert title["heading"].lower().startswith("unit 0"), title
    assert "#" not in title["text"] and "**" not in title["text"], "raw markdown on the slide"
    assert title["size"] >= 40, f"title font {title['size']} px: reveal's theme did not load"
    box = [int(v) for v in title["box"]]
    assert _dark_fraction(shot, tuple(box)) > 0.05, "no dark title text where the h1 is"
    assert _dark_fraction(shot) < 0.5, "the page is mostly dark: not the white theme"
    loaded = chromium.execute_script(
        "return [...document.querySelectorAll('script[src], link[href]')]"
        ".map(e => e.src || e.href).filter(u => !u.includes('#'))")
    assert loaded and all(u.startswith("file://") for u in loaded), loaded

    # No slide animation: a screenshot must show the slide, not the middle of a transition.
    chromium.execute_script("Reveal.configure({transition: 'none', backgroundTransition: 'none'})")
    body = chromium.find_element("css selector", "body")
    for h in (1, 2):  # the keyboard, as an instructor would (fragments take a press each)
        for _ in range(8):
            ActionChains(chromium).send_keys_to_element(body, Keys.ARROW_RIGHT).perform()
            if rig.wait_for(chromium, lambda d: _slide(d)["idx"], 5, "the deck to move")["h"] \
                    == h:
                break
        now = _slide(chromium)
        assert now["idx"]["h"] == h and now["text"].strip() and now["text"] != title["text"], now
        shot = rig.screenshot(chromium, f"deck-unit0-slide{h + 1}", browser_screenshot_dir)
        assert _dark_fraction(shot) > 0.002, f"slide {h + 1} looks blank"

    turn = chromium.execute_script(
        "const all = [...document.querySelectorAll('.slides section')]"
        "  .filter(s => !s.querySelector('section'));"
        "const s = all.find(s => s.textContent.includes('Your turn'));"
        "const i = Reveal.getIndices(s); Reveal.slide(i.h, i.v); return i;")
    rig.wait_for(chromium, lambda d: "Your turn" in _slide(d)["heading"], 10,
                 "the exercise slide")
    rig.screenshot(chromium, "deck-unit0-your-turn", browser_screenshot_dir)
    assert turn["h"] > 2
