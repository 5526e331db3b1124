"""Words are defined before they are used, and "Unit N" points at a unit that exists.

The glossary is the table in unit 0's ``glossary`` cell (the one place the terms live): a term is
each **bold** item and each ``code`` spelling in a row's first column. An ordered scan over
every notebook (00, 01, ...; cells in order) checks that no cell uses a term before that table.
"""

from __future__ import annotations

import re

import nbformat
import pytest

from course_utils.assignments.lessons import NOTEBOOK_DIR, read, source_notebooks
from course_utils.notebook_cells import nbgrader_meta

GLOSSARY_NOTEBOOK = "00_cluster_tour.ipynb"
GLOSSARY_CELL = "glossary"

#: What issue 15 asked the glossary to define, at least (the table may hold more).
REQUIRED = {
    "rank", "world size", "local rank", "process group", "rendezvous", "backend",
    "master address", "engine", "kernel", "idempotent", "SIGINT", "collective", "all_reduce",
    "algbw", "busbw", "parameter server", "job", "ps task", "worker task", "gRPC", "closure",
}


#: Words of the field that later units use (issue 23): each must be defined before a learner
#: first meets it, in unit 0's glossary or in bold where it is first used.
FIELD_TERMS = {
    "replica", "c10d", "elastic", "pod", "tree", "MPI", "queue runner",
    "between-graph replication", "client",
}


def glossary_cell() -> tuple[int, str]:
    nb = read(NOTEBOOK_DIR / GLOSSARY_NOTEBOOK)
    for i, c in enumerate(nb.cells):
        if nbgrader_meta(c).get("grade_id") == GLOSSARY_CELL:
            return i, c.source
    raise AssertionError(f"{GLOSSARY_NOTEBOOK} has no cell with grade_id {GLOSSARY_CELL!r}")


def parse_terms(table: str) -> list[str]:
    """Terms of a markdown glossary table: bold items and code spellings of column one."""
    terms: list[str] = []
    for line in table.splitlines():
        cols = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cols) < 2 or not line.lstrip().startswith("|") or set(cols[0]) <= {"-", " "}:
            continue
        first = cols[0]
        if first.lower() == "term":
            continue
        for item in re.findall(r"\*\*(.+?)\*\*", first) + re.findall(r"`([^`]+)`", first):
            item = item.strip("`").strip()
            if item and item not in terms:
                terms.append(item)
    return terms


def term_pattern(term: str) -> re.Pattern[str]:
    """A term as a whole word (plural and possessive allowed), case-insensitive."""
    core = re.escape(term)
    left = r"(?<![A-Za-z0-9])" if term[0].isalnum() else ""
    right = r"(?:s|es|'s)?(?![A-Za-z0-9])" if term[-1].isalnum() else ""
    return re.compile(left + core + right, re.IGNORECASE)


def test_parse_terms_reads_bold_and_code_spellings():
    table = ("| term | meaning |\n| --- | --- |\n| **world size** (`world_size`) | how many |\n"
             "| **`%%px`** | a magic |\n| **backend** (**gloo**, **NCCL**) | library |")
    assert parse_terms(table) == ["world size", "world_size", "%%px", "backend", "gloo", "NCCL"]
    assert term_pattern("rank").search("two ranks claimed") and term_pattern("rank").search(
        "local_rank") and not term_pattern("rank").search("ranking")
    assert term_pattern("%%px").search("a %%px cell")


def test_glossary_defines_what_the_issue_asked_for():
    _, text = glossary_cell()
    terms = parse_terms(text)
    missing = sorted(REQUIRED - set(terms))
    assert not missing, f"the glossary in {GLOSSARY_NOTEBOOK} lacks {missing}"


def test_every_glossary_term_is_defined_before_any_notebook_uses_it():
    index, text = glossary_cell()
    terms = parse_terms(text)
    early: list[str] = []
    for path in source_notebooks():   # 00, 01, ...: the order a learner reads them
        nb = read(path)
        for i, cell in enumerate(nb.cells):
            if path.name == GLOSSARY_NOTEBOOK and i >= index:
                break
            for term in terms:
                if term_pattern(term).search(cell.source):
                    early.append(f"{path.name} cell {i}: {term!r}")
        if path.name == GLOSSARY_NOTEBOOK:
            break
    assert not early, "terms used before the glossary defines them: " + "; ".join(early)


def first_cells(term: str, terms_in_glossary: list[str]) -> tuple[tuple[int, int] | None,
                                                                   tuple[int, int] | None]:
    """(notebook index, cell index) of the first cell that uses ``term`` and of the first that
    defines it (the glossary cell when the table lists it, or a cell writing it in bold), in the
    order a learner reads the course; ``None`` where there is none."""
    use = define = None
    bold = re.compile(r"\*\*`?" + re.escape(term) + r"`?\*\*", re.IGNORECASE)
    pattern = term_pattern(term)
    for k, path in enumerate(source_notebooks()):
        for i, cell in enumerate(read(path).cells):
            here = (k, i)
            glossary = (path.name == GLOSSARY_NOTEBOOK
                        and nbgrader_meta(cell).get("grade_id") == GLOSSARY_CELL)
            if define is None and ((glossary and term in terms_in_glossary)
                                   or bold.search(cell.source)):
                define = here
            if use is None and pattern.search(cell.source):
                use = here
            if use is not None and define is not None:
                return use, define
    return use, define


def test_first_cells_finds_a_definition_in_bold_or_in_the_glossary():
    _, text = glossary_cell()
    use, define = first_cells("rank", parse_terms(text))
    assert define is not None and use is not None and define <= use
    use, define = first_cells("no such term anywhere", parse_terms(text))
    assert use is None and define is None


@pytest.mark.parametrize("term", sorted(FIELD_TERMS | REQUIRED))
def test_every_term_is_defined_before_its_first_use_across_the_course(term):
    _, text = glossary_cell()
    names = [p.name for p in source_notebooks()]
    use, define = first_cells(term, parse_terms(text))
    if use is None:
        return   # not used (yet): nothing to define
    where = f"{names[use[0]]} cell {use[1]}"
    assert define is not None, (
        f"{term!r} is first used in {where} and defined nowhere: add it to the glossary in "
        f"{GLOSSARY_NOTEBOOK} (or write it in bold where it is first explained)")
    assert define <= use, (
        f"{term!r} is first used in {where} but defined only in {names[define[0]]} cell "
        f"{define[1]}: define it in {GLOSSARY_NOTEBOOK}'s glossary")


UNIT_REF = re.compile(r"\bUnits?\s+(\d+)(?:\s*(?:[-–]|to)\s*(\d+))?")


def unit_references(text: str) -> list[int]:
    """Every unit number a text names ("Unit 3", "Units 4-5" gives 4 and 5)."""
    out: list[int] = []
    for m in UNIT_REF.finditer(text):
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
        out.extend(range(lo, hi + 1))
    return out


def test_unit_references_parse():
    assert unit_references("Unit 3 and Units 4–5; see Units 0-1, a later unit") == [3, 4, 5, 0, 1]


@pytest.mark.parametrize("path", source_notebooks(), ids=lambda p: p.name)
def test_every_unit_reference_points_to_a_notebook(path):
    existing = {int(p.name[:2]) for p in source_notebooks()}
    nb = read(path)
    dangling = sorted({(i, n) for i, c in enumerate(nb.cells) for n in unit_references(c.source)
                       if n not in existing})
    assert not dangling, (
        f"{path.name} names units without a notebook (cell, unit): {dangling}; say 'a later "
        f"unit' until that notebook exists")


SEED_ALLOWED = re.compile(r"random seeds?|\w*seed\w*\s*=|\w+_seed\w*|seed_\w+", re.IGNORECASE)


@pytest.mark.parametrize("path", source_notebooks(), ids=lambda p: p.name)
def test_seed_only_means_a_random_seed(path):
    """Learners meet "the original program", never our internal word for it; "seed" is only
    ever a random seed (``seed=0``, ``init_seed``, "random seed")."""
    nb = read(path)
    bad = [(i, m.group(0)) for i, c in enumerate(nb.cells)
           for m in re.finditer(r"\bseeds?\b", SEED_ALLOWED.sub("", c.source), re.IGNORECASE)]
    assert not bad, f"{path.name}: 'seed' not as a random seed in cells {bad}"


#: Words of the course's authors, not of the field: a learner reading alone trips on them.
AUTHORS_WORDS = re.compile(r"\brigs?\b|\bdrills?\b|\bas in CI\b|\bworkshop\b|\bseed_cnn\b|"
                           r"\bthe reference solution\b", re.IGNORECASE)


@pytest.mark.parametrize("path", source_notebooks(), ids=lambda p: p.name)
def test_no_course_internal_words_in_what_learners_read(path):
    nb = read(path)
    bad = [(c.get("id"), m.group(0)) for c in nb.cells
           for m in AUTHORS_WORDS.finditer(c.source)]
    assert not bad, f"{path.name}: course-internal words (say what they mean instead): {bad}"


#: Lore: how the course was made, tested or measured, and workarounds for one torch version.
#: Learners do not need it to do a unit; it lives in notebooks/instructor_notes/ (issue 43).
LORE = re.compile("|".join(w.replace(" ", r"\s+") for w in (
    r"\bnetem\b", r"\btc (?:tbf|qdisc|netem)\b", r"\bsimulated (?:hosts?|link)\b",
    r"\bnetwork namespaces?\b", r"\bthe course's (?:own )?tests\b", r"\brun on every change\b",
    r"\bnot tested anywhere\b", r"\bos\._exit\(0\)", r"\bexit-time clean-?up\b",
    r"\b_build_params_for_reducer\b", r"\btorch/[\w/]+\.py\b", r"\buser's request\b",
    r"\bcourse request\b", r"\b(?:with|in|under) torch \d+\.\d+(?:\.\d+)?\b",
    r"\bits \d+\.\d+ source\b", r"\bin this torch version\b", r"\bin our runs\b",
    r"\b2-core machine\b")), re.IGNORECASE)


def learner_text(cell) -> str:
    """What a learner reads in a cell: all of a markdown cell, the comments of a code cell."""
    if cell.cell_type != "code":
        return cell.source
    return "\n".join(m.group(1) for m in re.finditer(r"#(.*)$", cell.source, re.MULTILINE))


def test_the_lore_pattern_catches_what_issue_43_moved_out():
    moved = ["two simulated hosts of 2", "the link rate-limited (`tc tbf`)", "no `netem`",
             "The course's tests (run on every change)", "Not tested anywhere: GPUs",
             "leaves with `os._exit(0)`", "`_build_params_for_reducer` in torch's source",
             "see `torch/distributed/distributed_c10d.py`",
             "This course answers a user's request", "with torch 2.14.1, building DDP",
             "in our runs up to 25 ms"]
    assert all(LORE.search(s) for s in moved), [s for s in moved if not LORE.search(s)]
    kept = ["Rank 1 ends its process with `os._exit(1)`", "the test runs it on 4 ranks of their "
            "own, placed as two hosts of 2", "torch's default timeout", "a `tc` of tea"]
    assert not any(LORE.search(s) for s in kept), [s for s in kept if LORE.search(s)]
    code = nbformat.v4.new_code_cell("x = 1  # with torch 2.14 this crashes\nos._exit(0)")
    assert learner_text(code) == " with torch 2.14 this crashes" and LORE.search(learner_text(code))


@pytest.mark.parametrize("path", source_notebooks(), ids=lambda p: p.name)
def test_no_lore_in_what_learners_read(path):
    """Markdown and code comments hold what a learner needs to do the unit: not how the course
    was made, tested or measured (its instructor notes hold that)."""
    nb = read(path)
    bad = [(c.get("id"), m.group(0)) for c in nb.cells for m in LORE.finditer(learner_text(c))]
    assert not bad, (f"{path.name}: lore in learner text (move it to "
                     f"notebooks/instructor_notes/{path.stem}.md): {bad}")
