"""Ranks of their own for graded checks that the course's cluster is too small to decide.

Grading and CI run 2 engines on one host. There some wrong answers look right: a ring that
ignores its step index (each phase has one step), a ring that sends left instead of right (left
and right are the same rank), ``local_rank`` where ``rank`` belongs (one host: they are equal).
:func:`side_ranks` copies the learner's ``%%px`` functions from rank 0's engine
(:func:`~course_utils.torch_dist.px_functions.engine_snapshot_of`) to a few short-lived Python
processes started by that engine, gives them a rank map of their own (for example two simulated
hosts of two ranks each, built by the real :func:`~course_utils.cluster.ranks.build_rank_map`),
a real gloo process group, runs the course's engine-side probes there and stops them.
The course's cluster and its process group are not touched. Used by the graded tests of
``00_cluster_tour`` and ``01_collectives``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: The spare process: imports torch once, then forks the side ranks of every request.
_ZYGOTE = r"""
import os, sys, time
folder, parent, idle = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
import torch.distributed
from course_utils.checks.side_ranks import serve
serve(folder, parent, idle)
"""

#: Seconds a check waits for the spare process to finish importing torch (it starts at setup).
START_S = 240.0

#: This engine's spare process and its folder (see :func:`engine_warm`).
_SPARE: dict[str, Any] = {}


def engine_warm(idle_s: float = 1800.0) -> bool:
    """*Not collective.* Start, in the background, this engine's spare Python process for
    :func:`engine_run_side_ranks` (unless one is running): it imports torch once (seconds on an
    idle machine, a minute on a loaded one; none on an engine forked by a fork server, which
    forks the spare too) and then forks the side ranks of every check at once. It exits when
    this engine exits, or after ``idle_s`` seconds without a request.
    Returns whether it was already running. Called on rank 0 through :func:`warm` by the setup
    cells of ``00_cluster_tour`` and ``01_collectives``."""
    import os
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    import course_utils

    proc = _SPARE.get("proc")
    if proc is not None and proc.poll() is None:
        return True
    folder = tempfile.mkdtemp(prefix="course-side-")
    root = str(Path(course_utils.__file__).resolve().parent.parent)
    from ..cluster import fork_protocol
    from ..torch_dist.process_group import loopback_ifname

    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": loopback_ifname() or "lo",
           "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    with open(Path(folder) / "spare.log", "wb") as log:
        # on an engine forked by a fork server, which has imported torch already: forked there
        proc = fork_protocol.fork_helper(fork_protocol.FORK_SERVER, f"{__name__}:serve",
                                         [folder, os.getpid(), idle_s], [log.fileno()], env,
                                         folder)
        if proc is None:
            proc = subprocess.Popen(
                [sys.executable, "-c", _ZYGOTE, folder, str(os.getpid()), str(idle_s)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                cwd=folder)
    _SPARE.update(folder=folder, proc=proc)
    return False


def serve(folder: str, parent: int, idle_s: float) -> None:
    """The spare process's loop (torch already imported): for each request file
    ``NAME.req`` in ``folder`` fork one process per side rank (each runs :func:`side_rank`),
    reap them, and exit with the engine ``parent`` that asked for it or after ``idle_s`` idle
    seconds."""
    import torch

    torch.set_num_threads(1)  # forked from a server that imported torch with other settings
    (Path(folder) / "ready").touch()
    try:
        _serve_requests(Path(folder), parent, idle_s)
    finally:  # the folder is the spare's own: nothing in it is read once the spare is gone
        import shutil

        shutil.rmtree(folder, ignore_errors=True)


def _serve_requests(folder: Path, parent: int, idle_s: float) -> None:
    import os
    import time

    from ..procs import pid_alive

    last = time.monotonic()
    # the engine is its parent, or (forked by the engine's fork server) its sibling
    while pid_alive(parent) and time.monotonic() - last < idle_s:
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        reqs = sorted(folder.glob("*.req"))
        if not reqs:
            time.sleep(0.05)
            continue
        payload, size = reqs[0].read_text().split()
        reqs[0].unlink()
        for i in range(int(size)):
            if os.fork() == 0:
                code = 1
                try:
                    side_rank(payload, i)
                    code = 0
                finally:
                    os._exit(code)
        last = time.monotonic()


def side_rank(payload_path: str, me: int) -> None:
    """One side rank (a forked child of the spare process): restore the learner's functions,
    then for each world it belongs to take its rank-map entry, join the world's gloo group,
    call the probes and write the results to ``payload_path.out.ME``."""
    import os
    import pickle

    log = os.open(f"{payload_path}.log.{me}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(log, 1)
    os.dup2(log, 2)
    with open(f"{payload_path}.pid.{me}", "w") as f:
        f.write(str(os.getpid()))
    out: list[Any] = []
    try:
        _run_worlds(payload_path, me, out)
    except BaseException as exc:   # say why instead of leaving the engine to its timeout
        out = [{"crash": f"side rank {me}: {type(exc).__name__}: {str(exc)[:400]}"}]
    with open(f"{payload_path}.tmp.{me}", "wb") as f:
        pickle.dump(out, f)
    os.replace(f"{payload_path}.tmp.{me}", f"{payload_path}.out.{me}")


def _run_worlds(payload_path: str, me: int, out: list[Any]) -> None:
    import datetime
    import importlib
    import os
    import pickle
    import time

    import torch.distributed as dist

    import __main__

    from ..torch_dist.process_group import rendezvous_store
    from ..torch_dist.px_functions import engine_restore

    t0 = time.monotonic()
    with open(payload_path, "rb") as f:
        payload = pickle.load(f)
    for snap in payload["snapshots"]:
        engine_restore(snap)
    for world in payload["worlds"]:
        if me >= len(world["ranks"]):
            out.append(None)
            continue
        info = world["ranks"][me]
        vars(__main__).update(rank=info["rank"], world_size=info["world_size"],
                              local_rank=info["local_rank"], host=info["host"])
        os.environ.update(RANK=str(info["rank"]), WORLD_SIZE=str(info["world_size"]),
                          LOCAL_RANK=str(info["local_rank"]), MASTER_ADDR=info["master_addr"])
        if world["group"]:
            wait = datetime.timedelta(seconds=payload["wait_s"])
            store = rendezvous_store(info["rank"], info["world_size"], "127.0.0.1",
                                     world["store_port"], wait)  # loopback only
            dist.init_process_group("gloo", store=store, rank=info["rank"],
                                    world_size=info["world_size"], timeout=wait)
        said = []
        for mod, name, args in world["calls"]:
            args = [world["fill"].get(a, a) if isinstance(a, str) else a for a in args]
            try:
                said.append(getattr(importlib.import_module(mod), name)(*args))
            except Exception as exc:
                said.append({"side_error": f"{type(exc).__name__}: {str(exc)[:300]}"})
        if dist.is_initialized():
            dist.destroy_process_group()
        out.append(said)
        print(f"world of {len(world['ranks'])} done after {time.monotonic() - t0:.1f} s",
              flush=True)


def simulated_rank_map(hosts: Sequence[int]) -> list[dict[str, Any]]:
    """A rank map of ``sum(hosts)`` ranks on ``len(hosts)`` simulated hosts (``hosts[k]`` ranks
    on host ``k``), all on this machine, as the rank map's dicts: ``hosts=(2, 2)`` gives ranks
    0-3 with local ranks 0, 1, 0, 1. Pure."""
    from ..cluster.ranks import build_rank_map

    descriptions, eid = {}, 0
    for k, count in enumerate(hosts):
        for _ in range(count):
            descriptions[eid] = {"host": "localhost", "addr": "127.0.0.1", "pid": 0, "gpus": 0,
                                 "node": f"host{k}"}
            eid += 1
    return build_rank_map(descriptions, [f"host{k}" for k in range(len(hosts))],
                          local=True).to_dicts()


def engine_run_side_ranks(fn_names: Sequence[str], worlds: Sequence[dict[str, Any]],
                          timeout: float = 60.0, wait_s: float = 20.0,
                          start_s: float = START_S) -> list[dict[str, Any]]:
    """*Not collective* (one engine runs it). Fork ``max(world size)`` processes from this
    engine's spare process (:func:`engine_warm`; started now if it is not running), copy the
    ``%%px`` functions ``fn_names`` into each, and run every world of ``worlds`` in turn.

    A world is ``{"hosts": (2, 2), "group": True, "calls": [(module, function, args), ...]}``:
    its ranks get a :func:`simulated_rank_map` (``rank``, ``world_size``, ``local_rank``,
    ``host`` as on an engine), a gloo process group when ``group`` is true, and call each probe
    in order; the arguments ``"$master_addr"`` and ``"$master_port"`` stand for a free port of
    the world's own (for a learner's function that builds its own group). Returns per world
    ``{"ranks", "master_addr", "master_port", "results", "log"}`` (``log``: the end of what
    each side rank printed, with its timings), ``results[call][rank]`` being a
    probe's return value or ``{"side_error": text}``. A side rank still running after
    ``timeout`` seconds is killed, and the error says so. When gloo aborted a side rank (it
    does, for a message larger than the buffer posted to receive it), the others are stopped at
    once and the result is ``[{"crash": gloo's line, "rank": i, "log": ...}]``.
    """
    import os
    import pickle
    import signal
    import time
    from pathlib import Path

    from ..torch_dist.px_functions import engine_snapshot_of

    snapshots = [engine_snapshot_of(name) for name in fn_names]
    plan = [_plan(w) for w in worlds]
    size = max(len(w["ranks"]) for w in plan)
    warm = engine_warm()
    folder = Path(_SPARE["folder"])
    payload = folder / f"check-{time.time_ns()}.pkl"
    payload.write_bytes(pickle.dumps({"snapshots": snapshots, "worlds": plan,
                                      "wait_s": wait_s}))
    (folder / "request.tmp").write_text(f"{payload} {size}")
    os.replace(folder / "request.tmp", payload.with_suffix(".req"))
    outs = [Path(f"{payload}.out.{i}") for i in range(size)]
    _wait_ready(folder, start_s)
    deadline = time.monotonic() + timeout
    died: list[int] = []
    while not all(o.exists() for o in outs) and time.monotonic() < deadline and not died:
        if _SPARE["proc"].poll() is not None:
            break
        time.sleep(0.05)
        died = [i for i in range(size) if not outs[i].exists() and _gone(payload, i)
                and not outs[i].exists()]
    late = [i for i, o in enumerate(outs) if not o.exists()]
    tails = [_tail(Path(f"{payload}.log.{i}"), f"side rank {i}: ") for i in range(size)]
    for i in late:   # stop what is still running
        with contextlib.suppress(Exception):
            os.kill(int(Path(f"{payload}.pid.{i}").read_text()), signal.SIGKILL)
    if died:   # gloo aborts a process on some mistakes (a message larger than its receive)
        for f in folder.glob(f"{payload.name}*"):
            f.unlink(missing_ok=True)
        return [{"crash": _abort_line(tails[died[0]]), "rank": died[0], "log": tails}]
    if late:
        spare = (folder / "spare.log").read_bytes().decode(errors="replace")[-400:]
        state = ("the spare process was still importing torch" if not warm else
                 "they were started")
        raise TimeoutError(
            f"the check's own {size} ranks did not all finish within {timeout:g} s (side ranks "
            f"{late}; {state}; the late ones were stopped). Is the machine very busy? Re-run "
            f"the test. What they printed: {' | '.join(tails)} {spare}".strip())
    results = [pickle.loads(o.read_bytes()) for o in outs]
    crashed = [r[0]["crash"] for r in results if r and isinstance(r[0], dict) and "crash" in r[0]]
    if crashed:
        raise RuntimeError(f"the check's own ranks stopped: {crashed[0]}; what they printed: "
                           + " | ".join(tails))
    for f in folder.glob(f"{payload.name}*"):
        f.unlink(missing_ok=True)
    return [{"ranks": w["ranks"], "master_addr": "127.0.0.1",
             "master_port": w["fill"]["$master_port"], "log": tails,
             "results": [[results[r][k][c] for r in range(len(w["ranks"]))]
                         for c in range(len(w["calls"]))]}
            for k, w in enumerate(plan)]


def _plan(w: dict[str, Any]) -> dict[str, Any]:
    """One world as the side ranks read it: its rank map, group, calls and two free ports."""
    from ..cluster.ports import free_ports

    store, port = free_ports(2, "127.0.0.1")
    return {"ranks": simulated_rank_map(w["hosts"]), "group": bool(w.get("group", True)),
            "calls": [tuple(c) for c in w["calls"]], "store_port": store,
            "fill": {"$master_addr": "127.0.0.1", "$master_port": port}}


def _wait_ready(folder: Any, start_s: float) -> None:
    """Wait until the spare process has imported torch (its ``ready`` file), or say why not."""
    import time

    ready = time.monotonic() + start_s   # a loaded machine may take a minute to import torch
    while not (folder / "ready").exists() and time.monotonic() < ready \
            and _SPARE["proc"].poll() is None:
        time.sleep(0.1)
    if not (folder / "ready").exists():
        spare = (folder / "spare.log").read_bytes().decode(errors="replace")[-400:]
        raise TimeoutError(
            f"the spare process for the check's own ranks did not import torch within "
            f"{start_s:g} s (exit code {_SPARE['proc'].poll()}): is the machine very busy? "
            f"Re-run the test. It printed: {spare}")


def _tail(log: Any, head: str) -> str:
    said = log.read_bytes().decode(errors="replace")[-600:].strip() if log.exists() else ""
    return head + said


def _gone(payload: Any, i: int) -> bool:
    """Whether side rank ``i`` started and its process no longer exists (reaped by the
    spare process)."""
    import os
    from pathlib import Path

    pid = Path(f"{payload}.pid.{i}")
    try:
        os.kill(int(pid.read_text()), 0)
    except ProcessLookupError:
        return True
    except (OSError, ValueError):
        return False
    return False


def _abort_line(tail: str) -> str:
    """The line of a side rank's output that says why it was aborted (gloo's ``what()``)."""
    lines = [ln.strip() for ln in tail.splitlines() if ln.strip()]
    said = next((ln for ln in lines if "what()" in ln or "Error" in ln), lines[-1] if lines
                else "no output")
    return said.replace("what():", "").strip()[:300]


def side_ranks(fn_names: Sequence[str], worlds: Sequence[dict[str, Any]], cluster: Any = None,
               timeout: float = 90.0) -> list[dict[str, Any]]:
    """Kernel side: :func:`engine_run_side_ranks` on rank 0's engine of ``cluster`` (default:
    the current one), with ``timeout`` seconds for the run once the spare process is ready
    (which it usually is: the setup cell started it; else up to :data:`START_S` more)."""
    from ..cluster import current

    cc = cluster or current()
    return cc.run_on(0, engine_run_side_ranks, list(fn_names), list(worlds), timeout,
                     timeout=timeout + START_S + 15)


def warm(cluster: Any = None) -> bool:
    """Kernel side: :func:`engine_warm` on rank 0's engine of ``cluster`` (default: the
    current one), now and after every restart of the cluster; returns at once. What the setup
    cells of ``00_cluster_tour`` and ``01_collectives`` call, so that the tests' own ranks
    start in seconds later."""
    from ..cluster import current

    cc = cluster or current()
    # cu.restart() replaces the engines, and the spare process exits with its engine: start the
    # new engines' spare at once (if that fails, the next check starts the spare itself).
    cc.on_restart("side-ranks", _warm_quietly)
    return bool(cc.run_on(0, engine_warm, timeout=60))


def _warm_quietly(cc: Any) -> None:
    with contextlib.suppress(Exception):
        cc.run_on(0, engine_warm, timeout=60)
