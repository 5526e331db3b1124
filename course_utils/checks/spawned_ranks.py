"""*Runs in the processes* :func:`course_utils.checks.spawn.spawn` *starts*: one launcher that
imports torch once and forks a process per rank before any process group exists, and each rank,
which takes its entry of a rank map, joins a gloo group of its own (unless the probe builds
one), runs the learner's cells and one probe, and leaves its result (pickled) or its traceback
in the world's folder.

Started as ``python -m course_utils.checks.spawned_ranks SPEC``, or forked by a fork server that
imported torch already (then the import costs nothing).
"""

from __future__ import annotations

import linecache
import os
import pickle
import signal
import sys
import time
from pathlib import Path
from typing import Any


def main(spec_path: str) -> None:
    """The launcher: fork every rank (before any group exists), wait for them, and say which
    signal ended a rank (gloo aborts a process on some mistakes: that leaves no traceback)."""
    import torch._dynamo  # noqa: F401  (a rank's first optimizer imports it: ~2 CPU-s)
    import torch.distributed as dist  # imported once, before the fork

    from . import sharding  # noqa: F401  (what the unit 10 probes import: once, here)

    # a launcher forked by a fork server inherits the level the server read at its import:
    # read this process's own TORCH_DISTRIBUTED_DEBUG, as a fresh python would
    dist.set_debug_level_from_env()

    spec = pickle.loads(Path(spec_path).read_bytes())
    children = {}
    for r in range(len(spec["ranks"])):
        pid = os.fork()
        if pid == 0:
            os._exit(run_rank(spec_path, spec, r))
        children[pid] = r
    code = 0
    while children:  # in the order they end: an aborted rank is said while its peers wait
        pid, status = os.wait()
        r, ended = children.pop(pid), os.waitstatus_to_exitcode(status)
        if ended < 0:
            print(f"rank {r} was ended by {signal.Signals(-ended).name}", file=sys.stderr,
                  flush=True)
        code |= ended != 0
    sys.exit(code)


#: Seconds a rank with its result waits for its peers' before it closes its connections: long
#: enough for a peer's last collective to finish, short beside a hang (a rank left waiting in a
#: collective its peers never call learns of it when they close).
PEER_WAIT_S = 3.0


def wait_for_peers(folder: Path, nprocs: int, timeout: float = PEER_WAIT_S) -> bool:
    """Until every rank in ``folder`` has its result, or one has failed, or ``timeout`` s: True
    when the world is over. A rank that left as soon as its last collective returned closed its
    connections while a peer could still be receiving that collective's last bytes from it (the
    likely cause of a "Connection closed by peer" on rank 0 of unit 10's 4-rank resume check,
    in a clean run, with no rank's own error beside it)."""
    deadline = time.monotonic() + timeout
    while True:
        if (len(list(folder.glob("result-*.pkl"))) >= nprocs
                or any(folder.glob("failed-*.txt"))):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def run_rank(spec_path: str, spec: dict[str, Any], rank: int) -> int:
    """One rank: its rank-map entry, its group, the learner's cells and the probe. Its result
    (``result-<rank>.pkl``) or its traceback (``failed-<rank>.txt``) lands beside the spec.
    Returns the exit code."""
    import datetime
    import importlib
    import traceback
    import types

    import torch
    import torch.distributed as dist

    from .. import checks
    from ..torch_dist import p2p
    from ..torch_dist.process_group import rendezvous_store

    folder = Path(spec_path).parent
    try:
        torch.set_num_threads(1)
        p2p.DESTROY_SCRATCH = False  # this process ends once every rank has its result
        info = spec["ranks"][rank]
        # a namespace of the rank's own, as an engine's %%px namespace is its __main__ (where
        # the probes look the learner's names up); the launcher's own module is left alone
        sys.modules["__main__"] = main = types.ModuleType("__main__")
        ns = vars(main)
        ns.update(_namespace(info, spec["imports"], spec["values"]))
        os.environ.update(RANK=str(info["rank"]), WORLD_SIZE=str(info["world_size"]),
                          LOCAL_RANK=str(info["local_rank"]), MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(spec["master_port"]))  # for a group the cells build
        if spec["group"]:
            wait = datetime.timedelta(seconds=spec["collective_timeout"])
            store = rendezvous_store(rank, info["world_size"], "127.0.0.1", spec["port"], wait)
            dist.init_process_group("gloo", store=store, rank=rank,
                                    world_size=info["world_size"], timeout=wait)  # loopback
        (folder / f"joined-{rank}").touch()
        for i, src in enumerate(spec["sources"]):
            name = f"<your cell {i + 1}>"
            # in linecache, so that a traceback (and learner_line) shows the line's text
            linecache.cache[name] = (len(src), None, src.splitlines(True), name)
            exec(compile(src, name, "exec"), ns)
        mod, _, func = spec["probe"].rpartition(":")
        probe = getattr(importlib.import_module(mod) if mod else checks, func)
        result = probe(**spec["kwargs"])
        out = folder / f"result-{rank}.pkl"
        tmp = out.with_suffix(".part")
        tmp.write_bytes(pickle.dumps(result))
        # the result first: a probe that found a send stuck leaves it pending, and the group's
        # destroy would wait that out (the collective timeout); the world is ended once every
        # rank has its result
        tmp.replace(out)
        wait_for_peers(folder, len(spec["ranks"]))
        if dist.is_initialized():
            dist.destroy_process_group()
    except BaseException:
        if not (folder / f"result-{rank}.pkl").exists():
            (folder / f"failed-{rank}.txt").write_text(traceback.format_exc())
            return 1
    return 0


def _namespace(info: dict[str, Any], imports: dict[str, str],
               values: dict[str, Any]) -> dict[str, Any]:
    """What an engine's ``%%px`` namespace holds for the learner's cells: the rank map's
    names, a CPU ``device``, and the modules, imported names and plain values the cells use
    (as rank 0 of the notebook's cluster had them)."""
    import importlib

    import torch

    ns: dict[str, Any] = dict(values)
    for alias, where in imports.items():
        mod, _, attr = where.partition(":")
        module = importlib.import_module(mod)
        ns[alias] = getattr(module, attr) if attr else module
    ns.update(rank=info["rank"], world_size=info["world_size"], local_rank=info["local_rank"],
              host=info["host"], device=torch.device("cpu"))
    return ns


if __name__ == "__main__":
    main(sys.argv[1])
