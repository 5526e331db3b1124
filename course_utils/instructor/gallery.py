"""``course viz-gallery OUTDIR``: every figure of the course, from real runs, on one page.

How a reviewer looks at every figure at once. The runs are the course's own: ``%%px`` cells of
the instructor's notebooks (solutions included), picked by their nbgrader ids (:func:`px_code`),
run on real engines, then drawn by the recorders and figure functions the notebooks use:

1. a 4-engine cluster (a ring on 2 ranks is one message per phase): the ring replay (PNG + an
   HTML animation), the recorded ring trace, the collectives cheat sheet, per-rank tensors;
2. a 2-engine cluster, TensorFlow first while the engines are fresh (units 4 and 5), then on
   replaced engines units 1-3's bandwidth, cost model, timeline and curves, unit 10's memory and
   FSDP figures, and unit 11's pipeline schedules (on 4 processes of their own).

Writes ``OUTDIR/<name>.png`` (and ``.html`` for the animation) and ``OUTDIR/index.html``.
Small sizes throughout: the whole gallery takes about a minute on a 2-core machine.
"""

from __future__ import annotations

import html
import json
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..notebook_cells import find_cell, source_text, without_px
from ..settings import ENV_TORCH_DEBUG, data_dir

NOTEBOOKS = data_dir("notebooks")


@dataclass
class Item:
    """One figure of the gallery: its file(s), what run produced it, and how long it took."""

    name: str
    title: str
    run: str
    files: list[str] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None


def px_cells(notebook: str | Path, through: str) -> str:
    """The code of every ``%%px`` cell of ``notebook`` up to and including the last cell that
    defines ``through`` (``def through(`` or ``through =``), magics stripped, in order."""
    nb = json.loads(Path(notebook).read_text())
    cells = []
    last = -1
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        src = source_text(cell)
        lines = src.splitlines()
        if not lines or not lines[0].startswith("%%px"):
            continue
        cells.append("\n".join(lines[1:]))
        if f"def {through}(" in src or f"\n{through} =" in f"\n{src}":
            last = len(cells)
    if last < 0:
        raise LookupError(f"no %%px cell of {Path(notebook).name} defines {through!r}")
    return "\n\n".join(cells[:last])


def px_code(notebook: str | Path, ids: list[str] | tuple[str, ...]) -> str:
    """The code of the cells of ``notebook`` named by ``ids`` (nbgrader ``grade_id``, else the
    cell id), in the order given, each without its ``%%px`` line. Stable across edits of the
    text around them, unlike "every ``%%px`` cell up to a definition"."""
    cells = json.loads(Path(notebook).read_text())["cells"]
    found = {i: find_cell(cells, i, cell_type="code") for i in ids}
    missing = [i for i, cell in found.items() if cell is None]
    if missing:
        raise LookupError(f"{Path(notebook).name} has no code cell with the id(s) {missing}")
    return "\n\n".join(without_px(source_text(found[i])) for i in ids)


#: Unit 4's cells that define ``build_graph``, ``original_graph`` and ``train`` on the engines.
UNIT4_CELLS = ("ex2-solution", "original-place-fn", "ex3-solution")
#: What those cells take from earlier ones (unit 4's bridge and servers cells). Without torch:
#: nothing here needs it, and it would have to load before TensorFlow (course_utils.compat).
UNIT4_PRELUDE = ("import numpy as np\nfrom course_utils import tf_dist\n"
                 "tf = tf_dist.quiet_tensorflow()")
#: The two graphs unit 4 compares, as ``engine_placement`` takes them (label, function name).
UNIT4_PLACEMENT = [("the original program", "original_graph"), ("repaired", "build_graph")]


def load_unit4(cc: Any, num_ps: int = 2) -> Any:
    """Unit 4 as the notebook leaves it after exercise 3, on ``cc``'s engines: one server per
    task (``tf_dist.start_servers``, standing in for exercise 1) and the notebook's own
    ``build_graph``, ``original_graph`` and ``train`` (solution cells, by id). Returns the
    ``TaskSet``. Used by the gallery and tests/test_viz_tf.py."""
    from .. import tf_dist

    tfc = tf_dist.start_servers(cc, num_ps=num_ps)
    code = px_code(NOTEBOOKS / "04_tf_classic_ps.ipynb", UNIT4_CELLS)
    cc.view.execute(f"{UNIT4_PRELUDE}\n\n{code}", block=False).get(timeout=180)
    return tfc


def _save(fig: Any, out: Path, name: str) -> str:
    import matplotlib.pyplot as plt

    path = out / f"{name}.png"
    fig.savefig(path)
    plt.close(fig)
    return path.name


class Gallery:
    """Collects figures into ``out`` with one progress bar tick per figure."""

    def __init__(self, out: Path, total: int) -> None:
        from tqdm import tqdm

        self.out = out
        self.items: list[Item] = []
        self.bar = tqdm(total=total, unit="figure", ncols=90, desc="viz-gallery")

    def figure(self, name: str, title: str, run: str, make: Callable[[], Any]) -> Any:
        """``make()`` returns a Figure, an HTML string, or a list of them; saved as ``name``."""
        self.bar.set_description(f"{name:<22}")
        item = Item(name, title, run)
        t0 = time.perf_counter()
        result = None
        try:
            result = make()
            for i, thing in enumerate(result if isinstance(result, list) else [result]):
                suffix = "" if i == 0 else f"_{i}"
                if isinstance(thing, str):
                    path = self.out / f"{name}{suffix}.html"
                    path.write_text(_page(title, thing))
                    item.files.append(path.name)
                else:
                    item.files.append(_save(thing, self.out, name + suffix))
        except Exception as exc:  # one failed figure must not hide the others
            item.error = f"{type(exc).__name__}: {exc}"
            self.bar.write(f"viz-gallery: {name} failed: {item.error}\n{traceback.format_exc()}")
        item.seconds = time.perf_counter() - t0
        self.items.append(item)
        self.bar.update(1)
        return result

    def close(self) -> None:
        self.bar.close()


def _page(title: str, body: str) -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
            f"</title></head><body style='font-family:sans-serif'><h2>{html.escape(title)}</h2>"
            f"{body}</body></html>")


def write_index(out: Path, items: list[Item], seconds: float) -> Path:
    """``out/index.html``: every figure with its title and one line on the run behind it."""
    rows = []
    for it in items:
        if it.error:
            body = f"<p style='color:#D55E00'>failed: {html.escape(it.error)}</p>"
        else:
            imgs = [f"<a href='{f}'><img src='{f}' style='max-width:100%'></a>"
                    for f in it.files if f.endswith(".png")]
            links = [f"<a href='{f}'>{f} (animated)</a>" for f in it.files
                     if f.endswith(".html")]
            body = "".join(imgs) + ("<p>" + " · ".join(links) + "</p>" if links else "")
        rows.append(f"<section><h3>{html.escape(it.title)}</h3><p><b>run:</b> "
                    f"{html.escape(it.run)} ({it.seconds:.1f} s)</p>{body}</section>")
    failed = sum(1 for it in items if it.error)
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>course figures</title>"
            f"</head><body style='font-family:sans-serif;max-width:1400px;margin:auto'>"
            f"<h1>Every figure of the course</h1><p>{len(items)} figures from real runs in "
            f"{seconds:.0f} s; {failed} failed. Generated by <code>course viz-gallery</code>."
            f"</p>{''.join(rows)}</body></html>")
    path = out / "index.html"
    path.write_text(page)
    return path


#: Unit 1's cells behind its figures: the recorder set-up and ``ring_all_reduce`` (solution).
UNIT1_CELLS = ("setup-px", "ex1-solution")
#: Unit 2's: data, broadcast, the original loop (``spread_original``), the step and its driver.
UNIT2_CELLS = ("data", "bcast", "original", "ex1-solution", "ex1-driver")
#: Unit 10's: the engines' imports, shard_bounds, ShardedOptimizer (ZeRO-1), ZeRO2Optimizer
#: and HandFSDP.
UNIT10_CELLS = ("engine-imports", "ex1a-solution", "ex1-solution", "ex1b-solution",
                "ex2-solution")
#: Unit 11's: the engines' imports and the two pipeline schedules (GPipe, 1F1B).
UNIT11_CELLS = ("engine-imports", "ex2-solution", "ex2b-solution")
#: The strategies of the memory figure, as unit 10 measures them.
MEMORY_STRATEGIES = ("ddp", "zero1", "zero2", "zero_torch", "fsdp_hand", "fsdp2")

#: The figures, in the order they are made (name, title).
FIGURES = [
    ("ring_replay", "Ring all-reduce replay, step by step (unit 1)"),
    ("ring_trace", "Recorded ring trace (unit 1)"),
    ("collectives_cheatsheet", "Collectives cheat sheet (unit 1)"),
    ("per_rank_tensors", "Per-rank tensors before/after all_reduce (unit 1)"),
    ("bandwidth_bars", "Bus bandwidth: ring vs gloo (unit 1)"),
    ("cost_model", "Cost model: alpha-beta fit, ring/tree/PS (performance unit)"),
    ("ddp_timeline", "DDP timeline, bucket_cap_mb compared (unit 3, performance unit)"),
    ("live_training", "Live training view, final frame (unit 3)"),
    ("per_rank_curves", "Per-rank loss curves (unit 3)"),
    ("replica_divergence", "Replica divergence: original program vs fixed (unit 2)"),
    ("memory_bars", "Bytes per rank: DDP, ZeRO-1, FSDP by hand and torch's (unit 10)"),
    ("fsdp_lifecycle", "FSDP, event by event: gather, compute, free, reduce-scatter (unit 10)"),
    ("pipeline_schedule", "Pipeline schedules, GPipe and 1F1B, timed on every rank (unit 11)"),
    ("ps_traffic", "Parameter-server traffic per worker and shard (unit 4)"),
    ("ps_staleness", "Staleness, async vs sync (unit 4)"),
    ("ps_step_timeline", "Step timeline per worker, async vs sync (unit 4)"),
    ("ps_placement", "Op placement: the original program vs repaired (unit 4)"),
    ("closure_timeline", "A worker lost: closures failed, put back, retried (unit 5)"),
]
TITLES = dict(FIGURES)


def run(outdir: str | Path, ring_ranks: int = 4, tf: bool = True) -> list[Item]:
    """Make every figure into ``outdir``; returns the items (``error`` set on failures)."""
    os.environ.setdefault("MPLBACKEND", "Agg")
    # The recordings include broadcast/scatter calls whose non-root tensors differ by design
    # and timings; DETAIL's fingerprint checks would reject the former and slow the latter.
    os.environ.setdefault(ENV_TORCH_DEBUG, "off")
    import matplotlib

    matplotlib.use("Agg")
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    total = len(FIGURES) - (0 if tf else 5)
    gal = Gallery(out, total)
    try:
        _ring_part(gal, ring_ranks)
        _torch_part(gal, tf)
    finally:
        gal.close()
    order = [name for name, _ in FIGURES]
    gal.items.sort(key=lambda it: order.index(it.name) if it.name in order else len(order))
    index = write_index(out, gal.items, time.perf_counter() - t0)
    print(f"viz-gallery: {len(gal.items)} figures in {time.perf_counter() - t0:.0f} s -> {index}")
    return gal.items


def _cluster(n: int, suffix: str) -> Any:
    from .. import settings
    from ..cluster import launch

    return launch(n, profile="local", cluster_id=f"{settings.cluster_id()}-{suffix}")


def _ring_part(gal: Gallery, ranks: int) -> None:
    from .. import viz
    from ..torch_dist import p2p, record
    from ..torch_dist.process_group import start
    from ..viz import cheatsheet, ring

    nb01 = NOTEBOOKS / "01_collectives.ipynb"
    cc = _cluster(ranks, f"gallery{ranks}")
    try:
        start(cc, backend="gloo")
        cc.view.execute(px_code(nb01, UNIT1_CELLS), block=False).get(timeout=120)
        run = (f"01_collectives' ring_all_reduce (the solution cell) on {ranks} gloo ranks, "
               f"a {2 * ranks}-element buffer, every send recorded")

        def replay() -> list[Any]:
            rp = ring.replay_frames(record.record_ring_replay("ring_all_reduce", ranks=ranks,
                                                              cluster=cc))
            return [ring.ring_replay(rp), ring.animation_html(rp)]

        gal.figure("ring_replay", TITLES["ring_replay"], run, replay)
        gal.figure("ring_trace", TITLES["ring_trace"], run.replace("every send", "every message"),
                   lambda: viz.ring_trace(cc.run(p2p.engine_record_ring,
                                                 "ring_all_reduce", 2 * ranks + 1, timeout=60),
                                          f"ring all-reduce on {ranks} ranks, recorded"))
        recs: list[Any] = []

        def sheet() -> Any:
            recs.extend(cc.run(record.engine_record_collectives, timeout=60))
            return cheatsheet.collectives_cheatsheet(recs)

        gal.figure("collectives_cheatsheet", TITLES["collectives_cheatsheet"],
                   f"torch_dist.record.engine_record_collectives on {ranks} gloo ranks", sheet)
        gal.figure("per_rank_tensors", TITLES["per_rank_tensors"],
                   f"the cheat sheet's all_reduce on {ranks} ranks",
                   lambda: viz.per_rank_tensors([r["trace"]["all_reduce"][0] for r in recs],
                                                [r["trace"]["all_reduce"][1] for r in recs],
                                                "all_reduce"))
    finally:
        cc.stop(force=True)


def _torch_part(gal: Gallery, tf: bool) -> None:
    from .. import viz
    from ..torch_dist import bandwidth, live_log, record
    from ..torch_dist.process_group import start

    cc = _cluster(2, "gallery2")
    try:
        if tf:
            # TensorFlow first, on fresh engines: its servers cannot stop, and the teardown
            # after them gives the PyTorch figures fresh engines (one engine restart in all).
            _tf_part(gal, cc)
        start(cc, backend="gloo")
        p = cc.world_size
        nb01 = NOTEBOOKS / "01_collectives.ipynb"
        cc.view.execute(px_code(nb01, UNIT1_CELLS), block=False).get(timeout=120)
        nbytes = 8 * 2**20

        def bars() -> Any:
            times = cc.run(bandwidth.engine_bench_all_reduce, "ring_all_reduce", nbytes, 5,
                           timeout=120)[0]
            bus = {k: bandwidth.busbw(nbytes, s, p) for k, s in times.items()}
            return viz.bandwidth_bars(bus, f"all-reduce of {nbytes >> 20} MiB on {p} ranks")

        gal.figure("bandwidth_bars", TITLES["bandwidth_bars"],
                   f"01's ring_all_reduce vs dist.all_reduce, 8 MiB float32, {p} ranks, "
                   "median of 5 in turns", bars)

        def cost() -> Any:
            sw = cc.run(record.engine_sweep_all_reduce, timeout=120)[0]
            fit = viz.fit_alpha_beta(sw["sizes"], sw["seconds"], p)
            gal.bar.write("cost model: " + viz.describe_fit(fit))
            return viz.cost_model(sw["sizes"], sw["seconds"], p, fit)

        gal.figure("cost_model", TITLES["cost_model"],
                   f"dist.all_reduce (gloo) of 4 B to 4 MiB on {p} ranks, median of 15 each",
                   cost)

        def timeline() -> Any:
            runs = {f"bucket_cap_mb={cap:g}": cc.run(record.engine_profile_ddp, 3, cap,
                                                     timeout=120) for cap in (25.0, 1.0)}
            return viz.ddp_timeline(runs)

        gal.figure("ddp_timeline", TITLES["ddp_timeline"],
                   f"torch.profiler over 3 DDP steps of a 6x512 MLP (6 MiB of gradients), "
                   f"batch 64, gloo, {p} ranks, bucket_cap_mb 25 and 1", timeline)
        rows: list[Any] = []

        def live() -> Any:
            ar = cc.client[cc.ranks.engine_ids].apply_async(live_log.engine_train_live, 60)
            rows.extend(viz.live.watch(ar, p, title=f"DDP on {p} ranks, live", live=False,
                                       timeout=120))
            return viz.live.live_training(rows, f"DDP on {p} ranks (final frame)")

        gal.figure("live_training", TITLES["live_training"],
                   f"torch_dist.live_log.engine_train_live: 60 DDP steps on the digits, {p} "
                   "ranks, rows published with ipyparallel datapub", live)
        gal.figure("per_rank_curves", TITLES["per_rank_curves"],
                   "the live view's run, loss per rank",
                   lambda: viz.per_rank_curves([[r["loss"] for r in rr] for rr in rows],
                                               "training loss", f"DDP on {p} ranks"))

        def divergence() -> Any:
            nb02 = NOTEBOOKS / "02_data_parallel_from_scratch.ipynb"
            cc.push({"STEPS": 30, "LR": 0.5, "BATCH": 32})  # unit 2's setup cell
            cc.view.execute(px_code(nb02, UNIT2_CELLS), block=False).get(timeout=180)
            seed = cc.pull("spread_original")[0]
            fixed = cc.call("train_data_parallel", timeout=120)[0][1]
            return viz.replica_divergence({"original: all_reduce(loss) after step()": seed,
                                           "fixed: all_reduce(grad) / p before step()": fixed})

        gal.figure("replica_divergence", TITLES["replica_divergence"],
                   f"02's %%px cells (original loop and solution) for 30 steps on {p} ranks",
                   divergence)

        _memory_figure(gal, cc)
        _pipeline_figure(gal)
    finally:
        cc.stop(force=True)


def _memory_figure(gal: Gallery, cc: Any) -> None:
    """Unit 10's bytes per rank: the learner's classes (the solution cells) and torch's; and
    FSDP's step, event by event, from torch's ``fully_shard``."""
    from .. import viz
    from ..torch_dist import sharding
    from ..torch_dist.fsdp_lifecycle import engine_fsdp_lifecycle

    p = cc.world_size

    def memory() -> Any:
        nb10 = NOTEBOOKS / "10_sharding_and_memory.ipynb"
        cc.view.execute(px_code(nb10, UNIT10_CELLS), block=False).get(timeout=120)
        # 10 steps (the unit runs 2): the step times are medians of 10 after a warm-up
        by = {name: cc.run(sharding.engine_memory, name, steps=10, timeout=120)
              for name in MEMORY_STRATEGIES}
        rows = [r for name in MEMORY_STRATEGIES for r in by[name]]
        gal.bar.write(sharding.memory_table([rs[0] for rs in by.values()], p))
        gal.bar.write(sharding.step_time_line(by))
        return viz.memory_bars(rows, sharding.LABELS)

    gal.figure("memory_bars", TITLES["memory_bars"],
               f"10's ShardedOptimizer, ZeRO2Optimizer and HandFSDP (the solution cells), "
               f"ZeroRedundancyOptimizer and fully_shard: sharding.engine_memory, 10 Adam steps "
               f"of a 4x64 MLP, gloo, {p} ranks", memory)
    gal.figure("fsdp_lifecycle", TITLES["fsdp_lifecycle"], "fsdp_lifecycle.engine_fsdp_lifecycle"
               f": fully_shard on a 4x64 MLP, the second step's events, gloo, {p} ranks",
               lambda: viz.memory.fsdp_lifecycle(cc.run(engine_fsdp_lifecycle, timeout=120)))


def _pipeline_figure(gal: Gallery) -> None:
    """Unit 11's two schedules (the solution cells) on 4 processes, as its tests run them."""
    from .. import viz
    from ..checks import spawn
    from ..torch_dist.parallelism import bubble_formula

    def schedules() -> Any:
        code = px_code(NOTEBOOKS / "11_tensor_and_pipeline.ipynb", UNIT11_CELLS)
        runs = {name: spawn("engine_check_pipeline", 4, fn_name=fn, m=8, rows=128, width=512,
                            sources=[code], timeout=120, collective_timeout=30)
                for name, fn in (("GPipe", "gpipe_step"), ("1F1B", "one_f_one_b_step"))}
        return viz.pipeline_schedule(runs, formula={k: bubble_formula(4, 8) for k in runs})

    gal.figure("pipeline_schedule", TITLES["pipeline_schedule"], "11's gpipe_step and "
               "one_f_one_b_step (solution cells): checks.engine_check_pipeline, 4 stages, 8 "
               "microbatches of 128 x 512, gloo", schedules)


def _tf_part(gal: Gallery, cc: Any) -> None:
    from .. import tf_dist
    from ..tf_dist import record as trec
    from ..viz import ps as pt

    runs: dict[str, Any] = {}
    steps = 40

    def traffic() -> Any:
        load_unit4(cc, num_ps=2)
        runs.update(trec.record_ps(cc, steps))
        return pt.ps_traffic(runs)

    def recorded() -> dict[str, Any]:
        if not runs:
            raise RuntimeError("no recording to draw: the ps_traffic figure, which records the "
                               "runs, failed (its error is above)")
        return runs

    run4 = (f"04's build_graph and train (solution cells, by id) on 2 workers + 2 ps tasks, "
            f"tf_dist.record.record_ps: {steps} global steps async then sync")
    gal.figure("ps_traffic", TITLES["ps_traffic"], run4, traffic)
    gal.figure("ps_staleness", TITLES["ps_staleness"], run4, lambda: pt.staleness(recorded()))
    gal.figure("ps_step_timeline", TITLES["ps_step_timeline"], run4,
               lambda: pt.ps_step_timeline(recorded()))
    gal.figure("ps_placement", TITLES["ps_placement"],
               "04's original_graph and build_graph, placement of one step's ops on worker 1",
               lambda: pt.placement_diagram(trec.placement(cc, UNIT4_PLACEMENT)))
    gal.figure("closure_timeline", TITLES["closure_timeline"],
               "ParameterServerStrategy, coordinator in this process, 2 workers + 2 ps; 150 "
               "timed closures, rank 1 (worker:1) killed 0.05 s after scheduling them",
               lambda: _lost_worker(cc))
    tf_dist.stop_servers(cc)


def _lost_worker(cc: Any, n: int = 150) -> Any:
    """Unit 5's lost worker with a small step of its own (not the learner's exercise)."""
    from .. import tf_dist
    from ..tf_dist import record as trec
    from ..viz import ps as pt

    tfc = tf_dist.active()
    if tfc is None or sorted(tfc.cluster) != ["ps", "worker"] or len(tfc.cluster["ps"]) != 2:
        tfc = tf_dist.start_servers(cc, num_ps=2, num_workers=2)
    else:  # unit 4's servers (same roles): cleared, they serve the coordinator as well
        tf_dist.restart_ps(cc, tfc)
    tf = tf_dist.quiet_tensorflow()
    strategy = tf_dist.start_coordinator(tfc, cluster=cc)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        w = tf.Variable(tf.random.stateless_normal([64, 64], seed=[0, 1]) * 0.1)

    @tf.function
    def step() -> Any:
        x = tf.random.stateless_normal([256, 64], seed=[1, 2])
        for _ in range(20):
            x = tf.tanh(tf.matmul(x, w))
        w.assign_add(1e-6 * tf.reduce_mean(x) * tf.ones_like(w))
        return tf.reduce_sum(x)

    timed = trec.timed(step)
    for _ in range(4):  # every worker has the function before the recorded closures
        coordinator.schedule(timed, args=(tf.constant(-1),))
    coordinator.join()
    with trec.record_coordinator() as events:
        scheduled, remote = [], []
        for i in range(n):
            scheduled.append(time.time())
            remote.append(coordinator.schedule(timed, args=(tf.constant(i),)))
        time.sleep(0.05)
        killed = time.time()
        tf_dist.kill_rank(1, cc)
        error, _ = tf_dist.join_within(coordinator, timeout=120)
    if error:
        raise RuntimeError(f"join() after losing a worker: {error}")
    if not any(e["event"] == "failed" for e in events):
        raise RuntimeError("the coordinator logged no worker failure: every closure finished "
                           "before the kill (a faster machine: schedule more closures)")
    rows = trec.closure_rows(trec.fetch_all(remote), scheduled)
    return pt.closure_timeline(rows, events, killed)
