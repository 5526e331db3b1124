"""The DDP timeline (unit 3 and the performance unit): compute vs communication per rank.

Input: one record per rank from :func:`course_utils.torch_dist.record.engine_profile_ddp`
(``torch.profiler`` spans in seconds from the first step). Each rank gets two lanes: its compute
thread (forward, backward, optimizer step) and gloo's communication (one bar per gradient
bucket's all_reduce, from when a gloo worker thread picked it up; a triangle marks when DDP
launched it). Where an orange bar sits under a blue one, communication is hidden behind
backward; where it sits alone, the rank waits for it. :func:`overlap_dp_timeline` draws the
learner's own ``OverlapDP`` of ``07_performance``: hooks filling buckets, buckets draining.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .style import ROLE, human_bytes, pyplot, styled


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def overlap_fraction(record: Mapping[str, Any]) -> float:
    """Share of one rank's all_reduce time that ran while its backward pass was still running
    (0: communication only after backward; close to 1: hidden behind it)."""
    back = _union([(e["start"], e["end"]) for e in record["events"] if e["kind"] == "backward"])
    total = hidden = 0.0
    for e in record["events"]:
        if e["kind"] != "all_reduce":
            continue
        total += e["end"] - e["start"]
        for a, b in back:
            hidden += max(0.0, min(b, e["end"]) - max(a, e["start"]))
    return hidden / total if total > 0 else 0.0


def launched_during_backward(record: Mapping[str, Any]) -> float:
    """Share of one rank's bucket all_reduces that DDP launched while backward still had
    autograd nodes to run (``launched_early`` of each all_reduce; ``nan`` when the record has
    none). A bucket launched from the last gradient's hook does not count."""
    reds = [e for e in record["events"] if e["kind"] == "all_reduce" and "launched_early" in e]
    if not reds:
        return float("nan")
    return sum(bool(e["launched_early"]) for e in reds) / len(reds)


def comm_after_backward(record: Mapping[str, Any]) -> float:
    """Seconds per step a rank spends between the end of its backward pass and the end of its
    last all_reduce: the communication that is *not* hidden."""
    per_step = []
    for s in range(len(record["steps"])):
        back = [e["end"] for e in record["events"] if e["kind"] == "backward" and e["step"] == s]
        red = [e["end"] for e in record["events"] if e["kind"] == "all_reduce" and e["step"] == s]
        if back and red:
            per_step.append(max(0.0, max(red) - max(back)))
    return sum(per_step) / len(per_step) if per_step else 0.0


def sub_lanes(spans: Sequence[Mapping[str, Any]]) -> list[int]:
    """A lane for each span so that spans in one lane never overlap (first free lane, in
    order of start): gloo runs up to two buckets at once on its own threads."""
    ends: list[float] = []
    out = []
    for e in spans:
        for i, last in enumerate(ends):
            if e["start"] >= last:
                ends[i] = e["end"]
                out.append(i)
                break
        else:
            ends.append(e["end"])
            out.append(len(ends) - 1)
    return out


def _bucket_text(sizes: Sequence[int]) -> str:
    if not sizes:
        return "buckets unknown"
    if len(sizes) == 1:
        return f"1 bucket of {human_bytes(sizes[0])}"
    lo, hi = human_bytes(min(sizes)), human_bytes(max(sizes))
    return f"{len(sizes)} buckets of {lo}" + ("" if lo == hi else f" to {hi}")


@styled
def ddp_timeline(runs: Mapping[str, Sequence[Mapping[str, Any]]], title: str | None = None
                 ) -> Any:
    """One panel per run (e.g. ``{"bucket_cap_mb=25": records, "bucket_cap_mb=1": records}``),
    one pair of lanes per rank: compute (forward, backward, optimizer) and communication (one
    bar per bucket's all_reduce, labelled with its bucket number). Time in ms, shared axis."""
    plt = pyplot()
    from matplotlib.patches import Patch

    names = list(runs)
    p = max(len(runs[k]) for k in names)
    fig, axes = plt.subplots(len(names), 1, figsize=(13, 1.3 + 1.2 * p * len(names) + 0.6),
                             sharex=True, squeeze=False)
    end = max(e["end"] for k in names for rec in runs[k] for e in rec["events"]) * 1e3
    for ax, name in zip(axes[:, 0], names, strict=True):
        recs = list(runs[name])
        labels = []
        for r, rec in enumerate(recs):
            y_comp, y_comm = 2 * r, 2 * r + 1
            labels += [(y_comp, f"rank {rec['rank']} compute"),
                       (y_comm, f"rank {rec['rank']} comm")]
            for e in rec["events"]:
                if e["kind"] != "all_reduce":
                    ax.broken_barh([((e["start"]) * 1e3, (e["end"] - e["start"]) * 1e3)],
                                   (y_comp - 0.38, 0.76), facecolors=ROLE[e["kind"]],
                                   edgecolor="none")
            reds = [e for e in rec["events"] if e["kind"] == "all_reduce"]
            lanes = sub_lanes(reds)
            k = max(lanes, default=0) + 1
            h = 0.76 / k
            for e, lane in zip(reds, lanes, strict=True):
                x0, w = e["start"] * 1e3, (e["end"] - e["start"]) * 1e3
                y0 = y_comm - 0.38 + lane * h
                if "launch" in e:   # launched by DDP here; queued for a gloo thread until x0
                    ax.plot([e["launch"] * 1e3, x0], [y0 + h / 2] * 2, color="black",
                            linewidth=0.8, linestyle=(0, (2, 2)))
                    ax.plot([e["launch"] * 1e3], [y0 + h / 2], marker="v", color="black",
                            markersize=5)
                ax.broken_barh([(x0, w)], (y0, h), facecolors=ROLE["comm"], edgecolor="black",
                               linewidth=0.8)
                if w > end / 50:
                    ax.text(x0 + w / 2, y0 + h / 2, f"b{e.get('bucket', '')}", ha="center",
                            va="center", fontsize=9 if k == 1 else 8)
            for a, _b in rec["steps"][1:]:
                ax.axvline(a * 1e3, color="0.6", linewidth=0.8, linestyle=":")
        ax.set_yticks([y for y, _ in labels], [lab for _, lab in labels])
        ax.set_ylim(2 * len(recs) - 0.5, -0.5)
        buckets = recs[0].get("bucket_bytes") or []
        hidden = sum(overlap_fraction(r) for r in recs) / len(recs)
        exposed = sum(comm_after_backward(r) for r in recs) / len(recs) * 1e3
        ax.set_title(f"{name}: {_bucket_text(buckets)} · {hidden:.0%} of all_reduce time "
                     f"overlaps backward · {exposed:.1f} ms/step after backward", fontsize=12,
                     loc="left")
    axes[-1, 0].set_xlabel("time since the first profiled step (ms); dotted lines: step starts")
    axes[-1, 0].set_xlim(0, end * 1.01)
    handles = [Patch(color=ROLE["forward"], label="forward"),
               Patch(color=ROLE["backward"], label="backward"),
               Patch(color=ROLE["optimizer"], label="optimizer step"),
               Patch(facecolor=ROLE["comm"], edgecolor="black",
                     label="all_reduce of one gradient bucket (b0 = first reduced)")]
    if any("launch" in e for k in names for rec in runs[k] for e in rec["events"]):
        from matplotlib.lines import Line2D

        handles.append(Line2D([], [], color="black", marker="v", linestyle=(0, (2, 2)),
                              label="launched by DDP; dashes: waiting for a gloo thread"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False,
               fontsize=9)
    rec0 = runs[names[0]][0]
    fig.suptitle(title or f"DDP on {p} ranks ({rec0.get('backend', 'gloo')}): compute vs "
                 f"communication, {human_bytes(rec0.get('grad_bytes', 0))} of gradients per step",
                 x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


@styled
def overlap_dp_timeline(result: Mapping[str, Any], title: str | None = None) -> Any:
    """One rank's last checked step of the learner's ``OverlapDP`` (``07_performance``), from
    :func:`course_utils.checks.engine_check_overlap_dp`'s ``timeline``: backward, a tick per
    parameter when its hook ran (coloured by the bucket it went into, height: its bytes), and
    per bucket its all_reduce from launch to finish. Time in ms from the start of backward."""
    plt = pyplot()
    tl = result["timeline"]
    colors = plt.get_cmap("tab10").colors
    bucket_of = {int(k): v for k, v in (tl.get("bucket_of") or {}).items()}
    fig, ax = plt.subplots(figsize=(12, 3.6))
    b0, b1 = (v * 1e3 for v in tl["backward"])
    ax.broken_barh([(b0, b1 - b0)], (2.6, 0.8), facecolors=ROLE["backward"])
    ax.text(b0, 3.5, "backward", fontsize=9, va="bottom")
    top = max((n for _t, _i, n in tl["hooks"]), default=1)
    for t, i, n in tl["hooks"]:
        c = colors[bucket_of.get(i, 0) % len(colors)] if i in bucket_of else "0.4"
        ax.plot([t * 1e3] * 2, [1.3, 1.3 + 0.9 * max(0.15, n / top)], color=c, linewidth=2)
    launches = [d for d in tl["launches"]]
    spans = [{"start": d["t"], "end": d["done"] if d["done"] is not None else tl["sync_end"]}
             for d in launches]
    lanes = sub_lanes(spans)
    k = max(lanes, default=0) + 1
    for b, (d, e, lane) in enumerate(zip(launches, spans, lanes, strict=True)):
        y0, h = 0.1 + lane * 0.9 / k, 0.8 / k
        ax.broken_barh([(e["start"] * 1e3, (e["end"] - e["start"]) * 1e3)], (y0, h),
                       facecolors=colors[b % len(colors)], edgecolor="black", linewidth=0.6)
        ax.text(e["start"] * 1e3, y0 + h / 2, f" b{b} ({human_bytes(4 * d['numel'])})",
                fontsize=8, va="center")
    ax.axvline(b1, color="0.3", linestyle=":", linewidth=1)
    ax.axvline(tl["sync_end"] * 1e3, color="0.3", linestyle="--", linewidth=1)
    ax.set_yticks([0.5, 1.75, 3.0], ["all_reduce\n(launch → done)", "hooks\n(one per param)",
                                     "compute"])
    ax.set_ylim(-0.1, 4.0)
    ax.set_xlabel("ms since backward started · dotted: backward ends · dashed: sync() returns")
    ax.set_title(title or f"your OverlapDP, rank {result['rank']} of {result['world_size']}: "
                 f"{len(launches)} buckets, {len(tl['hooks'])} hooks in the last checked step",
                 loc="left", fontsize=12)
    fig.tight_layout()
    return fig
