"""Parameter-server steps per second, measured (``07_performance``): asynchronous vs synchronous
training and one vs two ps shards, on real ``tf.distribute.Server`` tasks.

The tasks are unit 8's task processes (:mod:`.tasks`: one process per ps/worker task, forked on
the engines' hosts); the client is the notebook kernel, which builds one classic
(``tf.compat.v1``) graph per shard count and runs it through gRPC sessions, one per worker:

* the variable ``W`` (``width`` x ``width`` float32) is split by rows into ``shards`` blocks,
  block ``i`` on ``ps:i``; each worker reads every block, computes its gradient on a batch it
  generates itself, and sends each block's gradient back to that block's ps;
* **async**: every worker runs its own ``train_k`` op in a thread of its own, as fast as it can
  (each update applied as soon as it arrives);
* **sync**: one op computes both workers' gradients, averages them on the ps and applies one
  update: a step ends when the slower worker has sent its gradient.

Configurations take turns within every round, so a burst of load hits them alike; each row is
the median over the rounds, with the spread (interquartile range over the median) as noise.
TensorFlow is imported only inside the functions.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

#: The configurations measured, in the order they take turns.
KINDS = ("async", "sync")


def build_ps_graph(tf: Any, shards: int, workers: int, width: int = 512,
                   batch: int = 64, lr: float = 1e-3) -> dict[str, Any]:
    """A classic graph: ``W`` split by rows over ``ps:0..shards-1``, each worker's gradient
    step (``train`` list, one op per worker) and the synchronous step (``sync``: both workers'
    gradients averaged on the ps, one update). Names carry the shard count, so graphs of
    different shard counts keep separate variables on the same ps tasks."""
    v1 = tf.compat.v1
    graph = tf.Graph()
    rows = np.array_split(np.arange(width), shards)
    with graph.as_default():
        blocks = []
        for i, r in enumerate(rows):
            with v1.device(f"/job:ps/task:{i}"):
                blocks.append(v1.get_variable(
                    f"W{shards}_{i}", [len(r), width], tf.float32,
                    initializer=v1.zeros_initializer(), use_resource=True))
        grads = []
        for k in range(workers):
            with v1.device(f"/job:worker/task:{k}"):
                x = tf.random.uniform([batch, width], seed=k)
                target = tf.reverse(x, [1])
                pred = tf.matmul(x, tf.concat([b.read_value() for b in blocks], 0))
                loss = tf.reduce_mean(tf.square(pred - target))
                grads.append(tf.gradients(loss, blocks))
        train, avg = [], []
        for i, b in enumerate(blocks):
            with v1.device(f"/job:ps/task:{i}"):
                avg.append(b.assign_sub(lr * tf.add_n([g[i] for g in grads]) / workers))
        for k in range(workers):
            ups = []
            for i, b in enumerate(blocks):
                with v1.device(f"/job:ps/task:{i}"):
                    ups.append(b.assign_sub(lr * grads[k][i]))
            train.append(tf.group(*ups))
        sync = tf.group(*avg)
        init = v1.global_variables_initializer()
    return {"graph": graph, "train": train, "sync": sync, "init": init,
            "bytes": width * width * 4, "shards": shards, "workers": workers, "batch": batch}


def _sessions(tf: Any, made: dict[str, Any], spec: dict[str, list[str]],
              timeout_s: float) -> list[Any]:
    v1 = tf.compat.v1
    config = v1.ConfigProto(operation_timeout_in_ms=int(timeout_s * 1000))
    return [v1.Session(f"grpc://{addr}", graph=made["graph"], config=config)
            for addr in spec["worker"][:made["workers"]]]


def _time_async(sessions: list[Any], ops: list[Any], steps: int) -> float:
    errors: list[BaseException] = []

    def loop(sess: Any, op: Any) -> None:
        try:
            for _ in range(steps):
                sess.run(op)
        except BaseException as exc:  # reported in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=loop, args=(s, o), daemon=True)
               for s, o in zip(sessions, ops, strict=True)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - t0


def _time_sync(session: Any, op: Any, steps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(steps):
        session.run(op)
    return time.perf_counter() - t0


def measure_ps(spec: dict[str, list[str]], rounds: int = 5, steps: int = 10,
               width: int = 512, batch: int = 64, timeout_s: float = 30.0) -> dict[str, Any]:
    """Batches per second of async and sync training with 1 and (if the spec has two ps tasks)
    2 shards, on the tasks of ``spec`` (e.g. :func:`.tasks.start`'s ``.cluster``), the
    kernel as the client. One warm-up step per configuration, then ``rounds`` rounds in which
    every configuration runs ``steps`` steps per worker in turn. Every gRPC call gives up after
    ``timeout_s`` seconds (``DeadlineExceeded``) instead of waiting for a lost task.

    Returns ``{"workers", "bytes", "batch", "rows": {(kind, shards): [batches/s per round]}}``.
    """
    from .quiet import quiet_tensorflow

    tf = quiet_tensorflow()
    workers = len(spec["worker"])
    shard_counts = [1, 2] if len(spec.get("ps", ())) >= 2 else [1]
    made = {n: build_ps_graph(tf, n, workers, width, batch) for n in shard_counts}
    sessions = {n: _sessions(tf, made[n], spec, timeout_s) for n in shard_counts}
    rows: dict[tuple[str, int], list[float]] = {(k, n): [] for n in shard_counts for k in KINDS}
    try:
        for n in shard_counts:
            sessions[n][0].run(made[n]["init"])
            _time_async(sessions[n], made[n]["train"], 1)
            _time_sync(sessions[n][0], made[n]["sync"], 1)
        for _ in range(rounds):
            for n in shard_counts:
                took = _time_async(sessions[n], made[n]["train"], steps)
                rows[("async", n)].append(workers * steps / took)
                took = _time_sync(sessions[n][0], made[n]["sync"], steps)
                rows[("sync", n)].append(workers * steps / took)
    finally:
        for group in sessions.values():
            for sess in group:
                sess.close()
    return {"workers": workers, "bytes": width * width * 4, "batch": batch, "rows": rows}


def ps_table(measured: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per configuration: median batches/s, updates/s (sync applies one update per
    ``workers`` batches), noise (interquartile range over median) and the ratio to async with
    one shard."""
    rows = measured["rows"]
    base = float(np.median(rows[("async", 1)]))
    out = []
    for (kind, shards), values in rows.items():
        v = np.asarray(values, float)
        med = float(np.median(v))
        q1, q3 = np.percentile(v, [25, 75])
        out.append({"kind": kind, "shards": shards, "batches_s": med,
                    "updates_s": med / (measured["workers"] if kind == "sync" else 1),
                    "noise": float((q3 - q1) / med) if med else 0.0,
                    "vs_async_1": med / base if base else 0.0})
    return out


def format_ps_table(table: list[dict[str, Any]], measured: dict[str, Any]) -> str:
    """The table ``07_performance`` prints."""
    lines = [f"{measured['workers']} workers, W = {measured['bytes'] // 1024} KiB float32, "
             f"batch {measured['batch']} per worker; medians over the rounds",
             f"{'training':<8} {'ps shards':>9} {'batches/s':>10} {'updates/s':>10} "
             f"{'noise':>6} {'vs async, 1 shard':>18}"]
    for r in table:
        lines.append(f"{r['kind']:<8} {r['shards']:>9} {r['batches_s']:>10.1f} "
                     f"{r['updates_s']:>10.1f} {r['noise']:>6.0%} {r['vs_async_1']:>17.2f}x")
    return "\n".join(lines)
