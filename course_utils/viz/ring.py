"""The ring all-reduce replay (unit 1): what every rank holds at each step of the learner's ring.

Input: one record per rank from :func:`course_utils.torch_dist.record.engine_record_ring_frames`
(best on 4 ranks: :func:`course_utils.torch_dist.record.record_ring_replay`). Each element of
the recorded buffer names the set of ranks whose contributions it already holds, so every frame
shows blocks coloured by *how many* ranks are summed in and labelled with *which*: partial sums
travel around the ring during reduce-scatter (red arrows, "add"), finished sums during
all-gather (green arrows, "copy").

* :func:`replay_frames` decodes the records (pure; the tests check it);
* :func:`ring_frame` draws one step, :func:`ring_replay` every step on one page (for slides);
* :func:`animation_html` is a matplotlib ``jshtml`` animation that plays in any notebook
  viewer, in nbval output and in slides, without widgets (:func:`show` displays it: what
  ``01_collectives`` calls); :func:`slider` steps through it with an ipywidgets slider in
  JupyterLab.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .style import ROLE, SEQUENTIAL, pyplot, styled

#: Light backgrounds that tell the two phases apart at a glance.
TINT = {"reduce-scatter": "#FBEEE6", "all-gather": "#E6F5F0", "done": "white"}


def replay_frames(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Decode the recorded ring into ``masks[k][rank][i]`` (bit ``s`` set when rank ``s``'s
    contribution is summed into element ``i`` before step ``k``; the last frame is the result),
    ``values`` (the raw buffers), ``sends[k]`` (``(src, dst, start, size)`` per rank) and
    ``phases[k]`` (``"reduce-scatter"``, ``"all-gather"``, or ``"done"``)."""
    recs = sorted(records, key=lambda r: r["rank"])
    p, n = len(recs), int(recs[0]["n"])
    steps = max(len(r["frames"]) - 1 for r in recs)
    values = np.zeros((steps + 1, p, n))
    sends: list[list[tuple[int, int, int, int]]] = [[] for _ in range(steps)]
    for rec in recs:
        r = rec["rank"]
        frames = list(rec["frames"])
        body, last = frames[:-1], frames[-1]
        body += [body[-1] if body else frames[0]] * (steps - len(body))  # a rank that sent less
        for k, f in enumerate(body):
            values[k, r] = f
        values[steps, r] = last
        for k, s in enumerate(rec["sends"][:steps]):
            sends[k].append((r, int(s["dst"]), int(s["start"]), int(s["size"])))
    scale = np.arange(1, n + 1, dtype=float)
    masks = np.rint(values / scale).astype(np.int64)
    half = steps // 2
    phases = ["reduce-scatter" if k < half else "all-gather" for k in range(steps)] + ["done"]
    return {"p": p, "n": n, "steps": steps, "masks": masks.tolist(), "values": values.tolist(),
            "sends": sends, "phases": phases}


def contributors(mask: int) -> list[int]:
    """The ranks in a mask: ``contributors(0b1011) == [0, 1, 3]``."""
    return [s for s in range(int(mask).bit_length()) if mask >> s & 1]


def _label(mask: int, p: int) -> str:
    who = contributors(mask)
    if len(who) == p:
        return "Σ all"
    return "+".join(str(s) for s in who) if who else "?"


def _blocks(row: Sequence[int], p: int) -> list[tuple[int, int, int]]:
    """Runs of equal masks inside each of the ring's ``p`` chunks: (start, stop, mask)."""
    from ..torch_dist.p2p import chunk_bounds  # pure: no torch

    out: list[tuple[int, int, int]] = []
    for a, b in chunk_bounds(len(row), p):
        start = a
        for i in range(a + 1, b + 1):
            if i == b or row[i] != row[start]:
                out.append((start, i, int(row[start])))
                start = i
    return out


def _draw_frame(ax: Any, replay: Mapping[str, Any], k: int) -> None:
    plt = pyplot()
    from matplotlib.patches import FancyArrowPatch, Rectangle

    p, n, steps = replay["p"], replay["n"], replay["steps"]
    cmap = plt.get_cmap(SEQUENTIAL).reversed()
    masks = replay["masks"][k]
    phase = replay["phases"][k]
    ax.clear()
    ax.set_xlim(-0.6, n + 0.2)
    ax.set_ylim(p + 0.35, -1.05)
    ax.set_aspect("auto")
    for r in range(p):
        for a, b, m in _blocks(masks[r], p):
            share = len(contributors(m)) / p
            face = cmap(0.12 + 0.88 * share)
            ax.add_patch(Rectangle((a + 0.04, r - 0.34), b - a - 0.08, 0.68, facecolor=face,
                                   edgecolor="black", linewidth=1.2))
            ax.text((a + b) / 2, r, _label(m, p), ha="center", va="center", fontsize=12,
                    color="white" if share > 0.55 else "black", fontweight="bold")
    ax.set_yticks(range(p), [f"rank {r}" for r in range(p)])
    ax.set_xticks(np.arange(n) + 0.5, [str(i) for i in range(n)])
    ax.set_xlabel("element of the buffer (labels: ranks whose contributions are summed in)")
    ax.tick_params(length=0)
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    if phase == "done":
        head = f"after all {steps} steps: every rank holds the full sum"
        color = ROLE["measured"]
    else:
        rs = phase == "reduce-scatter"
        color = ROLE["reduce_scatter"] if rs else ROLE["all_gather"]
        what = ("sends a partial sum right; the receiver adds it" if rs
                else "sends a finished chunk right; the receiver copies it")
        head = f"step {k + 1}/{steps} · {phase}: every rank {what}"
        ax.set_facecolor(TINT[phase])
        for src, dst, start, size in replay["sends"][k]:
            x = start + size / 2
            style = dict(arrowstyle="-|>", mutation_scale=18, linewidth=2.2, color=color,
                         linestyle="-" if rs else "--")
            if dst == src + 1:
                ax.add_patch(FancyArrowPatch((x + 0.25, src + 0.3), (x + 0.25, dst - 0.3),
                                             **style))
                ax.text(x + 0.42, (src + dst) / 2, "add" if rs else "copy", color=color,
                        fontsize=10, va="center")
            else:  # the wrap-around: leave the ring at the bottom, come back at the top
                ax.add_patch(FancyArrowPatch((x + 0.25, src + 0.3), (x + 0.25, p + 0.25),
                                             **style))
                ax.text(x + 0.42, p + 0.12, f"to rank {dst}", color=color, fontsize=9,
                        va="center")
                ax.add_patch(FancyArrowPatch((x + 0.25, -0.95), (x + 0.25, dst - 0.3), **style))
                ax.text(x + 0.42, -0.75, f"from rank {src}", color=color, fontsize=9,
                        va="center")
    if phase == "done":
        ax.set_facecolor("white")
    ax.set_title(head, color=color, fontsize=13, loc="left")


@styled
def ring_frame(replay: Mapping[str, Any], k: int, title: str | None = None) -> Any:
    """One step of the replay: every rank's buffer before step ``k`` (``k = steps``: after),
    with the messages of step ``k`` as arrows."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(1.15 * replay["n"] + 3.2, 0.9 * replay["p"] + 1.8))
    _draw_frame(ax, replay, k)
    _colorbar(fig, ax, replay["p"])
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def _colorbar(fig: Any, ax: Any, p: int) -> None:
    plt = pyplot()
    from matplotlib.colors import BoundaryNorm

    cmap = plt.get_cmap(SEQUENTIAL).reversed()
    colors = [cmap(0.12 + 0.88 * c / p) for c in range(1, p + 1)]
    from matplotlib.colors import ListedColormap

    norm = BoundaryNorm(np.arange(0.5, p + 1), p)
    sm = plt.cm.ScalarMappable(norm=norm, cmap=ListedColormap(colors))
    cb = fig.colorbar(sm, ax=ax, ticks=range(1, p + 1), fraction=0.035, pad=0.02)
    cb.set_label("ranks summed in")


def _legend(ax: Any, p: int) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    cmap = pyplot().get_cmap(SEQUENTIAL).reversed()
    handles = [Patch(facecolor=cmap(0.12 + 0.88 * c / p), edgecolor="black",
                     label=("1 rank's own value" if c == 1 else f"{c} ranks' contributions")
                     + (" (the full sum)" if c == p else "")) for c in range(1, p + 1)]
    handles += [Line2D([], [], color=ROLE["reduce_scatter"], linewidth=2.2,
                       label="reduce-scatter message (added)"),
                Line2D([], [], color=ROLE["all_gather"], linewidth=2.2, linestyle="--",
                       label="all-gather message (copied)")]
    ax.legend(handles=handles, loc="center", fontsize=12, frameon=False,
              title="block colour = ranks summed in", title_fontsize=12)


@styled
def ring_replay(replay: Mapping[str, Any], title: str | None = None) -> Any:
    """Every step of the replay on one page (small multiples), reduce-scatter then all-gather
    then the result: the static version for PNGs and slides."""
    plt = pyplot()
    frames = replay["steps"] + 1
    cols = 2 if frames > 3 else frames
    rows = -(-frames // cols)
    w, h = 1.0 * replay["n"] + 2.6, 0.75 * replay["p"] + 1.7
    fig, axes = plt.subplots(rows, cols, figsize=(w * cols, h * rows), squeeze=False)
    for k in range(rows * cols):
        ax = axes[k // cols][k % cols]
        if k < frames:
            _draw_frame(ax, replay, k)
            ax.title.set_fontsize(10.5)
            ax.set_xlabel("")
        else:
            ax.axis("off")
    if rows * cols > frames:
        _legend(axes[-1][-1], replay["p"])
    fig.suptitle(title or f"ring all-reduce on {replay['p']} ranks, step by step "
                 f"(labels: which ranks' contributions each chunk holds)")
    fig.tight_layout()
    return fig


def animation_html(replay: Mapping[str, Any], interval_ms: int = 1400,
                   title: str | None = None) -> str:
    """A self-contained HTML animation (matplotlib ``jshtml``: play, pause, step buttons and a
    frame slider) that plays without ipywidgets: in nbval output, exported notebooks and slides.

    Each frame is drawn once (``FuncAnimation.to_jshtml`` draws each frame three times here: for
    its own redraw, for the course's ``savefig.bbox = "tight"`` and for the PNG)."""
    import tempfile
    from pathlib import Path

    plt = pyplot()
    from cycler import cycler
    from matplotlib import animation

    from .style import CYCLE, RC

    with plt.rc_context({**RC, "axes.prop_cycle": cycler(color=CYCLE),
                         "animation.embed_limit": 50, "savefig.bbox": "standard"}):
        fig, ax = plt.subplots(figsize=(1.15 * replay["n"] + 3.2, 0.9 * replay["p"] + 1.8))
        try:
            _colorbar(fig, ax, replay["p"])
            if title:
                fig.suptitle(title)
            _draw_frame(ax, replay, 0)
            fig.tight_layout()
            fig.set_layout_engine(None)  # laid out once: saving a frame then draws it once
            writer = animation.HTMLWriter(fps=1000 / interval_ms, embed_frames=True,
                                          default_mode="once")
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp, "ring.html")
                with writer.saving(fig, str(path), dpi=90):
                    for k in range(replay["steps"] + 1):
                        _draw_frame(ax, replay, k)
                        writer.grab_frame()
                html = path.read_text()
        finally:
            plt.close(fig)
    return html


def slider(replay: Mapping[str, Any]) -> Any:
    """An ipywidgets slider over the steps, redrawing :func:`ring_frame` (JupyterLab)."""
    import ipywidgets as widgets
    from IPython.display import display

    plt = pyplot()
    out = widgets.Output()
    step = widgets.IntSlider(value=0, min=0, max=replay["steps"], description="step",
                             continuous_update=False)

    def show(change: Any = None) -> None:
        with out:
            out.clear_output(wait=True)
            fig = ring_frame(replay, step.value)
            display(fig)
            plt.close(fig)

    step.observe(show, names="value")
    show()
    return widgets.VBox([step, out])


def show(replay: Mapping[str, Any], interval_ms: int = 1400) -> None:
    """Display the replay in a notebook as :func:`animation_html` (play, pause, step back and
    forward, a frame slider): it plays in JupyterLab, in a saved or exported notebook and in
    slides alike. :func:`slider` is the ipywidgets version. Introduced in ``01_collectives``."""
    from IPython.display import HTML, display

    display(HTML(animation_html(replay, interval_ms=interval_ms)))
