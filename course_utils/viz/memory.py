"""Figures of unit ``10_sharding_and_memory``: the bytes each rank holds, per strategy.

Pure functions of the rows ``torch_dist.sharding.engine_memory`` records (one dict per rank and
strategy: ``rank``, ``strategy``, ``params``, ``grads``, ``optimizer`` bytes)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .style import OKABE_ITO, ROLE, pyplot, styled

PARTS = (("params", "parameters", OKABE_ITO["blue"]), ("grads", "gradients", OKABE_ITO["sky"]),
         ("optimizer", "optimizer state", ROLE["optimizer"]))


@styled
def memory_bars(rows: Sequence[Mapping[str, Any]], labels: Mapping[str, str] | None = None,
                title: str = "bytes each rank holds after a step") -> Any:
    """Stacked bars, one per (strategy, rank): parameters, gradients and optimizer state."""
    plt = pyplot()
    labels = labels or {}
    strategies = list(dict.fromkeys(r["strategy"] for r in rows))
    fig, ax = plt.subplots(figsize=(max(5.0, 1.8 * len(strategies) + 2), 4.0))
    x, ticks, names = 0.0, [], []
    for s in strategies:
        first = x
        for r in sorted((r for r in rows if r["strategy"] == s), key=lambda r: r["rank"]):
            bottom = 0.0
            for key, name, color in PARTS:
                kib = r[key] / 1024
                ax.bar(x, kib, bottom=bottom, color=color, width=0.8,
                       label=name if not ticks else None)
                bottom += kib
            ticks.append(x)
            names.append(f"rank {r['rank']}")
            x += 1
        ax.text((first + x - 1) / 2, -0.13, labels.get(s, s).replace(" (", "\n("),
                transform=ax.get_xaxis_transform(), ha="center", va="top", fontsize=8)
        x += 0.6
    ax.set_xticks(ticks, names, fontsize=8)
    ax.set_ylabel("KiB on this rank")
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def totals(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The mean total bytes per rank of each strategy (what the bars add up to)."""
    out: dict[str, list[float]] = {}
    for r in rows:
        out.setdefault(r["strategy"], []).append(r["params"] + r["grads"] + r["optimizer"])
    return {k: float(np.mean(v)) for k, v in out.items()}
