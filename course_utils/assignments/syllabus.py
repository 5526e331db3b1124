"""The course's two routes and each unit's time: the one place they are written.

A learner who knows PyTorch takes the **PyTorch route** (units 0-3, 6-11 and the capstone's
part A); the **TensorFlow route** (units 4, 5 and the capstone's part B) starts from units 0-3
and teaches TensorFlow's parameter servers. The times are a newcomer's (Python and single-GPU
PyTorch, no TensorFlow, solutions hidden), from the course's review of every unit; each
unit's header, the README's table and ``START_HERE.ipynb`` print them from here (tests check
the header and the README; ``python -m course_utils.assignments.syllabus`` rewrites the README's
table). Introduced for ``START_HERE.ipynb`` (:mod:`course_utils.learner.home`).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

PYTORCH, TENSORFLOW = "PyTorch", "TensorFlow"


@dataclass(frozen=True)
class Part:
    """A unit, or one part of it, on one route: ``minutes`` as (fewest, most)."""

    route: str
    minutes: tuple[int, int]
    label: str = ""


@dataclass(frozen=True)
class Unit:
    number: int
    title: str
    parts: tuple[Part, ...]

    @property
    def minutes(self) -> tuple[int, int]:
        return (sum(p.minutes[0] for p in self.parts), sum(p.minutes[1] for p in self.parts))

    @property
    def routes(self) -> list[str]:
        return list(dict.fromkeys(p.route for p in self.parts))

    def time_text(self) -> str:
        """``"3.5-4 h"``, ``"90 min"``; a unit in two parts: ``"2.5 h (part A) + 1.5 h
        (part B, TensorFlow route)"``."""
        if len(self.parts) == 1:
            return span(self.parts[0].minutes)
        return " + ".join(f"{span(p.minutes)} ({p.label}"
                          + (f", {p.route} route)" if p.route != self.parts[0].route else ")")
                          for p in self.parts)


def _one(route: str, low: int, high: int | None = None) -> tuple[Part, ...]:
    return (Part(route, (low, high or low)),)


UNITS = (
    Unit(0, "Cluster tour", _one(PYTORCH, 90)),
    Unit(1, "Collectives", _one(PYTORCH, 210, 240)),
    Unit(2, "Data parallelism from scratch", _one(PYTORCH, 75)),
    Unit(3, "PyTorch DDP", _one(PYTORCH, 120)),
    Unit(4, "TensorFlow parameter servers, the classic API", _one(TENSORFLOW, 180, 210)),
    Unit(5, "TF2 ParameterServerStrategy", _one(TENSORFLOW, 150)),
    Unit(6, "Two hosts", _one(PYTORCH, 150, 180)),
    Unit(7, "Performance", _one(PYTORCH, 150, 180)),
    Unit(8, "Hangs and faults", _one(PYTORCH, 120)),
    Unit(9, "Capstone", (Part(PYTORCH, (150, 150), "part A"),
                         Part(TENSORFLOW, (90, 90), "part B"))),
    Unit(10, "Sharding and memory", _one(PYTORCH, 270, 300)),
    Unit(11, "Tensor and pipeline parallelism", _one(PYTORCH, 210, 240)),
)


def span(minutes: tuple[int, int]) -> str:
    """(90, 90) -> ``"90 min"``; (210, 240) -> ``"3.5-4 h"``; minutes from 2 hours on."""
    low, high = minutes
    if high < 120:
        return f"{low} min" if low == high else f"{low}-{high} min"
    hours = [f"{m / 60:g}" for m in (low, high)]
    return f"{hours[0]} h" if low == high else f"{hours[0]}-{hours[1]} h"


def unit(number: int) -> Unit | None:
    return next((u for u in UNITS if u.number == number), None)


def route_minutes(route: str) -> tuple[int, int]:
    """The route's own units and parts, in all (the TensorFlow route's start, units 0-3, is
    counted in the PyTorch route)."""
    parts = [p for u in UNITS for p in u.parts if p.route == route]
    return (sum(p.minutes[0] for p in parts), sum(p.minutes[1] for p in parts))


def route_units(route: str) -> str:
    """``"0-3, 6-8, 9 (part A), 10"``: where a route's units are (runs of whole units joined)."""
    out: list[str] = []
    run: list[int] = []

    def close() -> None:
        if run:
            out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
            run.clear()

    for u in UNITS:
        for p in u.parts:
            if p.route != route:
                continue
            if p.label:
                close()
                out.append(f"{u.number} ({p.label})")
            else:
                if run and run[-1] != u.number - 1:
                    close()
                run.append(u.number)
    close()
    return ", ".join(out)


def routes_text() -> str:
    """Two sentences on the routes, with their totals (README, START_HERE)."""
    return (f"**PyTorch route** (units {route_units(PYTORCH)}): {span(route_minutes(PYTORCH))}. "
            f"**TensorFlow route** (units {route_units(TENSORFLOW)}; it starts from units 0-3): "
            f"{span(route_minutes(TENSORFLOW))} more. Nothing on the PyTorch route needs "
            "TensorFlow; the TensorFlow sections of units 6-8 say they belong to the "
            "TensorFlow route and may be skipped.")


HEADER_RE = re.compile(r"\*\*Time:\*\*\s*(.+?)\s+for a newcomer\b")


def header_time(text: str) -> str | None:
    """The time a unit's intro states (``**Time:** 90 min for a newcomer``), or ``None``."""
    m = HEADER_RE.search(text)
    return m.group(1) if m else None


README_START, README_END = "<!-- units: generated -->", "<!-- units: end -->"


def readme_block(descriptions: dict[int, str]) -> str:
    """The README's units table (the ``what you do`` column is the README's own)."""
    rows = ["| unit | what you do | route | time |", "| --- | --- | --- | --- |"]
    for u in UNITS:
        route = " + ".join(u.routes)
        rows.append(f"| {u.number} {u.title} | {descriptions.get(u.number, '')} | {route} "
                    f"| {u.time_text()} |")
    return "\n".join([README_START, routes_text(), "", *rows, README_END])


def readme_descriptions(text: str) -> dict[int, str]:
    """The ``what you do`` cells of the README's table, by unit number."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"\|\s*(\d+) [^|]*\|\s*(.*?)\s*\|", line)
        if m:
            out[int(m.group(1))] = m.group(2)
    return out


def rewrite_readme(path: Path) -> bool:
    """Regenerate the table between the markers; whether the file changed."""
    text = path.read_text()
    start, end = text.index(README_START), text.index(README_END) + len(README_END)
    new = text[:start] + readme_block(readme_descriptions(text[start:end])) + text[end:]
    path.write_text(new)
    return new != text


if __name__ == "__main__":
    readme = Path(sys.argv[1] if len(sys.argv) > 1 else "README.md")
    print(f"{readme}: {'rewritten' if rewrite_readme(readme) else 'already up to date'}")
