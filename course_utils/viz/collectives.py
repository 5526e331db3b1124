"""Figures of collectives (unit 1): per-rank tensors, bandwidth bars, the recorded ring."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .style import ROLE, pyplot, styled


@styled
def per_rank_tensors(before: Sequence[Any], after: Sequence[Any], title: str) -> Any:
    """A grid: one column per rank, rows 'before' and 'after', each cell the rank's values.

    ``before``/``after`` hold one array-like per rank (``None`` for a rank that holds nothing,
    e.g. a non-root rank after ``gather``).
    """
    plt = pyplot()
    p = len(before)
    if len(after) != p:
        raise ValueError(f"before has {p} ranks, after has {len(after)}")
    values = [np.asarray(v, dtype=float).reshape(-1) for v in (*before, *after) if v is not None]
    lo = min((float(v.min()) for v in values if v.size), default=0.0)
    hi = max((float(v.max()) for v in values if v.size), default=1.0)
    span = max(hi - lo, 1.0)
    fig, axes = plt.subplots(2, p, figsize=(2.6 * p + 1, 2.4), squeeze=False)
    for row, (label, data) in enumerate((("before", before), ("after", after))):
        for r in range(p):
            ax = axes[row][r]
            ax.set_xticks([])
            ax.set_yticks([])
            for spine in ax.spines.values():
                spine.set_visible(False)
            val = data[r]
            if val is None:
                ax.text(0.5, 0.5, "(nothing)", ha="center", va="center", color="grey")
                ax.set_frame_on(False)
            else:
                arr = np.atleast_1d(np.asarray(val, dtype=float)).reshape(-1)
                # One colour scale for every panel (light, so the black numbers stay readable).
                ax.imshow(arr[None, :], cmap="Blues", aspect="auto", vmin=lo - 0.1 * span,
                          vmax=hi + 0.8 * span)
                for i, v in enumerate(arr[:12]):
                    ax.text(i, 0, f"{v:g}", ha="center", va="center", color="black",
                            fontsize=9)
            if row == 0:
                ax.set_title(f"rank {r}", fontsize=10)
            if r == 0:
                ax.set_ylabel(label)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


@styled
def bandwidth_bars(busbw_by_name: Mapping[str, float], title: str) -> Any:
    """Horizontal bars of busbw (GB/s) per implementation."""
    plt = pyplot()
    names = list(busbw_by_name)
    fig, ax = plt.subplots(figsize=(6.5, 0.6 * len(names) + 1.2))
    ax.barh(names, [busbw_by_name[n] for n in names], color=ROLE["ring"])
    for i, n in enumerate(names):
        ax.text(busbw_by_name[n], i, f" {busbw_by_name[n]:.2f}", va="center")
    ax.set_xlabel("busbw (GB/s)")
    ax.set_title(title)
    fig.tight_layout()
    return fig


@styled
def ring_trace(records: Sequence[Mapping[str, Any]], title: str = "ring all-reduce, recorded"
               ) -> Any:
    """A grid of what each rank held and sent: row 'before', one row per message (the chunk's
    values when it was sent and to whom), row 'after'; one column per rank.

    ``records`` is one dict per rank from :func:`course_utils.torch_dist.p2p.engine_record_ring`.
    """
    plt = pyplot()
    p = len(records)
    steps = max((len(r["messages"]) for r in records), default=0)
    rows = ["before"] + [f"message {i + 1}" for i in range(steps)] + ["after"]
    fig, ax = plt.subplots(figsize=(3.2 * p + 1.4, 0.55 * len(rows) + 0.8))
    ax.set_xlim(-0.5, p - 0.5)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xticks(range(p), [f"rank {r}" for r in range(p)])
    ax.set_yticks(range(len(rows)), rows)
    ax.xaxis.tick_top()

    def fmt(vals: Sequence[float]) -> str:
        shown = ", ".join(f"{v:g}" for v in list(vals)[:6])
        return f"[{shown}{', …' if len(vals) > 6 else ''}]"

    for c, rec in enumerate(records):
        ax.text(c, 0, fmt(rec["before"]), ha="center", va="center", fontsize=8)
        for i, (dst, vals) in enumerate(rec["messages"]):
            ax.text(c, i + 1, f"→ r{dst}: {fmt(vals)}", ha="center", va="center", fontsize=8,
                    color=ROLE["ring"])
        ax.text(c, len(rows) - 1, fmt(rec["after"]), ha="center", va="center", fontsize=8,
                color=ROLE["all_gather"])
    for y in range(len(rows) - 1):
        ax.axhline(y + 0.5, color="0.85", linewidth=0.8)
    ax.set_title(title, pad=24)
    fig.tight_layout()
    return fig


# ---- the ring all-reduce's schedule, before anyone has written a ring (unit 1) -------------
def ring_schedule(p: int) -> list[dict[str, Any]]:
    """Every step of a chunked ring all-reduce on ``p`` ranks, as plain data (pure).

    One dict per step: ``phase`` (``"reduce-scatter"`` or ``"all-gather"``), ``step`` (``s``
    within the phase), ``moves`` (``(src, dst, chunk)`` per rank: rank ``r`` sends to
    ``(r + 1) % p`` chunk ``(r - s) % p``, then in all-gather ``(r + 1 - s) % p``) and ``held``
    (after the step, ``held[r][c]`` is the sorted list of ranks whose contributions rank ``r``'s
    chunk ``c`` sums). The first entry is the start (``phase`` ``"start"``, no moves)."""
    if p < 2:
        raise ValueError(f"a ring needs p >= 2 ranks, got {p}")
    held = [[{r} for _ in range(p)] for r in range(p)]
    out: list[dict[str, Any]] = [{"phase": "start", "step": 0, "moves": [],
                                  "held": [[sorted(c) for c in row] for row in held]}]
    for phase, first in (("reduce-scatter", 0), ("all-gather", 1)):
        for s in range(p - 1):
            moves = [(r, (r + 1) % p, (r + first - s) % p) for r in range(p)]
            sent = [set(held[src][c]) for src, _dst, c in moves]  # all sends happen at once
            for (_src, dst, c), got in zip(moves, sent, strict=True):
                held[dst][c] = held[dst][c] | got if phase == "reduce-scatter" else got
            out.append({"phase": phase, "step": s, "moves": moves,
                        "held": [[sorted(c) for c in row] for row in held]})
    return out


@styled
def ring_schedule_picture(p: int = 4) -> Any:
    """The ring all-reduce's ``2(p-1)`` steps on ``p`` ranks, drawn from :func:`ring_schedule`:
    one panel per step (the start first), a row per rank and a column per chunk; each cell is
    labelled with the ranks summed into it ("0+1", "Σ" when all are) and darker the more it
    holds; the cells that just arrived are outlined (red: added during reduce-scatter, green:
    copied during all-gather) and named by the chunk's sender. Pure; introduced in
    ``01_collectives`` before the ring exercise."""
    plt = pyplot()
    from matplotlib.patches import Rectangle

    steps = ring_schedule(p)
    cols = p
    rows = -(-len(steps) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.9 * cols, 2.6 * rows + 0.6), squeeze=False)
    cmap = plt.get_cmap("Blues")
    for k, ax in enumerate(axes.flat):
        ax.set_axis_off()
        if k >= len(steps):
            continue
        st = steps[k]
        edge = {src: (dst, c) for src, dst, c in st["moves"]}
        arrived = {(dst, c): src for src, (dst, c) in edge.items()}
        colour = ROLE["reduce_scatter"] if st["phase"] == "reduce-scatter" else ROLE["all_gather"]
        for r in range(p):
            for c in range(p):
                who = st["held"][r][c]
                face = cmap(0.1 + 0.8 * len(who) / p)
                new = (r, c) in arrived
                ax.add_patch(Rectangle((c, r), 0.92, 0.86, facecolor=face,
                                       edgecolor=colour if new else "0.6",
                                       linewidth=2.6 if new else 0.6))
                text = "Σ" if len(who) == p else "+".join(map(str, who))
                if new:
                    text += f"\n←r{arrived[(r, c)]}"
                ax.text(c + 0.46, r + 0.43, text, ha="center", va="center", fontsize=8.5,
                        color="white" if len(who) > p / 2 else "black")
        ax.set_xlim(-0.9, p)
        ax.set_ylim(p + 0.1, -0.9)
        for r in range(p):
            ax.text(-0.1, r + 0.43, f"r{r}", ha="right", va="center", fontsize=9)
        for c in range(p):
            ax.text(c + 0.46, -0.15, f"chunk {c}", ha="center", va="bottom", fontsize=7.5)
        if st["phase"] == "start":
            title = "start: rank r holds only its own"
        else:
            first = "(r−" if st["phase"] == "reduce-scatter" else "(r+1−"
            title = (f"{st['phase']} step {st['step']}\n"
                     f"rank r sends chunk {first}{st['step']}) mod {p}")
        ax.set_title(title, fontsize=9.5, color="black" if st["phase"] == "start" else colour)
    fig.suptitle(f"Ring all-reduce on {p} ranks: every rank sends one chunk to the right at "
                 "every step (red: the receiver adds it; green: it overwrites)", fontsize=11)
    fig.tight_layout()
    return fig
