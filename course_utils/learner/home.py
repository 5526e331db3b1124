"""The course home, ``START_HERE.ipynb`` in the learner's working folder.

Generated, never hand-kept: ``course lab`` writes it at every start and ``course home`` on
demand. It lists the units with their route and time (from
:mod:`course_utils.assignments.syllabus`) and objectives (read from each notebook: the
``metadata.course`` fields ``title``, ``objectives`` when present, else the numbered list after
"By the end of this notebook you can:"; a unit the syllabus does not list yet keeps its intro's
``**Time:** about N minutes``), links each, says which cluster ``course lab`` started (profile,
ranks, hosts), and for each unit whether the learner's copy passes its visible tests. That
status is read from the saved copy (a test cell that ran without an error output passes; see
:func:`course_utils.learner.workspace.unit_status`), so it is as fresh as the learner's last
save; the home's last cell (:func:`show`) recomputes it in place.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
from nbformat import NotebookNode

from .. import settings
from ..assignments import lessons, syllabus
from . import workspace
from .kernelspec import set_kernelspec

HOME_NAME = "START_HERE.ipynb"
CLUSTER_FACTS = Path(".course") / "cluster.json"

# "about 75 minutes", "90–120 minutes" (the upper end counts), "about 2 hours"
_TIME_RE = re.compile(r"\*\*Time:\*\*\s*(?:about\s+)?(\d+)(?:\s*[–-]\s*(\d+))?\s*(min|hour|h\b)",
                      re.I)
# to the end of the paragraph: the sentence may wrap onto the next lines
_PREREQ_RE = re.compile(r"\*\*Prerequisites:\*\*\s*(.+?)\s*(?:\n\s*\n|\Z)", re.S)
_OBJ_START_RE = re.compile(r"By the end of this notebook you can", re.I)
_ITEM_RE = re.compile(r"^\s*\d+\.\s+(.*)$")
_HEADING_RE = re.compile(r"^#\s+(.+?)\s*$", re.M)


@dataclass
class UnitInfo:
    """What the home says about one unit, read from its notebook."""

    file: str
    number: int
    title: str
    minutes: int | None
    objectives: list[str] = field(default_factory=list)
    prerequisites: str = ""
    time: str = ""       # as the syllabus prints it: "3.5-4 h"
    route: str = ""      # "PyTorch", "TensorFlow", or both for the capstone

    @property
    def shown_time(self) -> str:
        return self.time or (f"{self.minutes} min" if self.minutes else "?")


def _objectives(text: str) -> list[str]:
    m = _OBJ_START_RE.search(text)
    if not m:
        return []
    items: list[str] = []
    for line in text[m.end():].splitlines()[1:]:
        item = _ITEM_RE.match(line)
        if item:
            items.append(item.group(1).strip())
        elif items and line.startswith((" ", "\t")) and line.strip():
            items[-1] += " " + line.strip()
        elif items and not line.strip():
            break
        elif items:
            break
    return items


def unit_info(nb: NotebookNode, file: str) -> UnitInfo:
    """Title, minutes, objectives and prerequisites of a unit notebook."""
    meta = nb.metadata.get("course", {})
    intro = next((c.source for c in nb.cells if c.cell_type == "markdown"), "")
    heading = _HEADING_RE.search(intro)
    title = meta.get("title") or (heading.group(1) if heading else file)
    minutes = meta.get("minutes")
    if minutes is None:
        m = _TIME_RE.search(intro)
        if m:
            minutes = int(m.group(2) or m.group(1)) * (1 if m.group(3).lower() == "min" else 60)
    objectives = list(meta.get("objectives") or _objectives(intro))
    prereq = meta.get("prerequisites")
    if prereq is None:
        m = _PREREQ_RE.search(intro)
        prereq = " ".join(m.group(1).split()) if m else ""
    number = int(file.split("_", 1)[0]) if file[:1].isdigit() else -1
    planned = syllabus.unit(number)
    if planned is None:  # a unit the syllabus does not list yet: its intro's own time
        return UnitInfo(file, number, title, minutes, objectives, prereq)
    return UnitInfo(file, number, title, planned.minutes[1], objectives, prereq,
                    planned.time_text(), " + ".join(planned.routes))


def set_unit_metadata(nb: NotebookNode, file: str = "") -> NotebookNode:
    """Write the intro's time, objectives and prerequisites into ``metadata.course`` (in place).

    For the source notebooks: the home then reads fields instead of parsing prose.
    """
    info = unit_info(nb, file or "unit")
    course = dict(nb.metadata.get("course", {}))
    course.update({"title": info.title, "minutes": info.minutes, "objectives": info.objectives,
                   "prerequisites": info.prerequisites})
    nb.metadata["course"] = course
    return nb


def units(notebooks: list[Path] | None = None) -> list[UnitInfo]:
    """Every unit of the course (the instructor's source notebooks), in order."""
    paths = notebooks if notebooks is not None else lessons.source_notebooks()
    return [unit_info(lessons.read(p), p.name) for p in paths]


# --------------------------------------------------------------------------- the cluster


def write_cluster_facts(workdir: str | os.PathLike[str], cc: Any) -> Path:
    """Record what ``course lab`` started (profile, ranks, hosts) for the home to show."""
    facts = {
        "cluster_id": cc.cluster_id,
        "profile": cc.profile.name,
        "ipython_profile": settings.ipython_profile(),
        "ranks": [{"rank": r.rank, "engine_id": r.engine_id, "host": r.host, "addr": r.addr,
                   "local_rank": r.local_rank, "gpus": r.gpus} for r in cc.ranks],
        "started_at": time.time(),
        "lab_pid": os.getpid(),
    }
    path = Path(workdir) / CLUSTER_FACTS
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(facts, indent=1))
    return path


def read_cluster_facts(workdir: str | os.PathLike[str]) -> dict | None:
    """The recorded facts plus ``running``: the lab's process and the cluster file still exist."""
    try:
        facts = json.loads((Path(workdir) / CLUSTER_FACTS).read_text())
    except (OSError, ValueError):
        return None
    from ..cluster.kernel.lifecycle import cluster_file

    alive = True
    try:
        os.kill(int(facts.get("lab_pid", 0)), 0)
    except (OSError, ValueError):
        alive = False
    facts["running"] = alive and cluster_file(facts.get("cluster_id")).exists()
    return facts


def cluster_markdown(facts: dict | None) -> str:
    if not facts:
        return ("No cluster recorded: start the course with `course lab` (or `make lab`); "
                "`cu.start()` in a notebook starts one of its own otherwise.")
    hosts = sorted({r["host"] for r in facts["ranks"]})
    state = "running" if facts.get("running") else "**not running** (start `course lab` again)"
    lines = [f"`course lab` started **{len(facts['ranks'])} ranks** on "
             f"{len(hosts)} host{'s' if len(hosts) != 1 else ''} ({', '.join(hosts)}): "
             f"cluster profile `{facts['profile']}`, IPython profile "
             f"`{facts['ipython_profile']}`, cluster id `{facts['cluster_id']}`; {state}. "
             "The **IPython Parallel** tab in the left side bar shows it too.", "",
             "| rank | host | local rank | GPUs |", "| --- | --- | --- | --- |"]
    lines += [f"| {r['rank']} | {r['host']} | {r['local_rank']} | {r['gpus']} |"
              for r in facts["ranks"]]
    return "\n".join(lines)


# --------------------------------------------------------------------------- the page


def _status_cell(workdir: Path, info: UnitInfo) -> str:
    path = workdir / info.file
    if not path.exists():
        return "no copy (run `course lab`)"
    try:
        status = workspace.unit_status(path)
    except Exception as exc:  # noqa: BLE001 - an unreadable notebook must not break the page
        return f"cannot read ({type(exc).__name__})"
    text = status.summary()
    return f"**{text}**" if status.tests and status.passed == len(status.tests) else text


def status_markdown(workdir: str | os.PathLike[str], infos: list[UnitInfo]) -> str:
    """The units table: link, time, the learner's visible-test status, updates offered."""
    workdir = Path(workdir)
    manifest = workspace.load_manifest(workdir)
    lines = ["| unit | notebook | route | time | your copy |", "| --- | --- | --- | --- | --- |"]
    for info in infos:
        status = _status_cell(workdir, info)
        offered = manifest["units"].get(info.file, {}).get("offered", {}).get("file")
        if offered and (workdir / offered).exists():
            status += f"; a newer version is beside it: [{offered}]({offered})"
        shown = manifest["solutions_shown"].get(info.file)
        if shown:
            status += f"; solution shown for {', '.join(shown)}"
        lines.append(f"| {info.number} | [{info.title}]({info.file}) | {info.route} | "
                     f"{info.shown_time} | {status} |")
    return "\n".join(lines)


def objectives_markdown(infos: list[UnitInfo]) -> str:
    parts = []
    for info in infos:
        head = f"### [{info.title}]({info.file}) ({info.shown_time})"
        body = [f"{i}. {o}" for i, o in enumerate(info.objectives, 1)]
        pre = [f"*Prerequisites:* {info.prerequisites}", ""] if info.prerequisites else []
        parts.append("\n".join([head, "", *pre, *body]))
    return "\n\n".join(parts)


def home_notebook(workdir: str | os.PathLike[str], infos: list[UnitInfo] | None = None,
                  facts: dict | None = None) -> NotebookNode:
    """The home page as a notebook of Markdown cells and one refresh cell."""
    workdir = Path(workdir)
    infos = units() if infos is None else infos
    new = nbformat.v4.new_markdown_cell
    stamp = time.strftime("%Y-%m-%d %H:%M")
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        new("# Distributed training: start here\n\n"
            f"{len(infos)} units on two routes, times at a newcomer's pace. "
            + syllabus.routes_text() + " Work through a route in order; each unit "
            "opens with its objectives and ends with a summary. This folder holds **your "
            "copies**: the exercises are stubs (`raise NotImplementedError()`) for you to "
            "complete, and the visible test under each exercise says whether it works. The "
            "course never overwrites a copy you saved; when a unit changes, the new version "
            "appears beside yours as `NN_name.updated.ipynb`.\n\n"
            f"*Generated by `course home` on {stamp} from the notebooks; `course lab` "
            "regenerates it. Do not edit: run the last cell to refresh the status.*"),
        new("## Your cluster\n\n" + cluster_markdown(facts)),
        new("## Units\n\nThe status comes from your **saved** notebooks (save with Ctrl-S): "
            "a visible test passes when it ran without an error.\n\n"
            + status_markdown(workdir, infos)),
        new("## What each unit teaches\n\n" + objectives_markdown(infos)),
        new("## Stuck?\n\nRun the exercise's test cell at least once and save the notebook, "
            "then ask for that one exercise's solution in JupyterLab's terminal (File > New > "
            "Terminal):\n\n"
            "```\ncourse solution 3 ex2      # unit 3, exercise 2\n```\n\n"
            "Other files here: `data/` (datasets) and `saved_models/` (the checkpoints "
            "training writes). "
            "`course lab --source` opens the instructor's notebooks instead of your copies."),
        nbformat.v4.new_code_cell("# Refresh: the cluster and your tests' status, as of now\n"
                                  "from course_utils.learner import home\n\nhome.show()"),
    ]
    nb.metadata["course"] = {"generated": "course home", "title": "Start here"}
    return set_kernelspec(nb)


def write_home(workdir: str | os.PathLike[str], notebooks: list[Path] | None = None) -> Path:
    """Write ``START_HERE.ipynb`` into the working folder (always regenerated)."""
    workdir = Path(workdir).expanduser()
    workdir.mkdir(parents=True, exist_ok=True)
    nb = home_notebook(workdir, units(notebooks), read_cluster_facts(workdir))
    path = workdir / HOME_NAME
    tmp = path.with_name(f".{HOME_NAME}.tmp")
    nbformat.write(nb, str(tmp))
    os.replace(tmp, path)
    return path


def show(workdir: str | os.PathLike[str] | None = None) -> None:
    """Display the cluster and the units' status as of now (the home's last cell)."""
    from IPython.display import Markdown, display

    workdir = Path(workdir or Path.cwd())
    text = ("### Your cluster\n\n" + cluster_markdown(read_cluster_facts(workdir))
            + "\n\n### Units\n\n" + status_markdown(workdir, units()))
    display(Markdown(text))
