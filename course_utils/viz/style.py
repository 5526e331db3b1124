"""Shared figure plumbing: one colour-blind-safe palette, slide-size fonts, lazy matplotlib.

Every figure of the course takes its colours from here (the Okabe-Ito palette, safe for the
common forms of colour blindness) and is drawn inside :data:`RC` (fonts readable at slide size).
matplotlib is imported lazily, keeping the notebook's backend.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

#: Okabe & Ito (2008), "Color Universal Design": distinguishable with any common colour blindness.
OKABE_ITO = {
    "black": "#000000", "orange": "#E69F00", "sky": "#56B4E9", "green": "#009E73",
    "yellow": "#F0E442", "blue": "#0072B2", "vermillion": "#D55E00", "purple": "#CC79A7",
}
GREY = "#999999"
LIGHT = "#DDDDDD"

#: The order lines and ranks take (yellow last: weak on white).
CYCLE = [OKABE_ITO[k] for k in ("blue", "orange", "green", "vermillion", "purple", "sky",
                                "black", "yellow")]

#: One colour per meaning, used by every figure that shows that meaning.
ROLE = {
    "compute": OKABE_ITO["blue"], "forward": OKABE_ITO["sky"], "backward": OKABE_ITO["blue"],
    "optimizer": OKABE_ITO["purple"], "comm": OKABE_ITO["orange"], "wait": LIGHT,
    "reduce_scatter": OKABE_ITO["vermillion"], "all_gather": OKABE_ITO["green"],
    "measured": OKABE_ITO["black"], "ring": OKABE_ITO["blue"], "tree": OKABE_ITO["green"],
    "ps": OKABE_ITO["vermillion"], "worker": OKABE_ITO["blue"], "push": OKABE_ITO["orange"],
    "pull": OKABE_ITO["sky"], "async": OKABE_ITO["orange"], "sync": OKABE_ITO["blue"],
    "failed": OKABE_ITO["vermillion"], "retried": OKABE_ITO["orange"], "ok": OKABE_ITO["green"],
    "scheduled": GREY, "global": OKABE_ITO["black"],
}

#: A sequential map that stays readable in grey scale and for colour-blind readers.
SEQUENTIAL = "cividis"

#: rcParams every course figure is drawn with (readable when projected).
RC: dict[str, Any] = {
    "font.size": 12, "axes.titlesize": 14, "axes.labelsize": 12, "xtick.labelsize": 11,
    "ytick.labelsize": 11, "legend.fontsize": 10, "figure.titlesize": 15,
    "axes.spines.top": False, "axes.spines.right": False, "savefig.dpi": 120,
    "savefig.bbox": "tight", "figure.dpi": 100,
}


def pyplot() -> Any:
    """matplotlib.pyplot, imported on first use so that importing the viz package stays light."""
    import matplotlib.pyplot as plt  # the notebook's (or MPLBACKEND's) backend is kept

    return plt


def rank_color(rank: int) -> str:
    """The colour of rank ``rank`` in every per-rank figure."""
    return CYCLE[rank % len(CYCLE)]


F = TypeVar("F", bound=Callable[..., Any])


def styled(fn: F) -> F:
    """Draw the figure function ``fn`` with the course's palette and slide-size fonts."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from cycler import cycler

        plt = pyplot()
        with plt.rc_context({**RC, "axes.prop_cycle": cycler(color=CYCLE)}):
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def text_color(face: Any) -> str:
    """Black or white, whichever reads better on ``face`` (WCAG relative luminance)."""
    from matplotlib.colors import to_rgb

    def lin(c: float) -> float:
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (lin(c) for c in to_rgb(face))
    return "black" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.18 else "white"


def human_bytes(n: float) -> str:
    """``1536 -> '1.5 KiB'`` (binary units, as buffer sizes are quoted in the course)."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" or n == int(n) else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover


def show(fig: Any) -> None:
    """Display a course figure in the notebook once and release it from pyplot (so the inline
    backend does not draw it a second time). Returns nothing: a figure returned by a cell's last
    line would be drawn again as the cell's result. Notebooks call
    ``viz.show(viz.some_figure(...))``: one line per figure (from ``01_collectives`` on)."""
    from IPython.display import display

    try:
        display(fig)
    finally:
        pyplot().close(fig)
