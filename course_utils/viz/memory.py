"""Figures of unit ``10_sharding_and_memory``: the bytes each rank holds, per strategy, and the
events of one FSDP step.

Pure functions of what the engines record: the rows ``torch_dist.sharding.engine_memory``
returns (one dict per rank and strategy: ``rank``, ``strategy``, ``params``, ``grads``,
``buckets``, ``optimizer`` bytes) and the events ``torch_dist.fsdp_lifecycle`` returns."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .style import OKABE_ITO, ROLE, pyplot, rank_color, styled, text_color

PARTS = (("params", "parameters", OKABE_ITO["blue"]), ("grads", "gradients", OKABE_ITO["sky"]),
         ("buckets", "DDP's gradient buckets", OKABE_ITO["yellow"]),
         ("optimizer", "optimizer state", ROLE["optimizer"]))


@styled
def memory_bars(rows: Sequence[Mapping[str, Any]], labels: Mapping[str, str] | None = None,
                title: str = "bytes each rank holds after a step") -> Any:
    """Stacked bars, one per (strategy, rank): parameters, gradients, DDP's gradient buckets
    (0 where a row has none) and optimizer state."""
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
                kib = r.get(key, 0) / 1024
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
        out.setdefault(r["strategy"], []).append(sum(r.get(k, 0) for k, _, _ in PARTS))
    return {k: float(np.mean(v)) for k, v in out.items()}


#: How :func:`fsdp_lifecycle` marks each event kind: (label in the box, colour).
LIFECYCLE_MARKS = {"all_gather": ("gather", ROLE["all_gather"]),
                   "compute": ("fwd/bwd", ROLE["compute"]),
                   "reduce_scatter": ("reduce-\nscatter", ROLE["reduce_scatter"])}


@styled
def fsdp_lifecycle(ranks: Sequence[Mapping[str, Any]],
                   title: str = "one FSDP training step, event by event") -> Any:
    """Each rank's events of one FSDP step (what ``torch_dist.fsdp_lifecycle.
    engine_fsdp_lifecycle`` records), one row per layer, in the order they happened: the
    gathers, the computations, a grey bar while the layer's full weights exist (from the
    gather's result to the free), the reduce-scatters; below, the full weights' bytes alive
    after each event beside the whole model's. Introduced in ``10_sharding_and_memory``."""
    plt = pyplot()
    n_layers = len(ranks[0]["layer_bytes"])
    fig, axes = plt.subplots(len(ranks) + 1, 1, sharex=True,
                             figsize=(11.0, 1.0 + 1.1 * n_layers * len(ranks) / 2 + 2.2),
                             gridspec_kw={"height_ratios": [n_layers] * len(ranks) + [3]})
    for ax, r in zip(axes, ranks, strict=False):
        events = r["events"]
        backward = [k for k, e in enumerate(events) if e["phase"] == "backward"]
        if backward:
            ax.axvspan(backward[0] - 0.5, len(events) - 0.5, color="#F3F3F3", zorder=0)
        start: dict[int, int] = {}
        for k, e in enumerate(events):
            y = e["layer"]
            if e["kind"] == "full":
                start[y] = k
            elif e["kind"] == "free":
                first = start.pop(y, k)
                ax.barh(y, k - first, left=first, height=0.7, color="#BBBBBB", zorder=1)
                ax.plot(k, y, marker="x", color="black", zorder=3)
            elif e["kind"] in LIFECYCLE_MARKS:
                label, color = LIFECYCLE_MARKS[e["kind"]]
                if e["kind"] == "compute":
                    label = "fwd" if e["phase"] == "forward" else "bwd"
                ax.barh(y, 0.9, left=k - 0.45, height=0.5, color=color, zorder=2)
                ax.text(k, y, label, ha="center", va="center", fontsize=7,
                        color=text_color(color), zorder=4)
        ax.set_yticks(range(n_layers), [f"layer {i}" for i in range(n_layers)], fontsize=9)
        ax.set_ylim(n_layers - 0.5, -0.5)
        ax.set_title(f"rank {r['rank']}: forward (white), backward (shaded); grey bar: full "
                     f"weights held, x: freed", fontsize=10, loc="left")
    ax = axes[-1]
    for r in ranks:
        ax.step(range(len(r["alive"])), [b / 1024 for b in r["alive"]], where="post",
                color=rank_color(r["rank"]), label=f"rank {r['rank']}")
    ax.axhline(ranks[0]["model_bytes"] / 1024, color="black", linestyle="--",
               label="every layer's full weights")
    ax.set_ylabel("full weights\nheld (KiB)")
    ax.set_xlabel("events of one step, in the order they happened on the rank")
    ax.legend(fontsize=8, loc="upper left")
    fig.suptitle(title)
    fig.tight_layout()
    return fig
