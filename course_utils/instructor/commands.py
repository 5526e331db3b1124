"""The instructor's sub-commands of ``course`` (registered by :mod:`course_utils.cli`)::

    course release OUTDIR [--unit N ...]
    course grade SUBMISSIONS [--course OUTDIR] [--unit N ...] [--cell-timeout S]
                             [--notebook-timeout S] [--engines N]
    course feedback [COURSE] [--unit N ...] [--student NAME ...]
    course slides [--unit N ...] [--out DIR] [--execute] [--write-metadata]

Each is a thin face over a library function of the same name in this package; nbgrader and
nbconvert are imported only when a command runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import CourseError

DEFAULT_COURSE = "course"
SLIDES_DIR = Path(__file__).resolve().parents[2] / "slides"  # = slides.SLIDES_DIR, no import


def _fail(what: str, exc: CourseError) -> int:
    print(f"course {what}: {exc.cause}\nFix: {exc.fix}", file=sys.stderr)
    return 1


def cmd_release(args: argparse.Namespace) -> int:
    from .release import release

    try:
        rel = release(args.outdir, units=args.unit, notebook_dir=args.notebooks)
    except CourseError as exc:
        return _fail("release", exc)
    print(rel.table())
    print(f"course release: student versions in {rel.root / 'release'} "
          f"(nbgrader course folder {rel.root}; hand out release/unit<N>/)")
    return 0


def cmd_grade(args: argparse.Namespace) -> int:
    from .grade import grade

    try:
        res = grade(args.submissions, course=args.course, units=args.unit,
                    cell_timeout=args.cell_timeout, notebook_timeout=args.notebook_timeout,
                    engines=args.engines)
    except CourseError as exc:
        return _fail("grade", exc)
    print(res.table())
    return 0


def cmd_feedback(args: argparse.Namespace) -> int:
    from .feedback import feedback

    try:
        done = feedback(args.course, units=args.unit, students=args.student)
    except CourseError as exc:
        return _fail("feedback", exc)
    failed = [f for f in done if not f.ok]
    print(f"course feedback: {len(done) - len(failed)} written, {len(failed)} failed, in "
          f"{Path(args.course).resolve() / 'feedback'}")
    return 1 if failed else 0


def cmd_slides(args: argparse.Namespace) -> int:
    from . import slides

    try:
        if args.write_metadata:
            written = slides.write_metadata(units=args.unit, notebook_dir=args.notebooks)
            print(f"course slides: slide metadata written to {len(written)} notebook(s)")
            return 0
        decks = slides.build_decks(units=args.unit, outdir=args.out,
                                   notebook_dir=args.notebooks, execute=args.execute)
    except CourseError as exc:
        return _fail("slides", exc)
    print(f"course slides: {len(decks)} deck(s) in {Path(args.out).resolve()}; open one in a "
          f"browser (no network needed)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``release``, ``grade``, ``feedback`` and ``slides`` to the ``course`` parser."""
    unit = {"type": int, "action": "append", "metavar": "N",
            "help": "only unit N (repeat for more); default: every unit"}

    r = sub.add_parser("release", help="student version of every unit, as an nbgrader course")
    r.add_argument("outdir", help="course folder to create or refresh (e.g. course/)")
    r.add_argument("--unit", **unit)
    r.add_argument("--notebooks", default=None, help="lesson notebooks folder (default: ours)")
    r.set_defaults(func=cmd_release)

    g = sub.add_parser("grade", help="autograde every submission headless, on a fresh cluster")
    g.add_argument("submissions", help="one folder per student, or the course's submitted/")
    g.add_argument("--course", default=None,
                   help="the course folder from `course release` (default: found from "
                        "SUBMISSIONS)")
    g.add_argument("--unit", **unit)
    g.add_argument("--cell-timeout", type=int, default=None,
                   help="seconds per cell (default: nbgrader_config.py's, 300)")
    g.add_argument("--notebook-timeout", type=int, default=None,
                   help="seconds per notebook (default: nbgrader_config.py's, 1200)")
    g.add_argument("--engines", type=int, default=None, help="engines per cluster (default 2)")
    g.set_defaults(func=cmd_grade)

    f = sub.add_parser("feedback", help="nbgrader HTML feedback per student and unit")
    f.add_argument("course", nargs="?", default=DEFAULT_COURSE,
                   help=f"the course folder (default: {DEFAULT_COURSE}/)")
    f.add_argument("--unit", **unit)
    f.add_argument("--student", action="append", metavar="NAME", help="only this student")
    f.set_defaults(func=cmd_feedback)

    s = sub.add_parser("slides", help="reveal.js decks of the lessons (offline), in slides/")
    s.add_argument("--unit", **unit)
    s.add_argument("--out", default=str(SLIDES_DIR), help="where decks go (default: slides/)")
    s.add_argument("--notebooks", default=None, help="lesson notebooks folder (default: ours)")
    s.add_argument("--execute", action="store_true",
                   help="run each notebook first (fresh cluster) so decks show outputs")
    s.add_argument("--write-metadata", action="store_true",
                   help="store the derived slide structure in the notebooks instead")
    s.set_defaults(func=cmd_slides)
