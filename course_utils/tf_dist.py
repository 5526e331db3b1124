"""TensorFlow parameter-server clusters on the course's engines (units 4 and 5).

What this module decides, in one place:

* **Roles from the rank map** (:func:`plan_roles`): every ps task on rank 0 by default, worker
  ``i`` on rank ``i % world_size``. With the default 2 engines: rank 0 hosts ``ps:0`` (and
  ``ps:1`` when two are asked for) *and* ``worker:0``; rank 1 hosts ``worker:1``. Losing rank 1
  therefore loses one worker and no ps.
* **Addresses and ports**: each engine that will listen picks its own free ports, so "free" is
  true where it matters; every start picks fresh ones, so re-running a cell never collides.
* **Thread pools** (:func:`inter_op_threads`): several TF servers sharing 2 cores hang forever with
  the default inter-op pool (a remote step blocks a pool thread while it waits on another task that
  needs a thread from a pool that is already full). Every server gets ``tasks + 1`` threads.
* **Readiness** (:func:`wait_ready`): before anything connects, every task must accept a
  connection within a bounded wait; otherwise a clear error names the missing task (a missing ps
  would make ``ParameterServerStrategy``'s constructor wait forever).
* **Teardown** (:func:`teardown`): a gRPC server cannot be stopped inside its process, so the
  engines that hosted servers are replaced (``cluster.restart()``). Servers are never ``join()``-ed
  on an engine: that blocks the engine for good.

The kernel side imports TensorFlow only in :func:`connect_coordinator` (unit 5's coordinator);
the ``_engine_*`` functions run on the engines.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import ports, settings
from .cluster import CourseCluster, current
from .errors import CourseError, PortInUse, WorldSizeMismatch

JOBS = ("ps", "worker")
#: Seconds a coordinator or a readiness check waits for every task to answer.
READY_TIMEOUT = 20.0


class TFServerNotAnswering(CourseError):
    """A ps/worker task in the cluster spec does not accept connections."""


class TFTimeout(CourseError):
    """A TensorFlow step or session did not finish within its bound."""


# ---- pure functions: roles, cluster spec, TF_CONFIG, thread counts -------------------------
def plan_roles(world_size: int, num_ps: int = 1, num_workers: int | None = None,
               ps_rank: int = 0) -> dict[str, list[int]]:
    """Which rank hosts each task: ``{"ps": [rank of ps:0, ...], "worker": [...]}``.

    Every ps task sits on ``ps_rank``; worker ``i`` on rank ``i % world_size`` (one per rank
    by default). Several tasks may share an engine: each is its own gRPC server.
    """
    if world_size < 1:
        raise WorldSizeMismatch("the cluster has no engines", "start it with cu.start()")
    workers = world_size if num_workers is None else int(num_workers)
    if num_ps < 1 or workers < 1:
        raise ValueError(f"need at least one ps and one worker (got {num_ps}, {workers})")
    if not 0 <= ps_rank < world_size:
        raise ValueError(f"ps_rank {ps_rank} is not in 0..{world_size - 1}")
    return {"ps": [ps_rank] * int(num_ps), "worker": [i % world_size for i in range(workers)]}


def tasks_on_rank(roles: Mapping[str, Sequence[int]], rank: int) -> list[tuple[str, int]]:
    """The ``(job, index)`` tasks that ``rank`` hosts, ps first."""
    return [(job, i) for job in JOBS for i, r in enumerate(roles.get(job, ())) if r == rank]


def cluster_dict(roles: Mapping[str, Sequence[int]], addr_by_rank: Sequence[str],
                 ports_by_task: Mapping[tuple[str, int], int],
                 chief: str | None = None) -> dict[str, list[str]]:
    """The dict behind ``tf.train.ClusterSpec``: job -> ``["addr:port", ...]`` in task order."""
    out: dict[str, list[str]] = {}
    for job in JOBS:
        out[job] = [f"{addr_by_rank[r]}:{int(ports_by_task[(job, i)])}"
                    for i, r in enumerate(roles.get(job, ()))]
    if chief:
        out["chief"] = [chief]
    return out


def make_tf_config(cluster: Mapping[str, Sequence[str]], task_type: str,
                   task_index: int) -> dict[str, Any]:
    """The ``TF_CONFIG`` a task reads: the whole cluster plus who *this* task is."""
    if task_type not in cluster:
        raise ValueError(f"job {task_type!r} is not in the cluster (jobs: {sorted(cluster)})")
    if not 0 <= task_index < len(cluster[task_type]):
        raise ValueError(f"{task_type} has tasks 0..{len(cluster[task_type]) - 1}, "
                         f"not {task_index}")
    return {"cluster": {k: list(v) for k, v in cluster.items()},
            "task": {"type": task_type, "index": int(task_index)}}


def inter_op_threads(cluster: Mapping[str, Sequence[str]]) -> int:
    """Inter-op threads for every server: one per task in the cluster, plus one, at least 4.

    A worker running a remote step holds a pool thread while it waits on a ps (and in unit 4 on
    other workers' gradients); with fewer threads than tasks that can wait at once, co-located
    servers on a 2-core machine starve and hang forever (measured: > 10 min vs 0.4 s).
    """
    return max(4, sum(len(v) for v in cluster.values()) + 1)


def intra_op_threads() -> int:
    """Threads inside one op: the engine's share of the cores ($COURSE_THREADS)."""
    return max(1, int(os.environ.get("COURSE_THREADS", "0") or 0) or 1)


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def unanswered(addresses: Mapping[str, str], timeout: float = READY_TIMEOUT,
               poll: float = 0.1) -> list[str]:
    """Names (``"ps:0"``) of the tasks whose address does not accept a TCP connection within
    ``timeout`` seconds, polling every ``poll`` seconds. Empty when every task answers."""
    pending = dict(addresses)
    deadline = time.monotonic() + timeout
    while pending:
        for name, addr in list(pending.items()):
            host, port = split_address(addr)
            try:
                with socket.create_connection((host, port), timeout=min(1.0, timeout)):
                    pass
                pending.pop(name)
            except OSError:
                pass
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(poll)
    return sorted(pending)


# ---- the cluster of TF servers on the engines ----------------------------------------------
@dataclass
class TFCluster:
    """ps/worker servers running on the engines: roles, addresses and what each rank hosts."""

    roles: dict[str, list[int]]
    cluster: dict[str, list[str]]
    inter_op: int
    started_s: float = 0.0
    engine_ids: dict[int, int] = field(default_factory=dict)  # rank -> engine id at start

    def task_names(self) -> list[str]:
        return [f"{job}:{i}" for job in JOBS for i in range(len(self.cluster.get(job, ())))]

    def address(self, job: str, index: int) -> str:
        return self.cluster[job][index]

    def rank_of(self, job: str, index: int) -> int:
        return self.roles[job][index]

    def tf_config(self, job: str, index: int) -> str:
        return json.dumps(make_tf_config(self.cluster, job, index))

    def table(self) -> str:
        rows = [f"{'task':<9} {'rank':>4}  address"]
        for job in JOBS:
            for i, addr in enumerate(self.cluster.get(job, ())):
                rows.append(f"{job + ':' + str(i):<9} {self.roles[job][i]:>4}  {addr}")
        return "\n".join(rows)


_STATE: dict[str, Any] = {}


def active() -> TFCluster | None:
    """The TF cluster started from this kernel and still running, if any."""
    return _STATE.get("tfc")


def start_servers(cluster: CourseCluster | None = None, num_ps: int = 1,
                  num_workers: int | None = None, ps_rank: int = 0,
                  timeout: float = READY_TIMEOUT) -> TFCluster:
    """Start a ``tf.distribute.Server`` for every ps and worker task on the engines.

    Idempotent: the same request while those servers still answer returns them. Any other
    request first replaces the engines that host servers (a gRPC server cannot be stopped),
    then starts fresh servers on fresh ports. Returns once every task answers (bounded wait).
    Each engine then has, in its ``%%px`` namespace: ``tf_cluster`` (the ClusterSpec dict),
    ``tf_servers`` (``{"worker:0": server, ...}`` for the tasks it hosts), ``worker_index``
    (its worker task, or ``None``) and ``TF_CONFIG`` in its environment.
    """
    cc = cluster or current()
    roles = plan_roles(cc.world_size, num_ps, num_workers, ps_rank)
    tfc = active()
    if tfc is not None and tfc.roles == roles and tfc.engine_ids == _engine_ids(cc) \
            and not unanswered(_addresses(tfc), timeout=2):
        return tfc
    hosted = cc.run(_engine_hosted, timeout=30)
    if any(hosted):
        cc.restart()
    t0 = time.perf_counter()
    rm = cc.ranks
    addr_by_rank = [r.addr for r in rm]
    counts = [len(tasks_on_rank(roles, r)) for r in range(rm.world_size)]
    picked = cc.run_per_rank(ports.free_ports, [(n, a) for n, a in zip(counts, addr_by_rank,
                                                                       strict=True)], timeout=30)
    ports_by_task: dict[tuple[str, int], int] = {}
    for rank in range(rm.world_size):
        for task, port in zip(tasks_on_rank(roles, rank), picked[rank], strict=True):
            ports_by_task[task] = port
    spec = cluster_dict(roles, addr_by_rank, ports_by_task)
    threads = inter_op_threads(spec)
    args = [(spec, tasks_on_rank(roles, r), threads) for r in range(rm.world_size)]
    cc.run_per_rank(_engine_start, args, timeout=max(60.0, timeout + 40))
    tfc = TFCluster(roles=roles, cluster=spec, inter_op=threads, engine_ids=_engine_ids(cc))
    _STATE["tfc"] = tfc
    _register_hooks(cc)
    wait_ready(tfc, timeout=timeout)
    tfc.started_s = time.perf_counter() - t0
    return tfc


def wait_ready(tfc: TFCluster | Mapping[str, Sequence[str]], timeout: float = READY_TIMEOUT,
               jobs: Sequence[str] = JOBS) -> float:
    """Wait until every ps/worker task accepts a connection; raise naming the missing ones.

    Returns the seconds it took. Run it before building a strategy or a session: a task that
    never started would otherwise make them wait forever, silently.
    """
    spec = tfc.cluster if isinstance(tfc, TFCluster) else dict(tfc)
    addrs = {f"{job}:{i}": a for job in jobs for i, a in enumerate(spec.get(job, ()))}
    t0 = time.monotonic()
    missing = unanswered(addrs, timeout=timeout)
    if missing:
        where = ", ".join(f"{m} at {addrs[m]}" + _rank_note(tfc, m) for m in missing)
        raise TFServerNotAnswering(
            f"{len(missing)} TF task(s) did not answer within {timeout:g} s: {where}",
            "start every task's server with cu.tf_dist.start_servers() (it starts all of them "
            "and checks them); if an engine was killed or restarted, run it again",
        )
    return time.monotonic() - t0


def teardown(cluster: CourseCluster | None = None) -> bool:
    """Replace the engines that host TF servers (gRPC servers cannot be stopped in-process).

    Returns True when engines were restarted. Safe to call when nothing runs.
    """
    cc = cluster or current()
    _STATE.clear()
    try:
        hosted = cc.run(_engine_hosted, timeout=15)
    except Exception:  # an engine is gone (killed in a demo) or stuck: replace them anyway
        hosted = [True]
    if any(hosted):
        cc.restart()
        return True
    return False


def kill_rank(rank: int, cluster: CourseCluster | None = None) -> int:
    """Kill the engine process of ``rank`` (and every TF server it hosts); returns its pid.

    The engine exits on its own (``os._exit``), so this works on remote hosts too. Only
    :func:`teardown` (or ``cu.restart()``) brings the rank back.
    """
    cc = cluster or current()
    info = cc.ranks[rank]
    cc.client[info.engine_id].apply_async(os._exit, 1)
    return info.pid


def short_error(exc: BaseException) -> str:
    """One readable line for a TF error: its type and the line that names the cause."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()] or [""]
    keys = ("UNAVAILABLE:", "failed to connect", "Socket closed", "Connection")
    cause = next((ln for ln in lines if any(k in ln for k in keys)), lines[0])
    return f"{type(exc).__name__}: {cause[:200]}"


def join_within(coordinator: Any, timeout: float = 60.0) -> tuple[str | None, float]:
    """``coordinator.join()``, waited for at most ``timeout`` seconds.

    Returns ``(None, seconds)`` when every scheduled step finished, or ``(error, seconds)`` with
    the first line of the error ``join()`` raised (e.g. after a ps was lost). Raises
    :class:`TFTimeout` if ``join()`` is still waiting (the call keeps waiting in a daemon thread).
    """
    import threading

    box: dict[str, Any] = {}

    def _join() -> None:
        try:
            coordinator.join()
            box["error"] = None
        except Exception as exc:  # the coordinator re-raises what a step raised
            box["error"] = short_error(exc)

    t0 = time.monotonic()
    thread = threading.Thread(target=_join, name="course-join", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TFTimeout(f"coordinator.join() still waiting after {timeout:g} s",
                        "a task may be gone for good: run cu.tf_dist.teardown(), then restart "
                        "the kernel and the servers")
    return box["error"], time.monotonic() - t0


@contextlib.contextmanager
def watch_coordinator() -> Iterator[Counter[str]]:
    """Count what a ``ClusterCoordinator`` does about failures, without printing its log.

    Yields a Counter: ``worker_failures`` (a worker call failed), ``retried`` (a closure was put
    back on the queue to run on another worker), ``recovering`` (it started reconnecting).
    After the block TensorFlow's Python log stays at CRITICAL in this kernel: the coordinator
    keeps trying to reconnect a lost worker in the background and would print each attempt.
    """
    import logging

    counts: Counter[str] = Counter()

    class _Count(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            msg = record.getMessage()
            if "Putting back a closure" in msg:
                counts["retried"] += 1
            elif " failed with " in msg and "Worker" in msg:
                counts["worker_failures"] += 1
            elif "being recovered" in msg:
                counts["recovering"] += 1

    logger = logging.getLogger("tensorflow")
    saved = (logger.level, list(logger.handlers), logger.propagate)
    handler = _Count()
    logger.handlers = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    try:
        yield counts
    finally:
        logger.handlers = [h for h in saved[1] if h is not handler] or [logging.NullHandler()]
        logger.propagate = saved[2]
        logger.setLevel(logging.CRITICAL)


def _addresses(tfc: TFCluster) -> dict[str, str]:
    return {f"{j}:{i}": a for j in JOBS for i, a in enumerate(tfc.cluster.get(j, ()))}


def _rank_note(tfc: Any, name: str) -> str:
    if isinstance(tfc, TFCluster):
        job, idx = name.split(":")
        return f" (rank {tfc.rank_of(job, int(idx))})"
    return ""


def _engine_ids(cc: CourseCluster) -> dict[int, int]:
    return {r.rank: r.engine_id for r in cc.ranks}


def _register_hooks(cc: CourseCluster) -> None:
    # Engines replaced by cu.restart() host no servers any more.
    cc.on_restart("tf", lambda c: _STATE.clear())
    # A course-lab cluster outlives this notebook: free its engines of our servers on cu.stop().
    cc.on_stop("tf", lambda c: None if c.owned else teardown(c))


# ---- kernel side: unit 5's coordinator -----------------------------------------------------
def quiet_tensorflow() -> Any:
    """Import TensorFlow with its C++ and Python logging reduced to errors that matter."""
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import logging
    import sys

    if "tensorflow" not in sys.modules:
        # TF 2.21 prints its start-up lines (oneDNN, CUDA stub) from C++ before its log level is
        # read, straight to file descriptor 2, where a notebook shows them: silence that fd
        # for the import only. Python errors still propagate.
        with contextlib.suppress(OSError), _stderr_fd_silenced():
            import tensorflow  # noqa: F401
    import tensorflow as tf

    logger = tf.get_logger()
    logger.setLevel(logging.ERROR)
    if not any(isinstance(f, _DropUnusedTensorNotes) for f in logger.filters):
        logger.addFilter(_DropUnusedTensorNotes())
    try:
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.ERROR)
    except ImportError:  # pragma: no cover - absl ships with TF
        pass
    return tf


class _DropUnusedTensorNotes:
    """Drops TF's "Object was never used" note, logged at ERROR when a graph built only to be
    inspected (e.g. for its device placement) is garbage-collected."""

    def filter(self, record: Any) -> bool:
        return "Object was never used" not in str(record.msg)


@contextlib.contextmanager
def _stderr_fd_silenced() -> Iterator[None]:
    import sys

    with contextlib.suppress(Exception):
        sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _kernel_address(cc: CourseCluster) -> str:
    if cc.profile.is_local:
        return "127.0.0.1"
    from .engine import _route_addr

    return _route_addr(cc.ranks.master_addr)


def connect_coordinator(tfc: TFCluster | None = None, variable_partitioner: Any = None,
                        timeout: float = READY_TIMEOUT,
                        cluster: CourseCluster | None = None) -> Any:
    """A ``ParameterServerStrategy`` whose coordinator (the "chief") is this kernel.

    Checks that every ps and worker answers first (bounded), then gives the kernel a fresh
    chief port (its own gRPC server cannot be stopped either, so a re-run needs a new one).
    """
    cc = cluster or current()
    tfc = tfc or active()
    if tfc is None:
        raise TFServerNotAnswering("no TF servers are running on the engines",
                                   "run cu.tf_dist.start_servers() first")
    wait_ready(tfc, timeout=timeout)
    tf = quiet_tensorflow()
    threads = inter_op_threads(tfc.cluster)
    try:  # only possible before TF's runtime started in this kernel; later runs keep the first
        tf.config.threading.set_inter_op_parallelism_threads(threads)
        tf.config.threading.set_intra_op_parallelism_threads(intra_op_threads())
    except RuntimeError:
        pass
    addr = _kernel_address(cc)
    spec = {**tfc.cluster, "chief": [f"{addr}:{ports.free_port(addr)}"]}
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(spec), task_type="chief", task_id=0, rpc_layer="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=variable_partitioner)
    _STATE["strategy_cluster"] = spec
    return strategy


# ---- engine side ---------------------------------------------------------------------------
_SERVERS: dict[str, Any] = {}


def _engine_hosted() -> list[str]:
    return sorted(_SERVERS)


def server_config(cluster: Mapping[str, Sequence[str]], inter_op: int | None = None,
                  device_filters: Sequence[str] | None = None) -> Any:
    """The ConfigProto every server (and session) uses: sized pools, optional device filters."""
    import tensorflow as tf

    cfg = tf.compat.v1.ConfigProto()
    cfg.inter_op_parallelism_threads = int(inter_op or inter_op_threads(cluster))
    cfg.intra_op_parallelism_threads = intra_op_threads()
    if device_filters:
        cfg.device_filters.extend(device_filters)
    return cfg


def _engine_start(spec: dict[str, list[str]], tasks: list[tuple[str, int]],
                  inter_op: int) -> dict[str, Any]:
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import __main__

    tasks = [tuple(t) for t in tasks]
    ns = vars(__main__)
    ns["tf_cluster"] = spec
    ns["tf_servers"] = {}
    ns["worker_index"] = next((i for job, i in tasks if job == "worker"), None)
    if not tasks:
        os.environ.pop("TF_CONFIG", None)
        return {"pid": os.getpid(), "tasks": []}
    if _SERVERS:
        raise PortInUse(f"this engine already hosts TF servers {sorted(_SERVERS)}",
                        "call cu.tf_dist.teardown() (restarts the engines), then start again")
    tf = quiet_tensorflow()
    cfg = server_config(spec, inter_op)
    cluster_spec = tf.train.ClusterSpec(spec)
    for job, idx in tasks:
        host, port = split_address(spec[job][idx])
        if ports.port_in_use(port, host):
            raise PortInUse(f"{job}:{idx} cannot listen on {host}:{port}: the port is taken",
                            "run cu.tf_dist.start_servers() again: it picks fresh ports")
        server = tf.distribute.Server(cluster_spec, job_name=job, task_index=idx, config=cfg,
                                      protocol="grpc", start=True)
        _SERVERS[f"{job}:{idx}"] = server
        ns["tf_servers"][f"{job}:{idx}"] = server
    job0, idx0 = next(((j, i) for j, i in tasks if j == "worker"), tasks[0])
    os.environ["TF_CONFIG"] = json.dumps(make_tf_config(spec, job0, idx0))
    return {"pid": os.getpid(), "tasks": [f"{j}:{i}" for j, i in tasks]}


def step_timeout_ms() -> int:
    """Milliseconds one session step may wait (on a ps, on other workers) before it raises
    DeadlineExceeded instead of hanging."""
    return int(min(settings.call_timeout(), 60) * 1000)


def session_config(worker_index: int, cluster: Mapping[str, Sequence[str]] | None = None) -> Any:
    """ConfigProto for worker ``worker_index``'s session: sized pools, a step timeout, and
    device filters so it talks to the ps tasks and itself only (never to the other workers)."""
    import __main__

    spec = cluster or vars(__main__)["tf_cluster"]
    cfg = server_config(spec, device_filters=["/job:ps", f"/job:worker/task:{worker_index}"])
    cfg.operation_timeout_in_ms = step_timeout_ms()
    return cfg


def wait_for_chief(target: str, timeout: float = 60.0, poll: float = 0.1) -> float:
    """On a non-chief worker: wait until the chief has initialized the variables of the current
    default graph on the ps, then return the seconds waited.

    Without it, ``MonitoredTrainingSession`` on a non-chief checks once and then sleeps a fixed
    30 s before looking again. Raises :class:`TFTimeout` if the chief never initializes them.
    """
    import tensorflow as tf

    graph = tf.compat.v1.get_default_graph()
    with graph.as_default():
        probe = tf.compat.v1.report_uninitialized_variables(tf.compat.v1.global_variables())
    t0 = time.monotonic()
    cfg = tf.compat.v1.ConfigProto(operation_timeout_in_ms=int(timeout * 1000))
    with tf.compat.v1.Session(target, graph=graph, config=cfg) as sess:
        while True:
            left = sess.run(probe)
            if len(left) == 0:
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                names = ", ".join(n.decode() for n in left[:5])
                raise TFTimeout(
                    f"the chief (worker 0) did not initialize {names} within {timeout:g} s",
                    "worker 0 must run the same graph with is_chief=True at the same time",
                )
            time.sleep(poll)


def reset_ps(cluster: CourseCluster | None = None, tfc: TFCluster | None = None) -> None:
    """Clear every variable and queue the ps/worker servers hold (graph mode).

    Variables on a ps outlive the sessions that made them; a second training run with the same
    names would start from the first run's values (and a non-chief would think it may start).
    """
    cc = cluster or current()
    tfc = tfc or active()
    if tfc is None:
        raise TFServerNotAnswering("no TF servers are running", "run cu.tf_dist.start_servers()")
    cc.run_on(tfc.rank_of("worker", 0), _engine_reset, timeout=30)


def task_of(device: str) -> str:
    """``"/job:ps/task:0/device:CPU:0"`` -> ``"/job:ps/task:0"`` (``""`` when unplaced)."""
    return device.split("/device")[0] if device else ""


def cross_task_traffic(graph: Any, batch: int) -> list[dict[str, Any]]:
    """Every tensor one training step sends from one task to another in ``graph``.

    Each entry: tensor name, source and destination task, and its size in bytes for a batch of
    ``batch`` (unknown dimensions are the batch). Ops without a device are skipped.
    """
    seen = set()
    out = []
    for op in graph.get_operations():
        dst = task_of(op.device)
        for tensor in op.inputs:
            src = task_of(tensor.op.device)
            if not src or not dst or src == dst or (tensor.name, dst) in seen:
                continue
            seen.add((tensor.name, dst))
            if tensor.op.type == "VarHandleOp":  # a remote read moves the variable's value
                shape = [d.size for d in tensor.op.get_attr("shape").dim]
                itemsize = tensor.op.get_attr("dtype").size
            else:
                shape = tensor.shape.as_list() if tensor.shape.rank is not None else [None]
                itemsize = tensor.dtype.size or 8
            size = itemsize
            for d in shape:
                size *= batch if d is None else d
            out.append({"tensor": tensor.name, "from": src, "to": dst, "bytes": size,
                        "per_example": None in shape})
    return out


def _engine_one_step() -> float:
    """``course doctor``: one SGD step (lr 0.1) on (w - 3)^2 with w on the ps; returns w (0.6)."""
    import __main__

    tf = quiet_tensorflow()
    ns = vars(__main__)
    spec = ns["tf_cluster"]
    wi = ns["worker_index"]
    graph = tf.Graph()
    with graph.as_default():
        setter = tf.compat.v1.train.replica_device_setter(
            worker_device=f"/job:worker/task:{wi}", cluster=tf.train.ClusterSpec(spec))
        with tf.compat.v1.device(setter):
            w = tf.compat.v1.get_variable("doctor_w", [],
                                          initializer=tf.compat.v1.zeros_initializer())
            loss = tf.square(w - 3.0)
            step = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        with tf.compat.v1.Session(ns["tf_servers"][f"worker:{wi}"].target,
                                  config=session_config(wi, spec)) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(step)
            return float(sess.run(w))


def _engine_reset() -> bool:
    import tensorflow as tf

    import __main__

    server = vars(__main__)["tf_servers"]["worker:0"]
    tf.compat.v1.Session.reset(server.target)
    return True
