"""The instructor's sub-commands of ``course`` (registered by :mod:`course_utils.cli`)::

    course release OUTDIR [--unit N ...]
    course grade SUBMISSIONS [--course OUTDIR] [--unit N ...] [--cell-timeout S]
                             [--notebook-timeout S] [--engines N] [--jobs N]
                             [--sandbox | --no-sandbox]
    course feedback [COURSE] [--unit N ...] [--student NAME ...]
    course slides [--unit N ...] [--out DIR] [--execute] [--write-metadata]
    course workshop FILE [--out DIR] [--course DIR]
    course workshop check FILE [--out DIR] [--token TOKEN]
    course workshop collect FILE [--course DIR] [--unit N ...]

Each is a thin face over a library function of the same name in this package; nbgrader and
nbconvert are imported only when a command runs. :func:`_add` sets up what every one of them
shares (the sub-parser, ``--unit``, ``--notebooks`` and one way of reporting a
:class:`~course_utils.errors.CourseError`).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path

from ..errors import CourseError
from ..settings import course_root

DEFAULT_COURSE = "course"
SLIDES_DIR = course_root() / "slides"  # = slides.SLIDES_DIR, without importing slides

Command = Callable[[argparse.Namespace], int]


def _fail(what: str, exc: CourseError) -> int:
    print(f"course {what}: {exc.cause}\nFix: {exc.fix}", file=sys.stderr)
    return 1


def _reporting(name: str, func: Command) -> Command:
    """``func`` with a course error printed as ``course NAME: cause`` + ``Fix:`` (exit 1)."""

    @functools.wraps(func)
    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except CourseError as exc:
            return _fail(name, exc)

    return run


def _add(sub: argparse._SubParsersAction, name: str, func: Command, help: str, *,
         units: bool = True, notebooks: bool = False) -> argparse.ArgumentParser:
    """One instructor sub-command: its parser, the shared options, its error reporting."""
    p = sub.add_parser(name, help=help)
    if units:
        p.add_argument("--unit", type=int, action="append", metavar="N",
                       help="only unit N (repeat for more); default: every unit")
    if notebooks:
        p.add_argument("--notebooks", default=None,
                       help="lesson notebooks folder (default: ours)")
    p.set_defaults(func=_reporting(name, func))
    return p


def cmd_release(args: argparse.Namespace) -> int:
    from ..assignments.release import release

    rel = release(args.outdir, units=args.unit, notebook_dir=args.notebooks)
    print(rel.table())
    print(f"course release: student versions in {rel.root / 'release'} "
          f"(nbgrader course folder {rel.root}; hand out release/unit<N>/)")
    return 0


def _sandbox_choice(asked: bool | None) -> bool:
    """``--sandbox``/``--no-sandbox`` as asked; by default a sandbox wherever bubblewrap is
    installed (the code graded is the learners'), else a warning that names the fix."""
    import shutil

    if asked is not None:
        return asked
    if shutil.which("bwrap"):
        return True
    print("course grade: not sandboxed (bubblewrap is not installed): the learners' code runs "
          "as you, beside the gradebook. Fix: apt-get install bubblewrap (or pass "
          "--no-sandbox to say you trust every submission)", file=sys.stderr)
    return False


def cmd_grade(args: argparse.Namespace) -> int:
    from .autograde import grade

    res = grade(args.submissions, course=args.course, units=args.unit,
                cell_timeout=args.cell_timeout, notebook_timeout=args.notebook_timeout,
                engines=args.engines, jobs=args.jobs, sandbox=_sandbox_choice(args.sandbox))
    print(res.table())
    return 0


def cmd_feedback(args: argparse.Namespace) -> int:
    from .feedback_html import feedback

    done = feedback(args.course, units=args.unit, students=args.student)
    failed = [f for f in done if not f.ok]
    print(f"course feedback: {len(done) - len(failed)} written, {len(failed)} failed, in "
          f"{Path(args.course).resolve() / 'feedback'}")
    return 1 if failed else 0


def cmd_slides(args: argparse.Namespace) -> int:
    from . import slides

    if args.write_metadata:
        written = slides.write_metadata(units=args.unit, notebook_dir=args.notebooks)
        print(f"course slides: slide metadata written to {len(written)} notebook(s)")
        return 0
    decks = slides.build_decks(units=args.unit, outdir=args.out,
                               notebook_dir=args.notebooks, execute=args.execute)
    print(f"course slides: {len(decks)} deck(s) in {Path(args.out).resolve()}; open one in a "
          f"browser (no network needed)")
    return 0


def _workshop_collect(args: argparse.Namespace) -> int:
    from ..workshop.collect import collect_work
    from ..workshop.plan import load_workshop

    got = collect_work(load_workshop(args.rest[0]), Path(args.course), units=args.unit)
    print(f"course workshop collect: into {got.course / 'submitted'}\n{got.table()}")
    print(f"grade them: course grade {got.course} --jobs N  (in a sandbox; N: clusters this "
          "host runs at once)")
    return 0


def _workshop_jobs(args: argparse.Namespace) -> int:
    from ..workshop.jobs import learner_jobs, release
    from ..workshop.plan import load_workshop

    ws = load_workshop(args.rest[0])
    if args.release:
        gone = release(ws, args.release)
        print(f"course workshop jobs: {args.release}'s job(s) {', '.join(gone)} cancelled; "
              "their GPUs are free" if gone else
              f"course workshop jobs: {args.release} holds no job in {ws.partition}")
        return 0
    held = learner_jobs(ws)
    print(f"course workshop jobs: {len(held)} job(s) of learners in {ws.partition}")
    for job in held:
        print(job.text())
    if held:
        print("free one learner's GPUs: sudo course workshop jobs FILE --release LEARNER")
    return 0


def cmd_workshop(args: argparse.Namespace) -> int:
    from ..workshop.plan import load_workshop

    if args.file in ("check", "collect", "jobs") and not args.rest:
        raise CourseError(f"`course workshop {args.file}` needs the workshop file",
                          f"course workshop {args.file} workshop.toml")
    if args.file == "collect":  # `course workshop collect FILE --course DIR`
        return _workshop_collect(args)
    if args.file == "jobs":  # `course workshop jobs FILE [--release LEARNER]`
        return _workshop_jobs(args)
    if args.file == "check":  # `course workshop check FILE`
        from ..workshop.check import find_token, run_checks, summary
        from ..workshop.learner_env import FOLDER

        token = args.token or os.environ.get("JUPYTERHUB_API_TOKEN") or find_token(args.out)
        lines = run_checks(load_workshop(args.rest[0]), token=token,
                           learner_env=Path(args.out).resolve() / FOLDER,
                           course=Path(args.course).resolve())
        print(f"course workshop check: {summary(lines)}")
        return 1 if any(line.status == "FAIL" for line in lines) else 0
    if args.rest:
        raise CourseError(f"unexpected arguments {args.rest}",
                          "course workshop FILE [--out DIR], or course workshop check FILE")
    from ..workshop.render import next_steps, write_workshop

    ws = load_workshop(args.file)
    release = Path(args.course).resolve() / "release"
    if not release.is_dir():
        raise CourseError(f"{release} is missing: the hub gives each learner a copy of the "
                          "student release",
                          f"run `course release {args.course}` first, then this command again")
    written = write_workshop(ws, Path(args.out), release)
    print("course workshop: wrote " + ", ".join(str(p) for p in written.values()))
    print(next_steps(ws, written))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``release``, ``grade``, ``feedback``, ``slides`` and ``workshop`` to the ``course``
    parser."""
    r = _add(sub, "release", cmd_release, "student version of every unit, as an nbgrader course",
             notebooks=True)
    r.add_argument("outdir", help="course folder to create or refresh (e.g. course/)")

    g = _add(sub, "grade", cmd_grade, "autograde every submission headless, on a fresh cluster")
    g.add_argument("submissions", help="one folder per student, or the course's submitted/")
    g.add_argument("--course", default=None,
                   help="the course folder from `course release` (default: found from "
                        "SUBMISSIONS)")
    g.add_argument("--cell-timeout", type=int, default=None,
                   help="seconds per cell (default: nbgrader_config.py's, 300)")
    g.add_argument("--notebook-timeout", type=int, default=None,
                   help="seconds per notebook (default: nbgrader_config.py's, 1200)")
    g.add_argument("--engines", type=int, default=None, help="engines per cluster (default 2)")
    g.add_argument("--jobs", type=int, default=1,
                   help="students graded at once, each job with its own clusters (default 1); "
                        "each job needs the cores of one cluster")
    g.add_argument("--sandbox", action=argparse.BooleanOptionalAction, default=None,
                   help="run each notebook's kernel and cluster in a bubblewrap sandbox: an "
                        "unprivileged user, no network, no gradebook, no other submissions "
                        "(default: on wherever bwrap is installed)")

    f = _add(sub, "feedback", cmd_feedback, "nbgrader HTML feedback per student and unit")
    f.add_argument("course", nargs="?", default=DEFAULT_COURSE,
                   help=f"the course folder (default: {DEFAULT_COURSE}/)")
    f.add_argument("--student", action="append", metavar="NAME", help="only this student")

    s = _add(sub, "slides", cmd_slides, "reveal.js decks of the lessons (offline), in slides/",
             notebooks=True)
    s.add_argument("--out", default=str(SLIDES_DIR), help="where decks go (default: slides/)")
    s.add_argument("--execute", action="store_true",
                   help="run each notebook first (fresh cluster) so decks show outputs")
    s.add_argument("--write-metadata", action="store_true",
                   help="store the derived slide structure in the notebooks instead")

    w = _add(sub, "workshop", cmd_workshop, "a workshop file -> the hub's config, Slurm's GRES "
             "lines and the learners' profile; `course workshop check FILE` checks it all",
             units=False)
    w.add_argument("file", help="the workshop file (workshops/example.toml), or `check`, "
                                "`collect` or `jobs` followed by it")
    w.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    w.add_argument("--out", default="workshop", help="where the files go (default: workshop/)")
    w.add_argument("--course", default=DEFAULT_COURSE,
                   help=f"the course folder of `course release` (default: {DEFAULT_COURSE}/); "
                        "each learner starts with a copy of its release/")
    w.add_argument("--unit", type=int, action="append", metavar="N",
                   help="collect: only unit N (repeat for more); default: every unit")
    w.add_argument("--release", default=None, metavar="LEARNER",
                   help="jobs: cancel every job of LEARNER in the workshop's partition")
    w.add_argument("--token", default=None,
                   help="check: a hub API token that may start labs (default: "
                        "$JUPYTERHUB_API_TOKEN, else the one `course workshop` wrote in --out)")
