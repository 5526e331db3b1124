"""Pictures of the learner's own cluster and training step, drawn from live data.

Pure functions: they take what the kernel already holds (the rank map as dicts, shard sizes
pulled from the engines) and return a matplotlib ``Figure``; nothing here talks to a cluster.
:func:`cluster_picture` is introduced in ``00_cluster_tour`` (one host or several: the two-host
unit reuses it), :func:`data_parallel_picture` in ``02_data_parallel_from_scratch``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .style import ROLE, pyplot, styled

_HOST_COLOURS = ("#e8f0fb", "#fbefe3", "#e9f6ea", "#f4e9f7")


def _box(ax: Any, x: float, y: float, w: float, h: float, text: str, face: str,
         edge: str = "0.35", size: float = 9, weight: str = "normal", lw: float = 1.0) -> None:
    from matplotlib.patches import FancyBboxPatch

    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08",
                                facecolor=face, edgecolor=edge, linewidth=lw))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size,
            fontweight=weight)


def _arrow(ax: Any, start: tuple[float, float], end: tuple[float, float], colour: str = "0.3",
           label: str = "", style: str = "-|>") -> None:
    ax.annotate("", xy=end, xytext=start,
                arrowprops={"arrowstyle": style, "color": colour, "lw": 1.1,
                            "shrinkA": 2, "shrinkB": 2})
    if label:
        ax.text((start[0] + end[0]) / 2 + 0.08, (start[1] + end[1]) / 2, label, fontsize=7.5,
                color=colour, ha="left", va="center")


def device_label(gpus: int, local_rank: int, backend: str | None = None) -> str:
    """What a rank computes on: ``GPU <local rank>`` when its host has that GPU (and the
    backend is not gloo-only), else ``CPU``."""
    if gpus > local_rank and backend != "gloo":
        return f"GPU {local_rank} (of {gpus})"
    return "CPU (no GPU)" if gpus == 0 else f"CPU ({gpus} GPUs, none used)"


def cluster_picture(ranks: Sequence[Mapping[str, Any]], kernel_host: str | None = None,
                    controller_host: str | None = None, backend: str | None = None,
                    title: str | None = None) -> Any:
    """The kernel, the controller and every engine on its host, with rank, local rank, engine
    id, pid and device.

    ``ranks`` is one mapping per rank, in rank order, with at least ``rank``, ``local_rank``,
    ``host``, ``engine_id``, ``pid`` and ``gpus`` (``cluster.ranks.to_dicts()``). Hosts are
    drawn left to right in the order their first rank appears; the kernel and the controller
    sit on ``kernel_host``/``controller_host`` (default: rank 0's host). Arrows: the kernel
    sends cells to the controller, which passes them to every engine.
    """
    plt = pyplot()
    if not ranks:
        raise ValueError("no ranks to draw: pass cluster.ranks.to_dicts()")
    hosts: list[str] = []
    for r in ranks:
        if r["host"] not in hosts:
            hosts.append(str(r["host"]))
    kernel_host = kernel_host or hosts[0]
    controller_host = controller_host or kernel_host
    for h in (kernel_host, controller_host):
        if h not in hosts:
            hosts.append(h)
    per_host = {h: [r for r in ranks if r["host"] == h] for h in hosts}
    cols = max(2, max(len(v) for v in per_host.values()))   # engines side by side in a host

    bw, bh, gap = 2.2, 1.0, 0.25               # engine box and the gap between boxes
    hw = cols * (bw + gap) + gap                # host width
    height = 3.3                                # host title, kernel/controller row, engines
    fig, ax = plt.subplots(figsize=(max(5.5, 0.7 + len(hosts) * (hw + 0.4) * 1.05), 3.9))
    ax.set_xlim(0, len(hosts) * (hw + 0.4) + 0.2)
    ax.set_ylim(0, height + 0.15)
    ax.axis("off")

    tops: dict[int, tuple[float, float]] = {}
    spots: dict[str, tuple[float, float]] = {}
    for i, h in enumerate(hosts):
        x0 = 0.3 + i * (hw + 0.4)
        _box(ax, x0, 0.1, hw, height - 0.1, "", _HOST_COLOURS[i % len(_HOST_COLOURS)],
             edge="0.55")
        addr = per_host[h][0]["addr"] if per_host[h] and per_host[h][0].get("addr") else ""
        ax.text(x0 + 0.12, height - 0.12, f"host {h}" + (f"  ({addr})" if addr else ""),
                ha="left", va="top", fontsize=9.5, fontweight="bold")
        roles = [("kernel", "kernel\n(this notebook)", "#fff6cc")] if h == kernel_host else []
        if h == controller_host:
            roles.append(("controller", "controller\n(ipyparallel)", "#f2f2f2"))
        for k, (role, text, face) in enumerate(roles):
            bx = x0 + gap + k * (bw + gap)
            _box(ax, bx, 1.75, bw, 0.8, text, face, size=8.5)
            spots[role] = (bx + bw / 2, 1.75)
            spots[role + "_right"] = (bx + bw, 2.15)
            spots[role + "_left"] = (bx, 2.15)
        for j, r in enumerate(per_host[h]):
            bx = x0 + gap + j * (bw + gap)
            dev = device_label(int(r.get("gpus", 0)), int(r["local_rank"]), backend)
            text = (f"rank {r['rank']}\nlocal rank {r['local_rank']}\n"
                    f"engine {r['engine_id']}, pid {r['pid']}\n{dev}")
            face = "#d7e7ff" if r["rank"] else "#ffd9d2"
            _box(ax, bx, 0.25, bw, bh + 0.1, text, face, size=8,
                 weight="bold" if r["rank"] == 0 else "normal")
            tops[int(r["rank"])] = (bx + bw / 2, 0.25 + bh + 0.1)
    if "kernel" in spots and "controller" in spots:
        _arrow(ax, spots["kernel_right"], spots["controller_left"])
        ax.text((spots["kernel_right"][0] + spots["controller_left"][0]) / 2,
                spots["kernel_right"][1] + 0.08, "cells", fontsize=7.5, color="0.3",
                ha="center", va="bottom")
    src = spots.get("controller", spots.get("kernel"))
    if src is not None:
        for _rank, end in sorted(tops.items()):
            _arrow(ax, src, end, colour="0.55")
    p = len(ranks)
    master = ranks[0].get("master_addr") or ranks[0].get("addr")
    head = title or (f"your cluster: {p} rank{'s' if p != 1 else ''} on {len(per_host)} "
                     f"host{'s' if len(per_host) != 1 else ''}"
                     + (f", backend {backend}" if backend else "")
                     + (f"; master address {master} (rank 0's host)" if master else ""))
    ax.set_title(head, fontsize=11)
    fig.tight_layout()
    return fig


def data_parallel_picture(shard_sizes: Sequence[int], batch: int,
                          n_examples: int | None = None, lr: float | None = None,
                          title: str | None = None) -> Any:
    """One data-parallel training step with this run's numbers: each rank's shard, its batch
    and gradient, the all_reduce that averages the gradients, and the identical update.

    ``shard_sizes`` holds one shard size per rank (rank order); ``batch`` is the per-rank batch;
    ``n_examples`` (the dataset's size) adds how many examples the equal split dropped.
    """
    plt = pyplot()
    p = len(shard_sizes)
    if p == 0 or batch <= 0:
        raise ValueError("need at least one shard and a positive batch size")
    col, w = 2.5, 2.2
    width = max(p * col, 6.0)
    fig, ax = plt.subplots(figsize=(max(6.5, 1.9 * p + 1.5), 5.6))
    ax.set_xlim(0, width)
    ax.set_ylim(0, 6.6)
    ax.axis("off")
    x_of = [(width - p * col) / 2 + r * col + (col - w) / 2 for r in range(p)]
    if n_examples is not None:
        used = sum(shard_sizes)
        _box(ax, 0.1, 5.7, width - 0.2, 0.7,
             f"dataset: {n_examples} examples -> {p} shards, {used} used\n"
             f"{n_examples - used} dropped, so every rank runs the same number of steps",
             "#f2f2f2", size=8.5)
    ar_y = 2.2
    for r, size in enumerate(shard_sizes):
        x = x_of[r]
        _box(ax, x, 4.7, w, 0.8, f"rank {r}: shard of\n{size} examples", "#e8f0fb", size=8.5)
        _box(ax, x, 3.35, w, 0.95, f"batch of {batch}\nforward, backward\n-> gradient g{r}",
             "#fff6cc", size=8.5)
        _box(ax, x, 0.35, w, 0.95, "w <- w - lr * g_avg\n(same on every rank)", "#e9f6ea",
             size=8.5)
        _arrow(ax, (x + w / 2, 4.7), (x + w / 2, 4.3))
        _arrow(ax, (x + w / 2, 3.35), (x + w / 2, ar_y + 0.8), label=f"g{r}")
        _arrow(ax, (x + w / 2, ar_y), (x + w / 2, 1.3), label="g_avg")
    terms = " + ".join(f"g{r}" for r in range(min(p, 4))) + (" + ..." if p > 4 else "")
    _box(ax, x_of[0], ar_y, x_of[-1] + w - x_of[0], 0.8,
         f"all_reduce (SUM), then / {p}:   g_avg = ({terms}) / {p}\n"
         "every rank now holds the same g_avg", "#ffd9d2", size=9, weight="bold")
    head = title or (f"one data-parallel step on {p} ranks"
                     + (f" (lr {lr:g})" if lr is not None else ""))
    ax.set_title(head, fontsize=11)
    fig.tight_layout()
    return fig


def blocking_ring(p: int, send_first: Sequence[bool] | None = None) -> list[dict[str, Any]]:
    """Where each rank of a ring shift with *blocking* calls ends up (pure).

    Rank ``r`` calls ``send(right)`` and ``recv(left)`` (right ``(r + 1) % p``), in that order
    when ``send_first[r]`` (default: every rank sends first), else the other way round. A send
    completes only when its receiver sits in the matching recv (gloo's rule at any size).
    Returns per rank ``{"rank", "calls", "stuck_in", "waits_for"}``: ``stuck_in`` is ``"send"``
    or ``"recv"`` for a rank that can never move on, ``None`` for one that finished."""
    if p < 2:
        raise ValueError(f"a ring needs p >= 2 ranks, got {p}")
    first = [True] * p if send_first is None else [bool(x) for x in send_first]
    calls = [["send", "recv"] if first[r] else ["recv", "send"] for r in range(p)]
    at = [0] * p   # index of the call each rank is blocked in (2: done)
    moved = True
    while moved:
        moved = False
        for r in range(p):
            right = (r + 1) % p
            if at[r] < 2 and calls[r][at[r]] == "send" and at[right] < 2 \
                    and calls[right][at[right]] == "recv":
                at[r] += 1      # the message is handed over: both calls return
                at[right] += 1
                moved = True
    return [{"rank": r, "calls": calls[r], "stuck_in": calls[r][at[r]] if at[r] < 2 else None,
             "waits_for": ((r + 1) % p if calls[r][at[r]] == "send" else (r - 1) % p)
             if at[r] < 2 else None} for r in range(p)]


@styled
def deadlock_picture(p: int = 2, send_first: Sequence[bool] | None = None) -> Any:
    """The ring shift of :func:`blocking_ring` on ``p`` ranks: each rank's two calls in order,
    the one it is stuck in highlighted, the one it never reaches greyed out, and an arrow from
    every stuck rank to the rank it waits for. With every rank sending first the arrows close a
    cycle: the deadlock. Pure; introduced in ``01_collectives``."""
    import math

    plt = pyplot()
    state = blocking_ring(p, send_first)
    fig, ax = plt.subplots(figsize=(3.2 * p + 1.5, 3.4))
    ax.set_axis_off()
    width, gap = 2.6, 0.8
    xs = [r * (width + gap) for r in range(p)]
    stuck = ROLE["failed"]
    for r, st in enumerate(state):
        x = xs[r]
        _box(ax, x, 0.0, width, 2.3, "", "#f4f4f4")
        ax.text(x + width / 2, 2.05, f"rank {r}", ha="center", va="center", fontsize=11,
                fontweight="bold")
        right, left = (r + 1) % p, (r - 1) % p
        reached = True
        for k, call in enumerate(st["calls"]):
            y = 1.35 - 0.75 * k
            code = f"dist.send(x, dst={right})" if call == "send" else \
                f"dist.recv(y, src={left})"
            here = st["stuck_in"] == call
            face = "#f9d5c4" if here else ("white" if reached else "#e6e6e6")
            note = "  ← waits here" if here else ("" if reached else "  (never reached)")
            _box(ax, x + 0.1, y - 0.27, width - 0.2, 0.54, code + note, face,
                 edge=stuck if here else "0.6", size=8, lw=1.8 if here else 0.8)
            if here:
                reached = False
    for st in state:
        if st["waits_for"] is None:
            continue
        a, b = st["rank"], st["waits_for"]
        y = 2.35 if b > a else -0.05   # rightwards over the boxes, the way back under them
        ax.annotate("", xy=(xs[b] + width / 2, y), xytext=(xs[a] + width / 2, y), arrowprops={
            "arrowstyle": "-|>", "color": stuck, "lw": 1.4, "connectionstyle": "arc3,rad=-0.3"})
    lift = 0.35 * math.ceil(p / 2) + 0.5
    ax.set_ylim(-0.05 - lift, 2.35 + lift)
    ax.set_xlim(-0.3, xs[-1] + width + 0.3)
    done = all(st["stuck_in"] is None for st in state)
    ax.set_title("every send met its recv: no deadlock" if done else
                 "deadlock: every rank waits in a call for a rank that waits too "
                 "(arrows: who waits for whom)", fontsize=11)
    return fig
