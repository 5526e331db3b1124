"""The timelines of ``08_hangs_and_faults``, drawn from the learner's own run: a process killed
in the middle of a checkpoint save (exercise 2's forked child), and a ``torchrun`` restart
(section 5 and exercise 3: attempt 0, the crash, attempt 1 resuming).

Pure functions: the inputs are what the checks return (``events`` of
:func:`course_utils.checks.engine_check_atomic_save`) and the ``[elastic]`` lines that
:func:`course_utils.torch_dist.faults.join_elastic` collects.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from .style import GREY, ROLE, pyplot, styled

_LINE = re.compile(r"\[elastic\] (?:attempt (\d+): (resumed at step|finished) (\d+)|rank (\d+) "
                   r"crashes at step (\d+)).*?\(time ([\d.]+)(?:; ([\d.]+) s after)?")


def parse_elastic(lines: Sequence[str]) -> list[dict[str, Any]]:
    """The events of a ``torchrun`` run from its ``[elastic]`` lines, in order: ``start`` (the
    process started; from "N s after this process started"), ``resume`` (training begins at
    ``step``), ``crash`` (a rank ends itself at ``step``) and ``finish``. Each event has
    ``kind``, ``attempt``, ``step``, ``t`` (seconds since the first event); lines that are not
    the demo's are skipped."""
    out: list[dict[str, Any]] = []
    attempt = 0
    for line in lines:
        m = _LINE.search(line)
        if not m:
            continue
        t = float(m.group(6))
        if m.group(4) is not None:
            out.append({"kind": "crash", "attempt": attempt, "step": int(m.group(5)), "t": t,
                        "rank": int(m.group(4))})
            continue
        attempt = int(m.group(1))
        if m.group(2) == "finished":
            out.append({"kind": "finish", "attempt": attempt, "step": int(m.group(3)), "t": t})
            continue
        if m.group(7) is not None:
            out.append({"kind": "start", "attempt": attempt, "step": None,
                        "t": t - float(m.group(7))})
        out.append({"kind": "resume", "attempt": attempt, "step": int(m.group(3)), "t": t})
    t0 = min((e["t"] for e in out), default=0.0)
    return sorted(({**e, "t": e["t"] - t0} for e in out), key=lambda e: e["t"])


def restart_spans(events: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per attempt: ``starting`` (process start to the resume: importing torch, forming the
    group, loading the checkpoint) and ``training`` (the resume to the crash or the finish),
    with the steps covered. The input is :func:`parse_elastic`'s."""
    spans = []
    for a in sorted({e["attempt"] for e in events}):
        mine = {e["kind"]: e for e in events if e["attempt"] == a}
        resume = mine.get("resume")
        if resume is None:
            continue
        if "start" in mine:
            spans.append({"attempt": a, "kind": "starting", "t0": mine["start"]["t"],
                          "t1": resume["t"], "steps": None})
        end = mine.get("crash") or mine.get("finish")
        if end is not None:
            spans.append({"attempt": a, "kind": "training", "t0": resume["t"], "t1": end["t"],
                          "steps": (resume["step"], end["step"]),
                          "ended": "crash" if end is mine.get("crash") else "finish"})
    return spans


@styled
def restart_timeline(lines: Sequence[str], title: str = "torchrun --max-restarts=1") -> Any:
    """One lane per attempt: starting (grey), training with its steps (blue), the crash (a red
    cross) and the gap torchrun needed to start the next attempt."""
    plt = pyplot()
    events = parse_elastic(lines)
    spans = restart_spans(events)
    fig, ax = plt.subplots(figsize=(9, 2.6))
    attempts = sorted({s["attempt"] for s in spans})
    for s in spans:
        y = attempts.index(s["attempt"])
        color = GREY if s["kind"] == "starting" else ROLE["compute"]
        ax.barh(y, s["t1"] - s["t0"], left=s["t0"], height=0.5, color=color)
        label = ("start" if s["kind"] == "starting"
                 else f"steps {s['steps'][0]}→{s['steps'][1]}")
        ax.text((s["t0"] + s["t1"]) / 2, y, label, ha="center", va="center", fontsize=9,
                color="white" if s["kind"] == "training" else "black")
        if s.get("ended") == "crash":
            ax.plot(s["t1"], y, marker="X", markersize=12, color=ROLE["failed"])
    crash = next((e for e in events if e["kind"] == "crash"), None)
    later = [s for s in spans if crash and s["attempt"] > crash["attempt"]]
    if crash and later:
        back = min(s["t0"] for s in later if s["kind"] == "training")
        ax.annotate(f"{back - crash['t']:.1f} s to train again", xy=(back, len(attempts) - 1),
                    xytext=(crash["t"], len(attempts) - 0.5), fontsize=9,
                    arrowprops={"arrowstyle": "->", "color": ROLE["failed"]})
    ax.set_yticks(range(len(attempts)), [f"attempt {a}" for a in attempts])
    ax.set_ylim(-0.6, max(1, len(attempts)) - 0.2)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the first worker started")
    ax.set_title(title if spans else f"{title}: no [elastic] lines to draw")
    fig.tight_layout()
    return fig


def save_spans(events: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    """The saves of a child process from its ``(seconds, kind, n)`` events (``save`` when
    ``torch.save`` began its ``n``-th call, ``saved`` when it returned, ``kill`` when the
    process killed itself): one span per save, ``killed`` for the one that never returned."""
    begun: dict[int, float] = {}
    spans = []
    for t, kind, n in events:
        if kind == "save":
            begun[n] = t
        elif kind in ("saved", "kill") and n in begun:
            spans.append({"n": n, "t0": begun.pop(n), "t1": t, "killed": kind == "kill"})
    return spans


@styled
def kill_during_save(result: Mapping[str, Any]) -> Any:
    """Exercise 2's child from :func:`course_utils.checks.engine_check_atomic_save`'s result:
    a bar per ``torch.save`` (the last one cut by SIGKILL), and what was on disk afterwards."""
    plt = pyplot()
    spans = save_spans(result.get("events") or [])
    fig, ax = plt.subplots(figsize=(9, 2.4))
    for s in spans:
        color = ROLE["failed"] if s["killed"] else ROLE["ok"]
        width = max(s["t1"] - s["t0"], 1e-4)
        ax.barh(0, width, left=s["t0"], height=0.5, color=color)
        ax.text(s["t0"] + width / 2, 0.45, f"save {s['n']}", ha="center", fontsize=8)
        if s["killed"]:
            ax.plot(s["t1"], 0, marker="X", markersize=12, color="black")
            ax.annotate("SIGKILL", xy=(s["t1"], 0), xytext=(s["t1"], -0.55), fontsize=9,
                        ha="center")
    on_disk = ", ".join(result.get("files") or []) or "nothing"
    loads = (f"loads at step {result.get('step')}" if result.get("loads")
             else f"does not load ({result.get('load_error', 'no file')})")
    ax.set_yticks([])
    ax.set_ylim(-0.8, 0.8)
    ax.set_xlabel("seconds since the child process started")
    ax.set_title(f"on disk after the kill: {on_disk}; the checkpoint {loads}"[:110],
                 fontsize=11)
    fig.tight_layout()
    return fig
