"""TF tasks as processes of their own: :func:`start`, :func:`stop`, :func:`kill_task`, and the
helpers of the drills in ``08_hangs_and_faults`` (a ps that never started, a worker lost under
``ParameterServerStrategy``, a ps lost and the restore, each with a bounded wait). Units 7 and 9
time and train on the same tasks.

Every ps/worker task here is a real ``tf.distribute.Server`` in a process of its own
(:mod:`.task_server`), on the host of the rank the rank map gives it, forked there by one task
starter per host (one TensorFlow import per host, :func:`start_starters`). Killing a task kills
that process only: the engines, their torch process group and the other tasks live on, so the
drills need no engine restart. Units 4-5 host their servers inside the engines
(:mod:`.servers`) instead; both kinds are a :class:`~.taskset.TaskSet`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from .. import settings
from ..cluster import CourseCluster, current, ports
from .spec import (
    TFServerNotAnswering,
    cluster_dict,
    inter_op_threads,
    plan_roles,
    split_address,
    tasks_on_rank,
)
from .taskset import IN_PROCESSES, TaskSet, pick_ports, wait_ready


def starters(cluster: CourseCluster | None = None) -> list[int]:
    """The rank whose engine starts the task processes of each rank's host: the lowest rank on
    that host (one TensorFlow import per host, not per rank)."""
    cc = cluster or current()
    first: dict[tuple[str, str], int] = {}
    return [first.setdefault((r.host, r.addr), r.rank) for r in cc.ranks]


def import_in_background() -> bool:
    """Import TensorFlow in this kernel in a background thread (section 6's coordinator needs
    it); a later ``import tensorflow`` waits for it. Call it before the kernel waits on the
    engines for a while (an import holds the interpreter lock for long stretches, so it slows
    whatever else this kernel does meanwhile). Returns False if already imported or started."""
    if "tensorflow" in sys.modules or _KERNEL_IMPORT:
        return False
    from .quiet import quiet_tensorflow

    _KERNEL_IMPORT["thread"] = threading.Thread(target=quiet_tensorflow, daemon=True,
                                                name="course-tensorflow-import")
    _KERNEL_IMPORT["thread"].start()
    return True


def start_starters(cluster: CourseCluster | None = None) -> list[int]:
    """Start the task starter (:mod:`.task_server`) of every host, which imports TensorFlow
    in the background: call it early, and :func:`start` later starts servers at once.
    Returns the starters' pids."""
    cc = cluster or current()
    return [cc.run_on(r, engine_start_zygote, timeout=30) for r in sorted(set(starters(cc)))]


_KERNEL_IMPORT: dict[str, Any] = {}


def start(cluster: CourseCluster | None = None, num_ps: int = 1, num_workers: int = 2,
          timeout: float = 120.0) -> TaskSet:
    """Start one process per ps/worker task (ps on rank 0, worker ``i`` on rank ``i % p``),
    each forked on its rank's host by that host's task starter, and wait (bounded) until
    every task answers. Raises :class:`TFServerNotAnswering` naming the tasks that did not.
    ``.stop()`` on the result is :func:`stop`."""
    cc = cluster or current()
    roles = plan_roles(cc.world_size, num_ps, num_workers)
    t0 = time.perf_counter()
    spec = cluster_dict(roles, [r.addr for r in cc.ranks], pick_ports(cc, roles))
    threads = inter_op_threads(spec)
    owner = starters(cc)
    started_by = {f"{j}:{i}": owner[r] for r in range(cc.world_size)
                  for j, i in tasks_on_rank(roles, r)}
    args = [(spec, [t for t, s in started_by.items() if s == r], threads, timeout)
            for r in range(cc.world_size)]
    pids: dict[str, int] = {}
    for got in cc.run_per_rank(engine_spawn_tasks, args, timeout=timeout + 30):
        pids.update(got)
    ts = TaskSet(roles=roles, cluster=spec, inter_op=threads, hosted_in=IN_PROCESSES, pids=pids,
                 started_by=started_by, stopper=lambda: stop(cc))
    wait_ready(ts, timeout=30.0)
    ts.started_s = time.perf_counter() - t0
    return ts


def with_missing_ps(tp: TaskSet, index: int = 0) -> dict[str, list[str]]:
    """``tp``'s cluster spec with ``ps:index`` moved to a free port nobody serves: the spec of a
    job whose ps task never started."""
    host, _ = split_address(tp.cluster["ps"][index])
    ps = list(tp.cluster["ps"])
    ps[index] = f"{host}:{ports.free_port(host)}"
    return {**tp.cluster, "ps": ps}


def kill_task(tp: TaskSet, task: str, cluster: CourseCluster | None = None) -> int:
    """SIGKILL the process of ``task`` (``"worker:1"``) from the engine that started it; returns
    its pid. The engines and every other task keep running."""
    cc = cluster or current()
    return int(cc.run_on(tp.started_by.get(task, tp.rank_of(task)), engine_kill_task, task,
                         timeout=15))


def stop(cluster: CourseCluster | None = None) -> int:
    """Kill every task process the engines started; returns how many were still running."""
    cc = cluster or current()
    return sum(cc.run(engine_stop_tasks, timeout=30))


def coordinator_for(spec: dict[str, list[str]], timeout: float = 10.0,
                    cluster: CourseCluster | None = None) -> tuple[Any, Any]:
    """A ``ParameterServerStrategy`` for ``spec`` with this kernel as the chief
    (:func:`~course_utils.tf_dist.start_coordinator`), and its ``ClusterCoordinator``. Checks
    first (bounded) that every task answers: a missing one raises
    :class:`TFServerNotAnswering` naming it, instead of a constructor that waits forever."""
    from .coordinator import start_coordinator
    from .quiet import quiet_tensorflow

    strategy = start_coordinator(spec, timeout=timeout, cluster=cluster)
    return strategy, quiet_tensorflow().distribute.coordinator.ClusterCoordinator(strategy)


def wait_for_steps(variable: Any, at_least: int, timeout: float = 30.0) -> int:
    """Poll a ps-held counter until it reaches ``at_least`` (bounded); returns its value."""
    deadline = time.monotonic() + timeout
    value = int(variable.numpy())
    while value < at_least and time.monotonic() < deadline:
        time.sleep(0.02)
        value = int(variable.numpy())
    return value


# ---- engine side ----------------------------------------------------------------------------
_ZYGOTE: dict[str, Any] = {}
_PIDS: dict[str, int] = {}


def engine_start_zygote() -> int:
    """*Not collective.* Start this host's :mod:`.task_server` zygote if it is not running
    (it imports TensorFlow once, in the background); returns its pid. Idempotent."""
    proc = _ZYGOTE.get("proc")
    if proc is not None and proc.poll() is None:
        return int(proc.pid)
    root = str(settings.course_root())
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("TF_CONFIG", None)
    proc = subprocess.Popen([sys.executable, "-m", "course_utils.tf_dist.task_server"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=env, text=True, bufsize=1)
    _ZYGOTE.update(proc=proc, ready=False)
    return int(proc.pid)


def _reply(proc: Any, deadline: float) -> dict[str, Any]:
    import select

    while True:
        left = deadline - time.monotonic()
        if left <= 0 or proc.poll() is not None:
            raise TFServerNotAnswering(
                "this host's TF task starter (a process that imports TensorFlow once) did not "
                "answer in time" + ("" if proc.poll() is None else " (it exited)"),
                "run the cell again; on a busy machine pass a larger timeout=")
        ready, _, _ = select.select([proc.stdout], [], [], min(left, 1.0))
        if ready:
            line = proc.stdout.readline()
            if line.strip():
                return dict(json.loads(line))


def engine_spawn_tasks(spec: dict[str, list[str]], tasks: list[str], inter_op: int,
                       timeout: float = 120.0) -> dict[str, int]:
    """*Not collective.* Fork one server process per task (``"ps:0"``) from this host's zygote
    (started if needed, waited for at most ``timeout`` s); returns their pids."""
    if not tasks:
        return {}
    engine_start_zygote()
    proc = _ZYGOTE["proc"]
    deadline = time.monotonic() + timeout
    if not _ZYGOTE["ready"]:
        _reply(proc, deadline)                        # {"ready": pid}: TensorFlow imported
        _ZYGOTE["ready"] = True
    out = {}
    for task in tasks:
        _kill(_PIDS.pop(task, None))
        proc.stdin.write(json.dumps({"spec": spec, "task": task, "inter_op": inter_op}) + "\n")
        proc.stdin.flush()
        out[task] = _PIDS[task] = int(_reply(proc, deadline)["pid"])
    return out


def _kill(pid: int | None, timeout: float = 10.0) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:   # our own child: reap it
                break
        except ChildProcessError:                # the zygote's child: it reaps itself
            pass
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.02)
    return True


def engine_kill_task(task: str) -> int:
    """*Not collective.* SIGKILL this host's process of ``task``; returns its pid."""
    pid = _PIDS.pop(task, None)
    if pid is None:
        raise KeyError(f"this engine started no process for {task}")
    _kill(pid)
    return pid


def engine_stop_tasks() -> int:
    """*Not collective.* Kill every task process this engine started (the zygote stays, for
    the next start); returns how many were still running."""
    alive = sum(_kill(pid) for pid in list(_PIDS.values()))
    _PIDS.clear()
    return alive
