"""Parameter-server figures (units 4 and 5): traffic, staleness, step timelines, placement and
the coordinator's closures.

Inputs come from :mod:`course_utils.tf_dist.record`: ``engine_record_ps`` (one record per
worker, async and sync), ``engine_placement`` (the seed's graph vs the repaired one) and, for
unit 5, the rows of ``timed`` closures plus the events of ``record_coordinator``. Pure
functions: nothing here talks to a cluster or imports TensorFlow.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .style import GREY, LIGHT, ROLE, human_bytes, pyplot, rank_color, styled

Records = Sequence[Mapping[str, Any] | None]


def short_task(task: str) -> str:
    """``"/job:ps/task:1"`` -> ``"ps:1"``."""
    parts = dict(p.split(":", 1) for p in task.strip("/").split("/") if ":" in p)
    return f"{parts.get('job', task)}:{parts.get('task', '0')}" if parts else task


def traffic_per_step(record: Mapping[str, Any]) -> dict[tuple[str, str], int]:
    """Bytes one step of this worker moves, by ``("pull"|"push", ps task)``: pulled = sent by a
    ps to this worker, pushed = sent by this worker to a ps."""
    me = f"worker:{record['worker']}"
    out: dict[tuple[str, str], int] = {}
    for m in record["traffic"]:
        src, dst = short_task(m["from"]), short_task(m["to"])
        if src.startswith("ps") and dst == me:
            key = ("pull", src)
        elif src == me and dst.startswith("ps"):
            key = ("push", dst)
        else:
            continue
        out[key] = out.get(key, 0) + int(m["bytes"])
    return out


def total_traffic(record: Mapping[str, Any]) -> dict[tuple[str, str], int]:
    """Bytes over the whole run: :func:`traffic_per_step` times the steps this worker ran."""
    n = len(record["steps"])
    return {k: v * n for k, v in traffic_per_step(record).items()}


def _workers(records: Records) -> list[Mapping[str, Any]]:
    return sorted((r for r in records if r), key=lambda r: r["worker"])


def _check_runs(runs: Mapping[str, Records]) -> list[str]:
    """The modes of ``runs``; a clear error where there is nothing to draw (an empty dict, or a
    mode without a worker's record) instead of matplotlib's about a grid of 0 panels."""
    if not runs:
        raise ValueError("no recorded runs to draw: pass {mode: the records of "
                         "tf_dist.record.engine_record_ps}, e.g. {'async': [...], 'sync': [...]}")
    empty = [name for name, recs in runs.items() if not _workers(recs)]
    if empty:
        raise ValueError(f"no worker's record for {empty}: engine_record_ps returns None on a "
                         "rank without a worker; keep the records of the ranks with one")
    return list(runs)


def throughput(records: Records) -> dict[str, float]:
    """Steps per second of one recorded run (async or sync), measured once every worker is past
    its first step (which sets the graph up on every task): ``updates_per_s`` (``global_step``,
    the updates applied to the variables) and ``gradients_per_s`` (the workers' steps
    together), over ``seconds``."""
    recs = [r for r in _workers(records) if r["steps"]]
    if not recs:
        raise ValueError("no recorded steps: run tf_dist.record.engine_record_ps first")
    t0 = max(r["steps"][0]["end"] for r in recs)
    later = [s for r in recs for s in r["steps"] if s["start"] >= t0]
    if not later:
        return {"updates_per_s": 0.0, "gradients_per_s": 0.0, "seconds": 0.0,
                "updates": 0.0, "gradients": 0.0}
    t1 = max(s["end"] for s in later)
    updates = max(s["gs_after"] for s in later) - min(s["gs_before"] for s in later)
    seconds = max(t1 - t0, 1e-9)
    return {"updates_per_s": updates / seconds, "gradients_per_s": len(later) / seconds,
            "seconds": seconds, "updates": float(updates), "gradients": float(len(later))}


def _shards(runs: Mapping[str, Records]) -> list[str]:
    return sorted({k[1] for recs in runs.values() for r in _workers(recs)
                   for k in traffic_per_step(r)})


@styled
def ps_traffic(runs: Mapping[str, Records], title: str | None = None) -> Any:
    """Left: bytes one step moves between each worker and each ps shard (pulled: variables to
    the worker; pushed: gradients to the ps), from the graph. Right: bytes through each ps shard
    over the run, async vs sync, as the steps really happened."""
    plt = pyplot()
    names = _check_runs(runs)
    shards = _shards(runs)
    first = _workers(runs[names[0]])
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(14, 4.8), gridspec_kw={"width_ratios": [1, 1.3]})
    rows = [(rec, shard) for rec in first for shard in shards]
    for i, (rec, shard) in enumerate(rows):
        per = traffic_per_step(rec)
        pull, push = per.get(("pull", shard), 0), per.get(("push", shard), 0)
        ax.barh(i - 0.2, pull, 0.38, color=ROLE["pull"], edgecolor="black", linewidth=0.6)
        ax.barh(i + 0.2, push, 0.38, color=ROLE["push"], edgecolor="black", linewidth=0.6,
                hatch="//")
        for dy, v in ((-0.2, pull), (0.2, push)):
            ax.text(v, i + dy, f" {v:,} B", va="center", fontsize=10)
    ax.set_yticks(range(len(rows)), [f"worker:{r['worker']} ↔ {sh}" for r, sh in rows])
    ax.set_ylim(len(rows) - 0.4, -1.6)  # room at the top for the legend
    ax.set_xlabel("bytes per step")
    ax.set_xlim(0, ax.get_xlim()[1] * 1.3)
    ax.set_title(f"one step, batch {first[0]['batch'] if first else '?'}: what each shard "
                 "moves")
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(facecolor=ROLE["pull"], edgecolor="black",
                             label="pulled: variables ps → worker"),
                       Patch(facecolor=ROLE["push"], edgecolor="black", hatch="//",
                             label="pushed: gradients worker → ps")], loc="upper right")

    styles = ["-", "--", ":", "-."]
    t_all = [s["start"] for recs in runs.values() for r in _workers(recs) for s in r["steps"]]
    for i, name in enumerate(names):
        recs = _workers(runs[name])
        t0 = min((s["start"] for r in recs for s in r["steps"]), default=0.0)
        for j, shard in enumerate(shards):
            events = []
            for rec in recs:
                per = traffic_per_step(rec)
                b = per.get(("pull", shard), 0) + per.get(("push", shard), 0)
                events += [(s["end"] - t0, b) for s in rec["steps"]]
            events.sort()
            xs = [0.0] + [e[0] for e in events]
            ys = np.cumsum([0] + [e[1] for e in events])
            ax2.step(xs, ys / 1024, where="post", linestyle=styles[i % 4], linewidth=2.2,
                     color=rank_color(j), label=f"{shard}, {name}")
    ax2.set_xlabel("time since the run's first step (s)")
    ax2.set_ylabel("bytes in + out of the shard (KiB)")
    ax2.set_title("through each ps shard over the run")
    ax2.grid(alpha=0.3)
    ax2.legend(loc="upper left")
    if not t_all:
        ax2.text(0.5, 0.5, "(no steps)", transform=ax2.transAxes, ha="center")
    fig.suptitle(title or "Parameter-server traffic: bytes per step from each worker's graph, "
                 "times the steps it ran")
    fig.tight_layout()
    return fig


def staleness_counts(records: Records) -> dict[str, Any]:
    """Histogram of the staleness of the updates that reached the variables, plus how many
    gradients sync mode dropped as stale."""
    values = [int(s["staleness"]) for r in _workers(records) for s in r["steps"]
              if not s.get("dropped")]
    dropped = sum(1 for r in _workers(records) for s in r["steps"] if s.get("dropped"))
    hist: dict[int, int] = {}
    for v in values:
        hist[v] = hist.get(v, 0) + 1
    return {"hist": dict(sorted(hist.items())), "dropped": dropped, "updates": len(values),
            "mean": float(np.mean(values)) if values else 0.0}


@styled
def staleness(runs: Mapping[str, Records], title: str | None = None) -> Any:
    """Side by side, one panel per mode: how many updates were 0, 1, 2, ... global steps stale
    (updates by other workers between a worker's read of the variables and its write)."""
    plt = pyplot()
    names = _check_runs(runs)
    stats = {n: staleness_counts(runs[n]) for n in names}
    top = max([1] + [k for s in stats.values() for k in s["hist"]])
    fig, axes = plt.subplots(1, len(names), figsize=(5.5 * len(names), 4), sharey=True,
                             squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        st = stats[name]
        ks = list(range(0, top + 1))
        color = ROLE.get(name, ROLE["async"])
        ax.bar(ks, [st["hist"].get(k, 0) for k in ks], color=color, edgecolor="black",
               label=f"{st['updates']} gradients applied")
        if st["dropped"]:
            ax.bar([-1], [st["dropped"]], color=LIGHT, edgecolor="black", hatch="xx",
                   label=f"{st['dropped']} stale gradients dropped")
        step = max(1, len(ks) // 10)
        shown = ks[::step]
        ax.set_xticks(([-1] if st["dropped"] else []) + shown,
                      (["dropped"] if st["dropped"] else []) + [str(k) for k in shown])
        ax.set_xlabel("staleness (global steps between read and write)")
        ax.set_title(f"{name}: mean staleness {st['mean']:.2f}")
        ax.legend(loc="upper right")
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("gradients")
    fig.suptitle(title or "Staleness of each update, async vs sync")
    fig.tight_layout()
    return fig


@styled
def ps_step_timeline(runs: Mapping[str, Records], title: str | None = None) -> Any:
    """Each worker's steps as bars over time, one panel per mode: async workers step
    independently; sync workers wait for each other at every update."""
    plt = pyplot()
    names = _check_runs(runs)
    fig, axes = plt.subplots(len(names), 1, figsize=(13, 1.4 + 1.0 * sum(
        len(_workers(runs[n])) for n in names)), squeeze=False)
    for ax, name in zip(axes[:, 0], names, strict=True):
        recs = _workers(runs[name])
        t0 = min((s["start"] for r in recs for s in r["steps"]), default=0.0)
        for row, rec in enumerate(recs):
            spans = [((s["start"] - t0) * 1e3, (s["end"] - s["start"]) * 1e3)
                     for s in rec["steps"]]
            ax.broken_barh(spans, (row - 0.35, 0.7), facecolors=rank_color(rec["worker"]),
                           edgecolor="white", linewidth=0.6)
            firsts = [((s["start"] - t0) * 1e3, (s["end"] - s["start"]) * 1e3)
                      for s in rec["steps"] if s.get("first")]
            if firsts:
                ax.broken_barh(firsts, (row - 0.35, 0.7), facecolors="none",
                               edgecolor="white", hatch="..")
            dropped = [((s["start"] - t0) * 1e3, (s["end"] - s["start"]) * 1e3)
                       for s in rec["steps"] if s.get("dropped")]
            if dropped:
                ax.broken_barh(dropped, (row - 0.35, 0.7), facecolors="none",
                               edgecolor="black", hatch="xx")
        ax.set_yticks(range(len(recs)), [f"worker:{r['worker']} ({len(r['steps'])} steps)"
                                         for r in recs])
        ax.set_ylim(len(recs) - 0.5, -0.5)
        ax.set_xlabel("time since the first step (ms)")
        gs = max((s["gs_after"] for r in recs for s in r["steps"]), default=0)
        ax.set_title(f"{name}: {sum(len(r['steps']) for r in recs)} worker steps, "
                     f"global step {gs:g} at the end", loc="left", fontsize=12)
    from matplotlib.patches import Patch

    handles = [Patch(color=rank_color(w), label=f"a step of worker:{w}")
               for w in sorted({r["worker"] for n in names for r in _workers(runs[n])})]
    handles.append(Patch(facecolor=GREY, edgecolor="white", hatch="..",
                         label="first step (sets the graph up on every task)"))
    handles.append(Patch(facecolor="none", edgecolor="black", hatch="xx",
                         label="gradient dropped as stale"))
    fig.legend(handles=handles, loc="lower center", ncol=2, frameon=False)
    fig.suptitle(title or "Step timeline per worker: async vs sync")
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    return fig


_ROLE_ORDER = ("inputs", "variables", "forward", "loss", "gradients", "update")


@styled
def placement_diagram(placement: Mapping[str, Any], title: str | None = None) -> Any:
    """Which op of one training step ran on which task, and what crossed between tasks, for
    each graph (e.g. the seed's and the repaired one): task boxes listing their ops by role,
    arrows labelled with bytes per step (batch from the recording)."""
    plt = pyplot()
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    graphs = placement["graphs"]
    names = [n for n in placement.get("order", []) if n in graphs] or list(graphs)
    fig, axes = plt.subplots(1, len(names), figsize=(7.2 * len(names), 5.2), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        g = graphs[name]
        tasks = sorted({t for t in g["ops"] if t.startswith("/job")}
                       | {m["from"] for m in g["traffic"]} | {m["to"] for m in g["traffic"]})
        workers = [t for t in tasks if "/job:worker" in t]
        ps = [t for t in tasks if "/job:ps" in t]
        ps_y = {t: (0.5 if len(ps) == 1 else 0.75 - 0.5 * i / (len(ps) - 1))
                for i, t in enumerate(ps)}
        boxes: dict[str, tuple[float, float, float]] = {}  # task -> x centre, y centre, height
        for t in workers:
            boxes[t] = (0.2, 0.5, max(0.3, 0.5 * (len(ps) > 1) + 0.3))
        for t in ps:
            boxes[t] = (0.8, ps_y[t], 0.22)
        for t, (x, y, h) in boxes.items():
            roles = g["ops"].get(t, {})
            lines = [f"{r} ×{roles[r]}" for r in _ROLE_ORDER if roles.get(r)]
            color = ROLE["ps"] if "/job:ps" in t else ROLE["worker"]
            h = max(h, 0.09 + 0.05 * len(lines))
            ax.add_patch(FancyBboxPatch((x - 0.15, y - h / 2), 0.3, h,
                                        boxstyle="round,pad=0.01", facecolor="white",
                                        edgecolor=color, linewidth=2.5))
            ax.text(x, y + h / 2 - 0.04, short_task(t), ha="center", va="center",
                    fontsize=13, weight="bold", color=color)
            ax.text(x, y - 0.025, "\n".join(lines) or "(no step ops)", ha="center",
                    va="center", fontsize=10, linespacing=1.3)
        pairs: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
        for m in g["traffic"]:
            pairs.setdefault((m["from"], m["to"]), []).append(m)
        for (src, dst), ms in pairs.items():
            ps_task = dst if dst in ps_y else src
            if ps_task not in ps_y or src not in boxes or dst not in boxes:
                continue
            push = "/job:worker" in src
            y = ps_y[ps_task] + (0.03 if push else -0.03)
            color = ROLE["push"] if push else ROLE["pull"]
            xs = (0.35, 0.65) if push else (0.65, 0.35)
            ax.add_patch(FancyArrowPatch((xs[0], y), (xs[1], y), arrowstyle="-|>",
                                         mutation_scale=20, linewidth=2.2, color=color))
            total = sum(m["bytes"] for m in ms)
            grows = sum(m["bytes"] for m in ms if m["per_example"])
            label = f"{len(ms)} tensor{'s' if len(ms) > 1 else ''}, {human_bytes(total)}"
            if grows:
                label += f"\n{human_bytes(grows)} grow with the batch"
            ax.text(0.5, y + (0.015 if push else -0.015), label, ha="center",
                    va="bottom" if push else "top", fontsize=9.5, color=color)
        total = sum(m["bytes"] for m in g["traffic"])
        ax.set_title(f"{name}: {human_bytes(total)} cross tasks per step", fontsize=13)
        ax.set_xlim(0, 1)
        ax.set_ylim(0.05, 0.95)
        ax.axis("off")
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=ROLE["push"], linewidth=2.2, label="worker → ps"),
               Line2D([], [], color=ROLE["pull"], linewidth=2.2, label="ps → worker")]
    fig.legend(handles=handles, loc="lower center", ncol=2, frameon=False)
    fig.suptitle(title or f"Where one training step runs (worker:{placement['worker']}, "
                 f"batch {placement['batch']})")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


def retried_closures(rows: Sequence[Mapping[str, Any]], put_back: int) -> list[int]:
    """The closures most likely re-run after a failure: the coordinator puts a failed closure
    back at the *end* of its queue, so it starts after many closures scheduled later. Returns
    the ids of the ``put_back`` closures that started latest relative to their place."""
    done = [r for r in rows if r.get("start") is not None]
    order = sorted(done, key=lambda r: r["start"])
    late = []
    for i, r in enumerate(order):
        overtaken = sum(1 for q in order[:i] if q["closure"] > r["closure"])
        late.append((overtaken, r["closure"]))
    late.sort(reverse=True)
    return [c for n, c in late[:put_back] if n > 2]


@styled
def closure_timeline(rows: Sequence[Mapping[str, Any]], events: Sequence[Mapping[str, Any]],
                     killed_at: float | None = None, title: str | None = None) -> Any:
    """Unit 5's lost worker: top, every closure as a bar on the worker that ran it, the
    failures and put-backs the coordinator logged, and the closures it retried; bottom,
    closures finished over time per worker."""
    plt = pyplot()
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    t0 = min([r["scheduled"] for r in rows] + [e["time"] for e in events])
    workers = sorted({r["worker"] for r in rows if r.get("worker") is not None}
                     | {e["worker"] for e in events if e["worker"] >= 0})
    put_back = sum(1 for e in events if e["event"] == "put_back")
    again = set(retried_closures(rows, put_back))
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(13, 2.2 + 0.9 * len(workers) + 3),
                                  sharex=True, gridspec_kw={"height_ratios": [len(workers) + 1,
                                                                              2.2]})
    ax.eventplot([[r["scheduled"] - t0 for r in rows]], lineoffsets=-1, linelengths=0.6,
                 colors=ROLE["scheduled"], linewidths=0.8)
    for w in workers:
        mine = [r for r in rows if r.get("worker") == w]
        ok = [(r["start"] - t0, max(r["end"] - r["start"], 1e-4)) for r in mine
              if r["closure"] not in again]
        ax.broken_barh(ok, (w - 0.32, 0.64), facecolors=rank_color(w), edgecolor="none")
        redo = [(r["start"] - t0, max(r["end"] - r["start"], 1e-4)) for r in mine
                if r["closure"] in again]
        if redo:
            ax.broken_barh(redo, (w - 0.42, 0.84), facecolors=ROLE["retried"],
                           edgecolor="black", linewidth=1.2)
            for r in mine:
                if r["closure"] in again:
                    ax.annotate(f"closure {r['closure']} re-run", (r["start"] - t0, w - 0.45),
                                xytext=(-10, 14), textcoords="offset points", ha="right",
                                fontsize=10, arrowprops={"arrowstyle": "-|>"})
    marks = {"failed": ("X", ROLE["failed"]), "put_back": ("<", ROLE["retried"]),
             "recovered": ("o", ROLE["ok"])}
    for e in events:
        if e["event"] not in marks:  # "recovering": the cluster, no worker to mark
            continue
        mk, c = marks[e["event"]]
        ax.plot(e["time"] - t0, e["worker"], mk, color=c, markersize=13,
                markeredgecolor="black", zorder=5)
    if killed_at is not None:
        for a in (ax, ax2):
            a.axvline(killed_at - t0, color=ROLE["failed"], linewidth=1.5, linestyle="--")
        ax.text(killed_at - t0, -1.45, " worker's engine killed", color=ROLE["failed"],
                fontsize=10, va="center")
    ax.set_yticks([-1] + workers, ["scheduled"] + [f"worker:{w}" for w in workers])
    ax.set_ylim(max(workers, default=0) + 0.7, -1.7)
    n_failed = sum(1 for e in events if e["event"] == "failed")
    ax.set_title(f"{len(rows)} closures: {sum(1 for r in rows if r.get('start') is not None)} "
                 f"finished; {n_failed} worker failure(s), {put_back} closure(s) put back",
                 loc="left", fontsize=12)
    handles = [Line2D([], [], color=ROLE["scheduled"], linewidth=1.2, label="scheduled"),
               *[Patch(color=rank_color(w), label=f"ran on worker:{w}") for w in workers],
               Patch(facecolor=ROLE["retried"], edgecolor="black", label="re-run (inferred)"),
               Line2D([], [], marker="X", color="none", markerfacecolor=ROLE["failed"],
                      markeredgecolor="black", markersize=11, label="worker failed"),
               Line2D([], [], marker="<", color="none", markerfacecolor=ROLE["retried"],
                      markeredgecolor="black", markersize=11, label="closure put back")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=10)
    for w in workers:
        ends = sorted(r["end"] - t0 for r in rows if r.get("worker") == w)
        ax2.step([0.0] + ends, np.arange(len(ends) + 1), where="post", color=rank_color(w),
                 linewidth=2.2, label=f"worker:{w}")
    ax2.set_ylabel("closures finished")
    ax2.set_xlabel("time since the first closure was scheduled (s)")
    ax2.grid(alpha=0.3)
    ax2.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(title or "A worker lost mid-training: what the coordinator did", x=0.01,
                 ha="left")
    fig.tight_layout()
    return fig


__all__ = ["closure_timeline", "placement_diagram", "ps_step_timeline", "ps_traffic",
           "retried_closures", "short_task", "staleness", "staleness_counts", "throughput",
           "total_traffic", "traffic_per_step"]
