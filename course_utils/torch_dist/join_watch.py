"""Watching a process group being wired by hand: what every rank claimed, what torch said.

Introduced in ``00_cluster_tour``, where the learner writes the ``dist.init_process_group`` call
that ``cu.start_torch()`` makes later, and where the original program's call (``rank=0`` on every
host) is run for real and explained. :func:`engine_join` runs on every engine (torch imported
there); :func:`explain_join` is a pure function of what the engines returned.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..cluster.engines.engine import px_name


def engine_join(fn_name: str, *args: Any, cap_s: float = 20.0) -> dict[str, Any]:
    """*Collective.* Call the ``%%px`` function ``fn_name(*args)`` and record every
    ``dist.init_process_group`` call it makes: the rank, world size, backend, init method and
    timeout it asked for. The real call is made, so a mistake fails the way torch fails; only a
    missing or longer timeout is capped at ``cap_s`` seconds (and reported), so a wrong claim
    cannot hang the notebook for torch's 30-minute default.

    Returns this engine's rank-map ``rank``, the ``claims`` (one dict per init call), the
    ``error`` it raised (type and first line), the ``seconds`` it took, what the function
    returned, and ``group``: the default process group's rank, world size, backend and init
    method afterwards (``None`` when there is none). A group that already existed is destroyed
    first, so the function builds its own.
    """
    import datetime
    import time

    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    import __main__

    from ..cluster.engines import engine

    fn = px_name(fn_name, to_call=True)
    if dist.is_initialized():
        dist.destroy_process_group()
    claims: list[dict[str, Any]] = []
    real = dist.init_process_group

    def watched(backend: Any = None, init_method: Any = None, timeout: Any = None,
                world_size: int = -1, rank: int = -1, *rest: Any, **kwargs: Any) -> Any:
        given = None if timeout is None else float(timeout.total_seconds())
        claims.append({"rank": rank, "world_size": world_size, "backend": str(backend),
                       "init_method": str(init_method), "timeout_s": given})
        if given is None or given > cap_s:
            timeout = datetime.timedelta(seconds=cap_s)
        return real(backend, init_method, timeout, world_size, rank, *rest, **kwargs)

    dist.init_process_group = watched
    t0 = time.perf_counter()
    error, returned = None, None
    try:
        returned = fn(*args)
    except Exception as exc:
        text = str(exc).strip().splitlines()
        error = f"{type(exc).__name__}: {text[0] if text else ''}"
    finally:
        dist.init_process_group = real
    seconds = time.perf_counter() - t0
    group = None
    if dist.is_initialized():
        group = {"rank": dist.get_rank(), "world_size": dist.get_world_size(),
                 "backend": str(dist.get_backend()),
                 "init_method": str(getattr(c10d, "_default_pg_init_method", ""))}
    try:
        returned = returned if returned is None else float(returned)
    except (TypeError, ValueError):
        returned = repr(returned)
    return {"rank": engine.state().get("rank", getattr(__main__, "rank", None)),
            "claims": claims, "error": error, "seconds": seconds, "returned": returned,
            "group": group}


def engine_gather_ranks(wait_s: float = 10.0) -> list[int]:
    """*Collective.* Every rank's ``dist.get_rank()``, gathered over the default process group
    (so it runs on whatever group is in use), waiting at most ``wait_s`` seconds."""
    import datetime

    import torch
    import torch.distributed as dist

    mine = torch.tensor([dist.get_rank()])
    out = [torch.zeros(1, dtype=mine.dtype) for _ in range(dist.get_world_size())]
    dist.all_gather(out, mine, async_op=True).wait(timeout=datetime.timedelta(seconds=wait_s))
    return [int(t.item()) for t in out]


def engine_has_group() -> bool:
    """Whether this engine has a default process group right now."""
    import sys

    if "torch.distributed" not in sys.modules:
        return False
    import torch.distributed as dist

    return bool(dist.is_initialized())


def explain_join(outcomes: list[dict[str, Any]], master_addr: str, master_port: int,
                 timeout_s: float | None = None, fn_name: str = "join_group") -> str | None:
    """What went wrong when every rank ran ``fn_name`` under :func:`engine_join`, as a
    checked/expected/found/try message, or ``None`` when the group is the one asked for.

    ``outcomes`` is one dict per rank (rank-map order). Expected: one ``init_process_group``
    call per rank claiming its rank-map rank and the full world size, with
    ``tcp://master_addr:master_port``, the given timeout, no error, and a live group with those
    facts afterwards. Two ranks claiming the same rank is named first ("two ranks claimed rank
    0"), with torch's own errors, because that is what the original program did.
    """
    p = len(outcomes)
    url = f"tcp://{master_addr}:{master_port}"
    checked = f"{fn_name}(...) on all {p} ranks, then the default process group on each"
    said = "; ".join(f"rank {o['rank']}: {o['error']}" for o in outcomes if o.get("error"))
    torch_said = f" What torch said: {said}." if said else ""
    return (_claims_problem(outcomes, checked, torch_said)
            or _call_problem(outcomes, checked, torch_said, url, timeout_s)
            or _group_problem(outcomes, checked, said, url))


def _claims_problem(outcomes: list[dict[str, Any]], checked: str, torch_said: str) -> str | None:
    """Whether every rank called ``init_process_group`` once, claiming its own rank."""
    from ..checks.feedback_format import feedback

    p = len(outcomes)
    missing = [o["rank"] for o in outcomes if not o["claims"]]
    if missing:
        return feedback(checked, "one dist.init_process_group(...) call on every rank",
                        f"ranks {missing} never called dist.init_process_group" + torch_said,
                        "call dist.init_process_group(...) inside the function (as "
                        "dist.init_process_group, so the check sees it).")
    claimed = [o["claims"][-1]["rank"] for o in outcomes]
    counts = Counter(claimed)
    dup = sorted(r for r, k in counts.items() if k > 1)
    if dup:
        r = dup[0]
        nobody = sorted(set(range(p)) - set(claimed))
        who = {2: "two", 3: "three", 4: "four"}.get(counts[r], str(counts[r]))
        found = (f"{who} ranks claimed rank {r} (claims in rank-map order: {claimed})"
                 + (f"; nobody claimed rank {nobody[0]}" if nobody else "") + "." + torch_said
                 + f" With the same rank everywhere every process thinks it is rank {r}: "
                 "each tries to start the rendezvous store on the master port (one gets "
                 "'address already in use' at once when they share a host), and the other "
                 "waits for the missing rank until its timeout. On two hosts both wait.")
        return feedback(checked, f"each rank claims its own rank: {list(range(p))}", found,
                        "pass rank=rank (this engine's rank from the rank map), never a "
                        "constant; world_size=world_size.")
    wrong = [(o["rank"], c) for o in outcomes for c in [o["claims"][-1]] if c["rank"] != o["rank"]]
    if wrong:
        return feedback(checked, "rank-map rank r claims rank r",
                        f"the engine with rank-map rank {wrong[0][0]} claimed rank "
                        f"{wrong[0][1]['rank']}" + torch_said,
                        "pass rank=rank: the rank map already numbered the engines.")
    return None


def _call_problem(outcomes: list[dict[str, Any]], checked: str, torch_said: str, url: str,
                  timeout_s: float | None) -> str | None:
    """Whether every rank's call asked for the full world size, gloo, the master's URL and the
    timeout it was handed."""
    from ..checks.feedback_format import feedback

    p = len(outcomes)
    sizes = sorted({o["claims"][-1]["world_size"] for o in outcomes})
    if sizes != [p]:
        return feedback(checked, f"world_size={p} on every rank", f"world sizes {sizes}"
                        + torch_said, "pass world_size=world_size (every rank the same).")
    backends = sorted({o["claims"][-1]["backend"] for o in outcomes})
    if backends != ["gloo"]:
        # Without one, torch builds a group per device type (gloo for CPU tensors, NCCL for CUDA
        # tensors where NCCL is built): not the group the exercise asks for.
        return feedback(checked, "backend=\"gloo\" on every rank", f"backends {backends} "
                        "(None = not given: torch then picks one per device type)" + torch_said,
                        "pass backend=\"gloo\": the CPU tensors of this unit travel over gloo.")
    methods = sorted({o["claims"][-1]["init_method"] for o in outcomes})
    if methods != [url]:
        return feedback(checked, f"init_method={url!r} (the master address and the port "
                        "you were handed)", f"init_method {methods}" + torch_said,
                        "build it as f\"tcp://{master_addr}:{master_port}\" from the "
                        "function's arguments.")
    if timeout_s is not None:
        given = sorted({o["claims"][-1]["timeout_s"] for o in outcomes}, key=str)
        if given != [float(timeout_s)]:
            return feedback(checked, f"timeout=datetime.timedelta(seconds={timeout_s:g}) (the "
                            "timeout_s argument)", f"timeouts {given} (None = not given; "
                            "torch would then wait 30 minutes for a missing rank)" + torch_said,
                            "pass timeout=datetime.timedelta(seconds=timeout_s).")
    return None


def _group_problem(outcomes: list[dict[str, Any]], checked: str, said: str, url: str
                   ) -> str | None:
    """Whether the calls raised nothing and left the group asked for, one that sums."""
    from ..checks.feedback_format import feedback

    p = len(outcomes)
    if said:
        return feedback(checked, "no error", said, "read torch's message above.")
    groups = [o["group"] for o in outcomes]
    if any(g is None for g in groups):
        return feedback(checked, "a live process group after the call",
                        f"no group on ranks {[o['rank'] for o in outcomes if not o['group']]}",
                        "do not destroy the group inside join_group; leave_group does that.")
    bad = [(o["rank"], g) for o, g in zip(outcomes, groups, strict=True)
           if (g["rank"], g["world_size"], g["init_method"]) != (o["rank"], p, url)]
    if bad:
        return feedback(checked, f"the group in use has rank r of {p}, built at {url}",
                        f"rank {bad[0][0]}'s group: {bad[0][1]}",
                        "build the default group with init_process_group (no other group).")
    returned = [o["returned"] for o in outcomes]
    if returned != [float(p)] * p:
        return feedback(checked, f"each rank returns the all_reduce of a tensor of ones: {p}.0",
                        f"returned {returned}",
                        "check the group: t = torch.ones(1); dist.all_reduce(t); "
                        "return t.item().")
    return None
