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
