"""Pictures of the learner's own TensorFlow cluster (units 4 and 5).

Pure functions of recorded data: the roles (``{"ps": [rank, ...], "worker": [rank, ...]}`` from
:func:`course_utils.tf_dist.plan_roles`), the cluster spec (job -> ``"addr:port"``), the rank
map's host names, and for unit 5 the variables' shards and a snapshot of the coordinator's queue.
None of them talks to a cluster or imports TensorFlow.

* :func:`ps_vs_all_reduce` (``04_tf_classic_ps``, the bridge): the same ranks as a parameter-server
  cluster and as an all_reduce ring.
* :func:`ps_cluster` (``04_tf_classic_ps``): ps/worker/chief tasks on their ranks, with the
  addresses they listen on and the pulls (variables) and pushes (gradients) of one step.
* :func:`coordinator_queue` (``05_tf2_parameter_server_strategy``): the coordinator's queue of
  steps in the kernel, the workers that take them, and each variable's shards with their rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .style import ROLE, pyplot, styled

# Light fills for the boxes; the arrows take the course's colours for pulls and pushes.
PS_COLOUR = "#f9d9c4"      # ps tasks: they hold the variables (a tint of ROLE["ps"])
WORKER_COLOUR = "#cfe3f2"  # worker tasks: they compute gradients (a tint of ROLE["worker"])
CHIEF_COLOUR = "#cdeee3"   # the coordinator / chief (a tint of ROLE["ok"])
RANK_EDGE = "0.55"
PULL = ROLE["pull"]
PUSH = ROLE["push"]
NEXT = ROLE["ok"]


def _check_roles(roles: Mapping[str, Sequence[int]]) -> int:
    if not roles.get("ps") or not roles.get("worker"):
        raise ValueError(f"roles need at least one ps and one worker task, got {dict(roles)}")
    ranks = [r for job in ("ps", "worker") for r in roles[job]]
    if min(ranks) < 0:
        raise ValueError(f"negative rank in roles {dict(roles)}")
    return max(ranks) + 1


def _box(ax: Any, x: float, y: float, w: float, h: float, colour: str, text: str,
         fontsize: float = 9, edge: str = "0.25", style: str = "-", weight: str = "normal") -> None:
    from matplotlib.patches import FancyBboxPatch

    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h,
                                boxstyle="round,pad=0.02,rounding_size=0.08", facecolor=colour,
                                edgecolor=edge, linestyle=style, linewidth=1.2))
    if text:
        ax.text(x, y, text, ha="center", va="center", fontsize=fontsize, weight=weight)


def _arrow(ax: Any, start: tuple[float, float], end: tuple[float, float], colour: str,
           rad: float = 0.0, label: str = "", label_at: float = 0.5, fontsize: float = 8,
           label_dx: float = 0.0) -> None:
    from matplotlib.patches import FancyArrowPatch

    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=12, color=colour,
                                 linewidth=1.4, connectionstyle=f"arc3,rad={rad}",
                                 shrinkA=2, shrinkB=2))
    if label:
        x = start[0] + (end[0] - start[0]) * label_at + label_dx
        y = start[1] + (end[1] - start[1]) * label_at
        ax.text(x, y, label, color=colour, fontsize=fontsize, ha="center", va="center",
                bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.85, "pad": 0.5})


def _legend(ax: Any, items: Sequence[tuple[str, str]], loc: str = "lower center") -> None:
    from matplotlib.lines import Line2D

    handles = [Line2D([0], [0], color=c, linewidth=2, marker=">", markersize=6, label=t)
               for c, t in items]
    ax.legend(handles=handles, loc=loc, fontsize=8, frameon=False, ncol=len(items),
              bbox_to_anchor=(0.5, -0.02))


def _rank_label(rank: int, hosts: Sequence[str] | None) -> str:
    if hosts and rank < len(hosts):
        return f"rank {rank}\n(engine on {hosts[rank]})"
    return f"rank {rank}"


def _task_positions(roles: Mapping[str, Sequence[int]], n_ranks: int, y_ps: float,
                    y_worker: float) -> dict[str, tuple[float, float]]:
    """x = the rank's column (tasks sharing a rank sit side by side), y = the job's row."""
    pos: dict[str, tuple[float, float]] = {}
    for job, y in (("ps", y_ps), ("worker", y_worker)):
        for rank in range(n_ranks):
            mine = [i for i, r in enumerate(roles[job]) if r == rank]
            for k, i in enumerate(mine):
                offset = (k - (len(mine) - 1) / 2) * 1.15
                pos[f"{job}:{i}"] = (rank * 3.0 + offset, y)
    return pos


@styled
def ps_cluster(roles: Mapping[str, Sequence[int]],
               spec: Mapping[str, Sequence[str]] | None = None,
               hosts: Sequence[str] | None = None, chief_worker: int | None = 0,
               title: str = "your TensorFlow cluster: who hosts which task") -> Any:
    """ps and worker tasks drawn inside the rank (engine process) that hosts them.

    Each worker pulls the variables from every ps (orange) and pushes its gradients back
    (blue): the traffic of one training step. ``spec`` adds each task's listening address;
    ``hosts`` (per rank, from the rank map) labels the engines; ``chief_worker`` marks the
    worker that initializes the variables (``None``: no chief among the workers).
    """
    plt = pyplot()
    n_ranks = _check_roles(roles)
    y_ps, y_worker = 2.6, 0.0
    pos = _task_positions(roles, n_ranks, y_ps, y_worker)
    widest = max(sum(1 for r in roles[j] if r == rank) for j in ("ps", "worker")
                 for rank in range(n_ranks))
    col_w = max(2.5, 1.15 * widest + 0.4)
    fig, ax = plt.subplots(figsize=(2.6 * n_ranks + 2.6, 4.4))
    for rank in range(n_ranks):
        _box(ax, rank * 3.0, (y_ps + y_worker) / 2, col_w, 3.9, "white", "", edge=RANK_EDGE,
             style="--")
        ax.text(rank * 3.0, y_ps + 0.75, _rank_label(rank, hosts), ha="center", va="bottom",
                fontsize=9, color="0.3")
    for w in range(len(roles["worker"])):
        for s in range(len(roles["ps"])):
            (xw, yw), (xs, ys) = pos[f"worker:{w}"], pos[f"ps:{s}"]
            first = w == 0 and s == 0
            _arrow(ax, (xs - 0.18, ys - 0.42), (xw - 0.18, yw + 0.42), PULL, rad=0.08,
                   label="pull W, b" if first else "", label_at=0.5, label_dx=-0.55)
            _arrow(ax, (xw + 0.18, yw + 0.42), (xs + 0.18, ys - 0.42), PUSH, rad=0.08,
                   label="push\ngradients" if first else "", label_at=0.5, label_dx=0.55)
    for name, (x, y) in pos.items():
        job, idx = name.split(":")
        text = name
        if job == "worker" and chief_worker is not None and int(idx) == chief_worker:
            text += " (chief)"
        if spec is not None:
            text += f"\n{spec[job][int(idx)]}"
        _box(ax, x, y, 1.4 if spec is not None else 1.05, 0.8,
             PS_COLOUR if job == "ps" else WORKER_COLOUR, text, fontsize=8)
    ax.text(-1.6, y_ps, "ps tasks:\nhold the\nvariables", ha="right", va="center", fontsize=8)
    ax.text(-1.6, y_worker, "worker tasks:\ncompute\ngradients", ha="right", va="center",
            fontsize=8)
    _legend(ax, [(PULL, "before a step: variables, ps -> worker"),
                 (PUSH, "after it: gradients, worker -> ps")])
    ax.set_xlim(-3.1, 3.0 * (n_ranks - 1) + col_w / 2 + 0.3)
    ax.set_ylim(y_worker - 1.6, y_ps + 1.5)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(title)
    fig.tight_layout()
    return fig


@styled
def ps_vs_all_reduce(roles: Mapping[str, Sequence[int]], world_size: int | None = None,
                     title: str = "two ways to share one model") -> Any:
    """Two panels for the same ranks: left, a parameter-server cluster (workers pull the
    variables from the ps and push gradients to it); right, the all_reduce of units 1-3
    (every rank holds the whole model and exchanges gradients with its ring neighbours)."""
    import numpy as np

    plt = pyplot()
    n_ranks = max(_check_roles(roles), int(world_size or 0))
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2))
    # Left: one row of ps tasks above one row of workers.
    n_ps, n_w = len(roles["ps"]), len(roles["worker"])
    xs_ps = [(i - (n_ps - 1) / 2) * 1.6 for i in range(n_ps)]
    xs_w = [(i - (n_w - 1) / 2) * 1.6 for i in range(n_w)]
    for i, x in enumerate(xs_ps):
        _box(left, x, 2.2, 1.3, 0.8, PS_COLOUR, f"ps:{i}\nrank {roles['ps'][i]}\nholds W, b",
             fontsize=8)
    for i, x in enumerate(xs_w):
        _box(left, x, 0.0, 1.3, 0.8, WORKER_COLOUR, f"worker:{i}\nrank {roles['worker'][i]}",
             fontsize=8)
        for j, xp in enumerate(xs_ps):
            first = i == 0 and j == 0
            _arrow(left, (xp - 0.15, 1.78), (x - 0.15, 0.42), PULL, rad=0.05,
                   label="pull W, b" if first else "", label_at=0.5, label_dx=-0.5)
            _arrow(left, (x + 0.15, 0.42), (xp + 0.15, 1.78), PUSH, rad=0.05,
                   label="push\ngradients" if first else "", label_at=0.5, label_dx=0.55)
    span = max(xs_ps + xs_w) + 1.2
    left.set_xlim(-span, span)
    left.set_ylim(-1.3, 3.1)
    left.set_aspect("equal")
    left.axis("off")
    left.set_title("parameter server (units 4-5)\nthe model lives on the ps", fontsize=10)
    left.text(0, -0.85, "each step: every worker pulls the variables,\ncomputes, pushes its "
              "gradients; the ps applies them", ha="center", va="center", fontsize=8)
    # Right: the ranks on a circle, an arrow from each rank to the next.
    angles = np.pi / 2 - 2 * np.pi * np.arange(n_ranks) / n_ranks
    radius = 1.3 if n_ranks > 2 else 1.0
    pts = [(radius * np.cos(a), 1.1 + radius * np.sin(a)) for a in angles]
    for r, (x, y) in enumerate(pts):
        _box(right, x, y, 1.25, 0.72, WORKER_COLOUR, f"rank {r}\nwhole model", fontsize=8)
    if n_ranks == 2:
        (x0, y0), (x1, y1) = pts
        _arrow(right, (x0 + 0.3, y0 - 0.38), (x1 + 0.3, y1 + 0.38), PUSH,
               label="gradient\nchunks", label_dx=0.62)
        _arrow(right, (x1 - 0.3, y1 + 0.38), (x0 - 0.3, y0 - 0.38), PUSH)
    elif n_ranks > 2:
        for r in range(n_ranks):
            (x0, y0), (x1, y1) = np.array(pts[r]), np.array(pts[(r + 1) % n_ranks])
            unit = (np.array([x1, y1]) - np.array([x0, y0]))
            unit = unit / np.linalg.norm(unit)
            a, b = np.array([x0, y0]) + 0.55 * unit, np.array([x1, y1]) - 0.55 * unit
            _arrow(right, tuple(a), tuple(b), PUSH, label="gradient chunks" if r == 0 else "")
    right.set_xlim(-2.4, 2.4)
    right.set_ylim(-1.3, 3.1)
    right.set_aspect("equal")
    right.axis("off")
    right.set_title("all_reduce (units 1-3)\nevery rank holds the model", fontsize=10)
    right.text(0, -0.85, "each step: ranks pass gradient chunks around\nthe ring; every rank "
               "applies the same average", ha="center", va="center", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


@styled
def coordinator_queue(roles: Mapping[str, Sequence[int]],
                      shards: Sequence[Mapping[str, Any]],
                      queue: Mapping[str, int] | None = None,
                      hosts: Sequence[str] | None = None,
                      title: str = "ParameterServerStrategy: coordinator, workers, shards") -> Any:
    """The coordinator (this kernel) with its queue of scheduled steps, the workers that take
    them, and every ps task listing the variable shards it holds, with their row ranges.

    ``shards``: one dict per shard, ``{"var": "W1", "ps": 0, "rows": (0, 32), "shape": (32, 32),
    "bytes": 4096}`` (from :func:`course_utils.tf_dist.variable_shards`). ``queue``: a snapshot,
    ``{"scheduled": n, "done": k}``; ``scheduled - done`` closures were waiting or running.
    """
    plt = pyplot()
    _check_roles(roles)
    n_ps, n_w = len(roles["ps"]), len(roles["worker"])
    by_ps: dict[int, list[Mapping[str, Any]]] = {i: [] for i in range(n_ps)}
    for sh in shards:
        if not 0 <= int(sh["ps"]) < n_ps:
            raise ValueError(f"shard {sh} names ps:{sh['ps']}, but there are {n_ps} ps tasks")
        by_ps[int(sh["ps"])].append(sh)
    lines = max((len(v) for v in by_ps.values()), default=1)
    height = max(n_w * 1.6, n_ps * (0.42 * lines + 1.0), 3.2)
    fig, ax = plt.subplots(figsize=(11, 1.1 * height + 1.4))
    # Coordinator and its queue.
    x_c, x_w, x_p = 0.0, 4.6, 9.0
    _box(ax, x_c, height / 2, 3.1, 2.3, CHIEF_COLOUR, "", edge="0.25")
    ax.text(x_c, height / 2 + 0.85, "coordinator (chief)\nthis notebook's kernel", ha="center",
            va="center", fontsize=9, weight="bold")
    waiting = None
    if queue is not None:
        waiting = max(0, int(queue["scheduled"]) - int(queue["done"]))
        shown = min(waiting, 12)
        for k in range(shown):
            ax.add_patch(plt.Rectangle((x_c - 1.3 + k * 0.2, height / 2 - 0.2), 0.16, 0.36,
                                       facecolor=NEXT, alpha=0.7))
        ax.text(x_c, height / 2 - 0.6,
                f"queue: {waiting} of {queue['scheduled']} scheduled\nsteps not finished yet"
                + (f" ({shown} drawn)" if waiting > shown else ""),
                ha="center", va="center", fontsize=8)
    else:
        ax.text(x_c, height / 2 - 0.3, "queue of scheduled steps\n(schedule -> RemoteValue)",
                ha="center", va="center", fontsize=8)
    # Workers.
    ys_w = [height - (i + 0.5) * height / n_w for i in range(n_w)]
    for i, y in enumerate(ys_w):
        rank = roles["worker"][i]
        where = f"rank {rank}" + (f" on {hosts[rank]}" if hosts and rank < len(hosts) else "")
        _box(ax, x_w, y, 1.9, 0.9, WORKER_COLOUR, f"worker:{i}\n{where}", fontsize=8.5)
        _arrow(ax, (x_c + 1.6, height / 2), (x_w - 1.0, y), NEXT, rad=0.0)
    # ps tasks and their shards.
    ys_p = [height - (i + 0.5) * height / n_ps for i in range(n_ps)]
    box_h = [0.36 * max(1, len(by_ps[i])) + 0.7 for i in range(n_ps)]
    for i, y in enumerate(ys_p):
        rank = roles["ps"][i]
        _box(ax, x_p, y, 3.4, box_h[i], PS_COLOUR, "")
        ax.text(x_p, y + box_h[i] / 2 - 0.25, f"ps:{i} (rank {rank})", ha="center",
                va="center", fontsize=9, weight="bold")
        for k, sh in enumerate(by_ps[i]):
            rows = sh.get("rows")
            shape = tuple(sh.get("shape", ()))
            part = f"rows {rows[0]}-{rows[1] - 1}" if rows and sh.get("split") else "whole"
            ax.text(x_p, y + box_h[i] / 2 - 0.6 - 0.36 * k,
                    f"{sh['var']} {part}  {shape}  {sh.get('bytes', 0):,} B",
                    ha="center", va="center", fontsize=8, family="monospace")
        for yw in ys_w:
            _arrow(ax, (x_w + 1.0, yw + 0.12), (x_p - 1.75, y + 0.12), PUSH, rad=0.0)
    _legend(ax, [(NEXT, "a free worker takes the next step from the queue"),
                 (PUSH, "the step reads every shard and updates it on its own ps")])
    ax.set_xlim(-1.8, x_p + 1.9)
    ax.set_ylim(-0.9, height + 0.3)
    ax.axis("off")
    ax.set_title(title)
    fig.tight_layout()
    return fig
