"""Figures of training (units 2-3): replica divergence, per-rank curves."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .style import ROLE, pyplot, rank_color, styled


@styled
def replica_divergence(curves: Mapping[str, Sequence[float]],
                       title: str = "parameter distance between replicas") -> Any:
    """Lines of the largest ||w_rank - w_rank0|| after each step, one line per variant."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    for name, ys in curves.items():
        ax.plot(np.arange(1, len(ys) + 1), ys, marker="o", markersize=3, label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("max_r ||w_r - w_0||")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


@styled
def per_rank_curves(values_by_rank: Sequence[Sequence[float]], ylabel: str,
                    title: str, global_values: Sequence[float] | None = None,
                    xlabel: str = "step") -> Any:
    """One line per rank (its local metric), plus the reduced global metric if given."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    for r, ys in enumerate(values_by_rank):
        ax.plot(np.arange(1, len(ys) + 1), ys, alpha=0.8, color=rank_color(r), label=f"rank {r}")
    if global_values is not None:
        ax.plot(np.arange(1, len(global_values) + 1), global_values, color=ROLE["global"],
                linewidth=2, label="all ranks (reduced)")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig
