"""What ``course lab`` sets up around the cluster, and the learner's commands.

``course lab`` (see ``cli.cmd_lab``) calls :func:`prepare` before it starts the cluster (the
course kernel, the learner's working folder) and :meth:`LabPlan.started` once the cluster is up
(the course home). The commands registered by :func:`add_commands`:

    course home [--workdir W]                  regenerate START_HERE.ipynb, print the status
    course solution UNIT EXERCISE [--workdir W]  one exercise's solution, after its test ran
    course kernel                              install the "Distributed training course" kernel
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..assignments.release import cache_dir
from ..errors import CourseError
from . import home, kernelspec, labconfig, labpanel, workspace


@dataclass
class LabPlan:
    """Where JupyterLab serves from and what it opens."""

    root: Path
    source: bool
    jupyter_args: list[str] = field(default_factory=list)
    #: First on ``JUPYTER_CONFIG_PATH`` for the lab (see :mod:`.labconfig`).
    config_dir: Path | None = None

    def environment(self, environ: dict[str, str]) -> dict[str, str]:
        """The lab process's environment: ``environ`` plus this plan's config folder."""
        return labconfig.lab_environment(self.config_dir, environ) if self.config_dir \
            else dict(environ)

    def started(self, cc: Any, emit: Callable[[str], None] = print) -> None:
        """The cluster is up: record it and write the course home (learner's folder only)."""
        if self.source:
            return
        home.write_cluster_facts(self.root, cc)
        path = home.write_home(self.root)
        emit(f"course lab: course home {path}")


def prepare(workdir: str | None, source: bool, notebooks: Path,
            emit: Callable[[str], None] = print) -> LabPlan:
    """Install the course kernel and bring the learner's working folder up to date.

    ``source=True`` serves the instructor's ``notebooks`` (solutions and hidden tests inside).
    """
    path, written = kernelspec.install()
    emit(f"course lab: kernel {kernelspec.DISPLAY_NAME!r} "
         f"{'installed in' if written else 'already in'} {path}")
    if source:
        emit(f"course lab: the INSTRUCTOR'S SOURCE {notebooks} (solutions and hidden tests "
             "are visible; learners use `course lab` without --source)")
        return LabPlan(root=notebooks, source=True,
                       jupyter_args=[*labconfig.QUIET_ARGS, *labpanel.jupyter_args()],
                       config_dir=labconfig.write_config_dir(cache_dir() / "lab-source", True))
    root = _workdir(workdir)
    result = workspace.sync(root)
    emit(f"course lab: your working folder {root}")
    for line in result.lines():
        emit(f"course lab:   {line}")
    return LabPlan(root=root, source=False,
                   jupyter_args=[f"--LabApp.default_url=/lab/tree/{home.HOME_NAME}",
                                 *labconfig.QUIET_ARGS, *labpanel.jupyter_args()],
                   config_dir=labconfig.write_config_dir(root / ".course" / "lab-config", False))


def mark_source_notebook(nb: Any, file: str) -> Any:
    """What every source notebook should carry (in place): the course kernel as its kernelspec,
    and its time, objectives and prerequisites as ``metadata.course`` fields."""
    kernelspec.set_kernelspec(nb)
    return home.set_unit_metadata(nb, file)


def add_lab_arguments(parser: argparse.ArgumentParser) -> None:
    """``course lab``'s options for the working folder."""
    parser.add_argument("--workdir", default=None,
                        help="the learner's working folder (default $COURSE_WORKDIR or "
                             "~/dist-training-course)")
    parser.add_argument("--source", action="store_true",
                        help="open the instructor's notebooks/ (solutions visible) instead")


def _workdir(given: str | None) -> Path:
    """The learner's working folder: ``--workdir``, else :func:`workspace.default_workdir`."""
    return Path(given).expanduser() if given else workspace.default_workdir()


def cmd_home(args: argparse.Namespace) -> int:
    root = _workdir(args.workdir)
    if not any(workspace.unit_copies(root)):
        print(f"course home: no units in {root}; `course lab` creates them", file=sys.stderr)
        return 1
    path = home.write_home(root)
    print(f"wrote {path}")
    for info in home.units():
        copy = root / info.file
        status = workspace.unit_status(copy).summary() if copy.exists() else "no copy"
        print(f"  unit {info.number}: {info.title} ({info.shown_time}): {status}")
    return 0


def cmd_solution(args: argparse.Namespace) -> int:
    root = _workdir(args.workdir)
    try:
        text = workspace.reveal_solution(root, args.unit, args.exercise)
    except CourseError as exc:
        print(f"course solution: {exc}", file=sys.stderr)
        return 1
    print(text)
    return 0


def cmd_kernel(args: argparse.Namespace) -> int:
    path, written = kernelspec.install()
    print(f"{'installed' if written else 'already installed'}: {kernelspec.DISPLAY_NAME!r} "
          f"({kernelspec.KERNEL_NAME}) in {path}")
    return 0


def add_commands(sub: Any) -> None:
    """Register ``course home``, ``course solution`` and ``course kernel``."""
    h = sub.add_parser("home", help="regenerate the course home (START_HERE.ipynb)")
    h.add_argument("--workdir", default=None)
    h.set_defaults(func=cmd_home)
    s = sub.add_parser("solution", help="one exercise's solution, once its test has run")
    s.add_argument("unit", help="unit number or notebook name, e.g. 3")
    s.add_argument("exercise", help="exercise, e.g. ex2")
    s.add_argument("--workdir", default=None)
    s.set_defaults(func=cmd_solution)
    k = sub.add_parser("kernel", help="install the course's Jupyter kernel (idempotent)")
    k.set_defaults(func=cmd_kernel)
