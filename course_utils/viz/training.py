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


def sampler_counts(per_rank: Sequence[Mapping[str, Mapping[Any, Sequence[int]]]], n: int
                   ) -> dict[str, dict[int, np.ndarray]]:
    """Pure: how often each rank draws each of ``n`` items, per sampler variant and epoch.

    ``per_rank[r][variant][epoch]`` is the list of indices rank ``r``'s sampler gave (pulled
    from the engines: epochs may arrive as strings). Returns ``{variant: {epoch: counts}}``,
    ``counts`` an int array (ranks, n): 0 not drawn by that rank, 1 drawn, 2 or more repeated
    (padding). A column of zeros is an item no rank got (dropped). Introduced in
    ``03_pytorch_ddp``.
    """
    p = len(per_rank)
    out: dict[str, dict[int, np.ndarray]] = {}
    for variant in (per_rank[0] if p else {}):
        out[variant] = {}
        for epoch in per_rank[0][variant]:
            counts = np.zeros((p, n), dtype=int)
            for r in range(p):
                for i in per_rank[r][variant][epoch]:
                    if not 0 <= int(i) < n:
                        raise ValueError(f"rank {r} drew item {i}, outside 0..{n - 1}")
                    counts[r, int(i)] += 1
            out[variant][int(epoch)] = counts
    return out


@styled
def sampler_epochs(per_rank: Sequence[Mapping[str, Mapping[Any, Sequence[int]]]], n: int,
                   title: str = "which items each rank draws, per epoch") -> Any:
    """One panel per (sampler variant, epoch): a row per rank, a column per item. A filled
    square: that rank draws the item, its number the position in the rank's order; a square
    drawn with a thick outline and "+": a repeated item (padding); a grey column: no rank gets
    the item this epoch (dropped). Data: :func:`sampler_counts`' input. Introduced in
    ``03_pytorch_ddp``."""
    from .style import GREY, LIGHT, text_color

    plt = pyplot()
    table = sampler_counts(per_rank, n)
    variants = list(table)
    epochs = sorted(table[variants[0]]) if variants else []
    p = len(per_rank)
    fig, axes = plt.subplots(len(variants), len(epochs), squeeze=False,
                             figsize=(1.2 + 0.34 * n * len(epochs), 0.9 + (0.45 * p + 0.5)
                                      * len(variants)))
    for vi, variant in enumerate(variants):
        for ei, epoch in enumerate(epochs):
            ax, counts = axes[vi][ei], table[variant][epoch]
            for i in np.flatnonzero(counts.sum(axis=0) == 0):
                ax.add_patch(plt.Rectangle((i - 0.5, -0.5), 1, p, color=LIGHT))
            for r in range(p):
                order = [int(v) for v in per_rank[r][variant][_key(per_rank[r][variant], epoch)]]
                for pos, i in enumerate(order):
                    repeat = i in order[:pos] or any(i in _order(per_rank[q], variant, epoch)
                                                     for q in range(r))
                    face = rank_color(r)
                    ax.add_patch(plt.Rectangle((i - 0.45, r - 0.45), 0.9, 0.9, color=face,
                                               ec=ROLE["failed"] if repeat else face,
                                               lw=2.5 if repeat else 0.5))
                    ax.text(i, r, f"{pos}+" if repeat else str(pos), ha="center",
                            va="center", fontsize=8, color=text_color(face))
            ax.set_xlim(-0.6, n - 0.4)
            ax.set_ylim(p - 0.5, -0.5)
            ax.set_yticks(range(p), [f"rank {r}" for r in range(p)])
            ax.set_xticks(range(n))
            ax.tick_params(axis="x", labelsize=8, colors=GREY)
            ax.set_title(f"{variant}\nepoch {epoch}", fontsize=10)
            ax.set_xlabel("item of the dataset", fontsize=9)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def _key(by_epoch: Mapping[Any, Any], epoch: int) -> Any:
    return epoch if epoch in by_epoch else str(epoch)


def _order(rank_orders: Mapping[str, Mapping[Any, Sequence[int]]], variant: str,
           epoch: int) -> list[int]:
    by_epoch = rank_orders[variant]
    return [int(v) for v in by_epoch[_key(by_epoch, epoch)]]
