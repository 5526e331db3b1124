"""The learner's cluster across hosts: ranks, local ranks, node ranks, and what crosses the link.

Introduced in ``06_two_hosts``. Pure functions of the rank map (``cluster.ranks.to_dicts()``):

* :func:`link_traffic`: every connection a training job opens (the rendezvous store on rank 0's
  host, one gloo pair per two ranks, ipyparallel's control connection from the controller to
  every engine), each marked with whether it crosses the link between hosts;
* :func:`hosts_picture`: the hosts side by side, each rank labelled with rank, local rank and
  node rank, and the connections that cross the link drawn across it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import combinations
from typing import Any

from .style import OKABE_ITO, pyplot, styled

#: The colour of each kind of connection in :func:`hosts_picture`.
TRAFFIC_COLOURS = {"store": OKABE_ITO["vermillion"], "gloo": OKABE_ITO["blue"],
                   "control": OKABE_ITO["green"]}
TRAFFIC_WHAT = {
    "store": "rendezvous store (TCPStore on rank 0's host): every rank, at start-up",
    "gloo": "gloo pair: one TCP connection per two ranks, the collectives' data",
    "control": "ipyparallel control: controller to every engine (cells, results)",
}


def hosts_in_order(ranks: Sequence[Mapping[str, Any]]) -> list[str]:
    """The hosts in node-rank order (the order their first rank appears)."""
    out: list[str] = []
    for r in sorted(ranks, key=lambda r: int(r["rank"])):
        if r["host"] not in out:
            out.append(str(r["host"]))
    return out


def link_traffic(ranks: Sequence[Mapping[str, Any]],
                 controller_host: str | None = None) -> list[dict[str, Any]]:
    """Every connection of the job as ``{"kind", "a", "b", "crosses"}``: ``a``/``b`` are rank
    numbers, or ``"controller"``; ``crosses`` is true when the two ends are on different hosts.

    The store lives on rank 0 (``MASTER_ADDR``), so each other rank's store connection starts
    on its host and ends on rank 0's; gloo connects every pair of ranks; the controller (on
    ``controller_host``, default rank 0's host) has one connection to each engine.
    """
    if not ranks:
        raise ValueError("no ranks: pass cluster.ranks.to_dicts()")
    host = {int(r["rank"]): str(r["host"]) for r in ranks}
    controller_host = controller_host or host[0]
    out: list[dict[str, Any]] = []
    for r in sorted(host)[1:]:
        out.append({"kind": "store", "a": r, "b": 0, "crosses": host[r] != host[0]})
    for a, b in combinations(sorted(host), 2):
        out.append({"kind": "gloo", "a": a, "b": b, "crosses": host[a] != host[b]})
    for r in sorted(host):
        out.append({"kind": "control", "a": "controller", "b": r,
                    "crosses": host[r] != controller_host})
    return out


def crossing_counts(ranks: Sequence[Mapping[str, Any]],
                    controller_host: str | None = None) -> dict[str, tuple[int, int]]:
    """Per kind of connection: (how many cross the link, how many there are)."""
    counts: dict[str, tuple[int, int]] = {}
    for t in link_traffic(ranks, controller_host):
        crossing, total = counts.get(t["kind"], (0, 0))
        counts[t["kind"]] = (crossing + bool(t["crosses"]), total + 1)
    return counts


def _rank_box(ax: Any, x: float, y: float, r: Mapping[str, Any], w: float, h: float) -> None:
    from matplotlib.patches import FancyBboxPatch

    face = "#ffd9d2" if int(r["rank"]) == 0 else "#d7e7ff"
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.06",
                                facecolor=face, edgecolor="0.35"))
    ax.text(x + w / 2, y + h / 2, f"rank {r['rank']}\nlocal rank {r['local_rank']}\n"
            f"node rank {r['node_rank']}", ha="center", va="center", fontsize=8.5,
            fontweight="bold" if int(r["rank"]) == 0 else "normal")


@styled
def hosts_picture(ranks: Sequence[Mapping[str, Any]], controller_host: str | None = None,
                  title: str | None = None) -> Any:
    """The hosts left to right (node rank order), their ranks, and the connections that cross
    the link between them (coloured by kind, counted in the legend). ``ranks``: one mapping
    per rank with ``rank``, ``local_rank``, ``node_rank``, ``host`` and optionally ``addr``
    (``cluster.ranks.to_dicts()``); the controller sits on ``controller_host`` (default rank
    0's host)."""
    plt = pyplot()
    from matplotlib.patches import FancyBboxPatch

    hosts = hosts_in_order(ranks)
    controller_host = controller_host or hosts[0]
    per_host = {h: sorted((r for r in ranks if r["host"] == h), key=lambda r: int(r["rank"]))
                for h in hosts}
    rows = max(len(v) for v in per_host.values())
    bw, bh, hw, gap = 1.9, 0.95, 2.6, 2.2            # rank box, host width, link gap
    height = 1.1 + rows * (bh + 0.25)
    fig, ax = plt.subplots(figsize=(max(6.5, len(hosts) * (hw + gap) + 0.6), height + 1.6))
    ax.set_xlim(-0.2, len(hosts) * (hw + gap) - gap + 0.2)
    ax.set_ylim(-1.45, height + 0.2)
    ax.axis("off")
    spot: dict[Any, tuple[float, float]] = {}
    for i, h in enumerate(hosts):
        x0 = i * (hw + gap)
        ax.add_patch(FancyBboxPatch((x0, 0), hw, height, boxstyle="round,pad=0.02",
                                    facecolor=("#e8f0fb", "#fbefe3", "#e9f6ea")[i % 3],
                                    edgecolor="0.55"))
        addr = per_host[h][0].get("addr", "")
        ax.text(x0 + 0.1, height - 0.1, f"node rank {i}: {h}" + (f"\n{addr}" if addr else ""),
                ha="left", va="top", fontsize=9, fontweight="bold")
        for j, r in enumerate(per_host[h]):
            y = height - 0.75 - (j + 1) * (bh + 0.25) + 0.25
            _rank_box(ax, x0 + (hw - bw) / 2, y, r, bw, bh)
            spot[int(r["rank"])] = (x0 + (hw - bw) / 2 + (bw if i == 0 else 0), y + bh / 2)
        if h == controller_host:
            ax.text(x0 + hw / 2, 0.12, "controller (ipyparallel)", ha="center", va="bottom",
                    fontsize=8, color=TRAFFIC_COLOURS["control"])
            spot["controller"] = (x0 + hw, 0.25)
    traffic = link_traffic(ranks, controller_host)
    for t in traffic:
        if not t["crosses"] or len(hosts) < 2:
            continue
        a, b = spot[t["a"]], spot[t["b"]]
        bend = {"store": 0.25, "gloo": 0.0, "control": -0.25}[t["kind"]]
        ax.annotate("", xy=b, xytext=a, arrowprops={
            "arrowstyle": "-", "color": TRAFFIC_COLOURS[t["kind"]], "lw": 1.3,
            "connectionstyle": f"arc3,rad={bend}", "alpha": 0.85})
    counts = crossing_counts(ranks, controller_host)
    for k, kind in enumerate(("store", "gloo", "control")):
        crossing, total = counts.get(kind, (0, 0))
        ax.text(0, -0.35 - 0.35 * k, f"— {TRAFFIC_WHAT[kind]}: {crossing} of {total} cross "
                "the link", color=TRAFFIC_COLOURS[kind], fontsize=8.5, ha="left", va="center")
    p = len(ranks)
    ax.set_title(title or f"{p} ranks on {len(hosts)} host{'s' if len(hosts) != 1 else ''}: "
                 "what crosses the link between them", fontsize=11)
    fig.tight_layout()
    return fig
