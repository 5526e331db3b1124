"""A pipeline schedule drawn from the ranks' own timestamps (``11_tensor_and_pipeline``).

Input: one result per rank from
:func:`course_utils.checks.parallelism.engine_check_pipeline` (its ``events``: kind ``"F"`` or
``"B"``, microbatch, start, end, in ``time.monotonic`` seconds, one clock for a host's
processes). One lane per rank, a box per microbatch's forward (light) and backward (dark)
labelled with its number; what is blank is the bubble.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .style import ROLE, pyplot, styled, text_color


@styled
def pipeline_schedule(runs: Mapping[str, Sequence[Mapping[str, Any]]],
                      formula: Mapping[str, float] | None = None) -> Any:
    """One panel per schedule (``{"GPipe": results, "1F1B": results}``), rank 0 on top, time
    in ms from the panel's first start; the title of each gives the idle share measured (and
    ``formula[name]`` beside it when given)."""
    from matplotlib.patches import Patch

    from ..torch_dist.parallelism import bubble_measured

    plt = pyplot()
    names = list(runs)
    p = max(len(runs[k]) for k in names)
    fig, axes = plt.subplots(len(names), 1, figsize=(12, 0.8 + (0.55 * p + 0.9) * len(names)),
                             squeeze=False)
    for ax, name in zip(axes[:, 0], names, strict=True):
        lanes = [list(r["events"]) for r in runs[name]]
        t0 = min(e[2] for tl in lanes for e in tl)
        for r, tl in enumerate(lanes):
            for kind, i, start, end in tl:
                face = ROLE["forward" if kind == "F" else "backward"]
                x, w = (start - t0) * 1e3, (end - start) * 1e3
                ax.broken_barh([(x, w)], (r - 0.4, 0.8), facecolors=face, edgecolor="white",
                               linewidth=0.6)
                ax.text(x + w / 2, r, str(i), ha="center", va="center", fontsize=8,
                        color=text_color(face))
        ax.set_yticks(range(p), [f"rank {r}" for r in range(p)])
        ax.set_ylim(p - 0.5, -0.5)
        ax.set_xlabel("ms since the step's first forward")
        title = f"{name}: idle {bubble_measured(lanes):.0%} of rank-time measured"
        if formula and name in formula:
            title += f" ((p-1)/(m+p-1) = {formula[name]:.0%})"
        ax.set_title(title)
    axes[0, 0].legend(handles=[Patch(color=ROLE["forward"], label="forward"),
                               Patch(color=ROLE["backward"], label="backward")],
                      loc="lower right", bbox_to_anchor=(1.0, 1.08), ncol=2)
    fig.tight_layout()
    return fig
