"""The collectives cheat sheet (unit 1): all seven collectives from one real run, one page.

Input: one record per rank from
:func:`course_utils.torch_dist.record.engine_record_collectives`. One row per collective: every
rank's tensor before (left) and after (right). A value that came from rank ``r``'s input keeps
rank ``r``'s colour wherever it travels; a sum of several ranks' values is drawn dark and
marked Σ. A reference page the learner can keep.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .style import pyplot, rank_color, styled, text_color

#: One line per collective, as the cheat sheet states it (root = rank 0, op = sum).
DEFINITIONS = {
    "broadcast": "every rank gets the root's tensor",
    "scatter": "the root's chunk r goes to rank r",
    "gather": "the root gets every rank's tensor, in rank order",
    "reduce": "the root gets the sum (others: undefined)",
    "all_reduce": "every rank gets the sum",
    "all_gather": "every rank gets every rank's tensor",
    "reduce_scatter": "rank r gets the sum of everyone's chunk r",
}


def origins(records: Sequence[Mapping[str, Any]]) -> dict[float, int]:
    """Which rank each input value belongs to (inputs are distinct by construction)."""
    out: dict[float, int] = {}
    for rec in records:
        for before, _after in rec["trace"].values():
            for v in before or []:
                out.setdefault(float(v), rec["rank"])
    return out


def _strip(ax: Any, x0: float, y: float, values: Sequence[float] | None, owner: dict[float, int],
           cell: float, width: int) -> None:
    from matplotlib.patches import Rectangle

    if values is None:
        ax.text(x0 + cell * width / 2, y, "(nothing)", ha="center", va="center", color="0.55",
                fontsize=10, style="italic")
        return
    for i, v in enumerate(values):
        r = owner.get(float(v))
        face = "#333333" if r is None else rank_color(r)
        ax.add_patch(Rectangle((x0 + i * cell, y - 0.36), cell * 0.94, 0.72, facecolor=face,
                               edgecolor="white", linewidth=1, alpha=1.0 if r is None else 0.85))
        text = f"Σ{v:g}" if r is None else f"{v:g}"
        ax.text(x0 + (i + 0.47) * cell, y, text, ha="center", va="center",
                fontsize=10 if len(text) <= 4 else 8, color=text_color(face),
                fontweight="bold")


@styled
def collectives_cheatsheet(records: Sequence[Mapping[str, Any]],
                           title: str | None = None) -> Any:
    """The seven collectives side by side: one row each, every rank before and after."""
    plt = pyplot()
    from matplotlib.patches import Patch

    recs = sorted(records, key=lambda r: r["rank"])
    p = len(recs)
    names = [n for n in DEFINITIONS if n in recs[0]["trace"]]
    owner = origins(recs)
    widest = max(len(v) for rec in recs for pair in rec["trace"].values() for v in pair if v)
    cell = 1.0
    col_w = widest * cell + 1.2
    fig_w = max((2 * col_w + 1.6) * 0.5 + 1.6, 10.0)  # wide enough for the title on 2 ranks
    fig, axes = plt.subplots(len(names), 1, figsize=(fig_w, (0.34 * p + 0.55) * len(names) + 1.3),
                             squeeze=False)
    for ax, name in zip(axes[:, 0], names, strict=True):
        for r, rec in enumerate(recs):
            before, after = rec["trace"][name]
            _strip(ax, 0.0, r, before, owner, cell, widest)
            _strip(ax, col_w + 1.6, r, after, owner, cell, widest)
        ax.annotate("", xy=(col_w + 1.3, (p - 1) / 2), xytext=(col_w - 0.6, (p - 1) / 2),
                    arrowprops={"arrowstyle": "-|>", "color": "0.3", "linewidth": 2})
        ax.set_xlim(-0.2, 2 * col_w + 1.6)
        ax.set_ylim(p - 0.45, -0.55)
        ax.set_yticks(range(p), [f"rank {r}" for r in range(p)], fontsize=10)
        ax.set_xticks([])
        for side in ("top", "right", "bottom", "left"):
            ax.spines[side].set_visible(False)
        ax.tick_params(length=0)
        ax.set_title(f"{name}: {DEFINITIONS[name]}", loc="left", fontsize=12)
    handles = [Patch(color=rank_color(r), alpha=0.85, label=f"rank {r}'s data")
               for r in range(p)] + [Patch(color="#333333", label="Σ a sum over ranks")]
    fig.legend(handles=handles, loc="lower center", ncol=min(p + 1, 3), frameon=False)
    fig.suptitle(title or f"The seven collectives on {p} ranks, from one run "
                 f"(root = rank 0, op = sum)")
    fig.tight_layout(rect=(0, 0.9 / fig.get_figheight(), 1, 1 - 0.5 / fig.get_figheight()))
    ax0 = axes[0, 0]
    top = ax0.get_position().y1 + 0.3 / fig.get_figheight()
    for x, text in ((widest * cell / 2, "before"), (col_w + 1.6 + widest * cell / 2, "after")):
        fx = fig.transFigure.inverted().transform(ax0.transData.transform((x, 0)))[0]
        fig.text(fx, top, text, ha="center", va="bottom", fontsize=13, weight="bold")
    return fig
