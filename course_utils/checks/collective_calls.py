"""Which collectives a learner's ``%%px`` function really calls (unit 0's first collective):
the function runs with ``torch.distributed``'s collectives counted, so an answer computed in
plain Python, or with ``reduce`` where ``all_reduce`` belongs, is told apart from the real one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..cluster.engines.engine import px_name
from ..torch_dist.spies import replaced

COUNTED = ("all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor",
           "all_gather_single", "gather", "scatter", "reduce_scatter", "reduce_scatter_tensor",
           "reduce_scatter_single", "send", "recv", "isend", "irecv")


def engine_check_collectives(fn_name: str, *args: Any) -> dict[str, Any]:
    """*Collective* (as collective as the learner's function). Call ``fn_name(*args)`` with
    every collective of :data:`COUNTED` counted; the originals are back afterwards.

    Returns ``{"result": ..., "calls": {"all_reduce": 1, ...}}`` (only names called)."""
    fn = px_name(fn_name)
    calls: dict[str, int] = {}

    def counting(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*a: Any, **k: Any) -> Any:
            calls[name] = calls.get(name, 0) + 1
            return real(*a, **k)
        return counted

    with replaced(counting, COUNTED):
        result = fn(*args)
    return {"result": result, "calls": calls}


def engine_said_collectives(fn_name: str) -> dict[str, Any]:
    """:func:`engine_check_collectives`, its error said rather than raised (for ranks of their
    own, whose every result the check reads)."""
    try:
        return engine_check_collectives(fn_name)
    except Exception as exc:
        return {"side_error": f"{type(exc).__name__}: {str(exc)[:300]}"}


#: Two simulated hosts of two ranks each: local rank and rank differ on ranks 2 and 3.
TWO_HOSTS = (2, 2)


def local_rank_problem(claimed: list[Any], ranks: list[dict[str, Any]], what: str) -> str | None:
    """Whether ``claimed`` (one value per rank) is every rank's local rank where its rank
    belongs (pure). ``ranks`` is the rank map as dicts."""
    from .feedback_format import feedback

    local = [r["local_rank"] for r in ranks]
    if list(claimed) != local or local == [r["rank"] for r in ranks]:
        return None
    return feedback(what + f" on {len(ranks)} ranks of two simulated hosts",
                    f"the ranks {[r['rank'] for r in ranks]}", f"the local ranks {local}",
                    "use rank, not local_rank: rank numbers every process of the job, "
                    "local_rank only the processes on one host (it picks the GPU). On one "
                    "host the two are equal, which is why 2 engines could not tell.")


def engine_join_and_leave(timeout_s: float) -> dict[str, Any]:
    """*Collective*, on a rank of :func:`join_on_two_hosts`'s world: the learner's
    ``join_group`` watched (given the world's ``MASTER_ADDR`` and ``MASTER_PORT``), every
    rank's ``dist.get_rank()`` over the group it built, then ``leave_group`` and whether a
    group is left. Each step's error is said, not raised."""
    import os

    from ..cluster.engines.engine import call_named
    from ..torch_dist import join_watch as jw

    master_addr, master_port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])

    steps = {"joined": lambda: jw.engine_join("join_group", master_addr, master_port,
                                              timeout_s),
             "seen": jw.engine_gather_ranks,
             "left": lambda: call_named("leave_group", (), {}),
             "alive": jw.engine_has_group}
    out: dict[str, Any] = {"master": (master_addr, master_port)}
    for key, step in steps.items():
        try:
            out[key] = step()
        except Exception as exc:
            out[key] = {"side_error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    return out


def join_on_two_hosts(cluster: Any = None, timeout_s: float = 5.0) -> str | None:
    """Kernel side. The learner's ``join_group``/``leave_group`` on 4 ranks of their own
    (:data:`TWO_HOSTS`, through :func:`~course_utils.checks.spawn.spawn`, no group made for
    them): the claims, the group in use, and no group after ``leave_group``. The first
    problem, or ``None``. Introduced in ``00_cluster_tour``'s Exercise 1 test."""
    from ..torch_dist.join_watch import explain_join
    from .feedback_format import feedback
    from .spawn import RankFailed, simulated_rank_map, spawn

    try:
        done = spawn(f"{__name__}:engine_join_and_leave", 4, cells=["join_group", "leave_group"],
                     cluster=cluster, hosts=TWO_HOSTS, group=False, timeout=90,
                     timeout_s=timeout_s)
    except RankFailed as exc:
        return feedback("join_group on 4 ranks of their own", "no crash", exc.said,
                        "read the error above")
    ranks = simulated_rank_map(TWO_HOSTS)
    joined = [d["joined"] for d in done]
    claimed = [o["claims"][-1]["rank"] if o.get("claims") else None for o in joined]
    problem = local_rank_problem(claimed, ranks, "the rank each join_group claimed") \
        or explain_join(joined, *done[0]["master"], timeout_s=timeout_s)
    if problem:
        return problem
    p, seen, alive = len(ranks), [d["seen"] for d in done], [d["alive"] for d in done]
    if seen != [list(range(p))] * p:
        return feedback(f"an all_gather of dist.get_rank() on {p} ranks of their own",
                        f"{list(range(p))} on every rank", f"{seen}",
                        "build the group with rank=rank and world_size=world_size")
    if any(a is not False for a in alive):
        return feedback(f"whether a group exists after leave_group() on {p} ranks", "no group",
                        f"{alive}", "call dist.destroy_process_group() in leave_group")
    return None


def sum_on_two_hosts(fn_name: str = "sum_of_squares", cluster: Any = None) -> str | None:
    """Kernel side. The learner's ``sum_of_squares`` on 4 ranks of their own
    (:data:`TWO_HOSTS`): one ``all_reduce`` and the sum of ``(rank + 1)**2`` on every rank.
    The first problem, or ``None``. Used by ``00_cluster_tour``'s Exercise 2 test."""
    from .feedback_format import feedback
    from .spawn import RankFailed, simulated_rank_map, spawn

    ranks = simulated_rank_map(TWO_HOSTS)
    try:
        runs = spawn(f"{__name__}:engine_said_collectives", 4, cells=[fn_name],
                     cluster=cluster, hosts=TWO_HOSTS, timeout=90, fn_name=fn_name)
    except RankFailed as exc:
        return feedback(f"{fn_name}() on 4 ranks of their own", "no crash", exc.said,
                        "read the error above")
    failed = [r["side_error"] for r in runs if "side_error" in r]
    if failed:
        return feedback(f"{fn_name}() on {len(ranks)} ranks of their own", "no error", failed[0],
                        "read the error: your function raised it")
    got = [x["result"] for x in runs]
    want = float(sum((r["rank"] + 1) ** 2 for r in ranks))
    if got == [want] * len(ranks):
        return None
    wrong_local = float(sum((r["local_rank"] + 1) ** 2 for r in ranks))
    found = f"{got}" + (" = the sum over local ranks" if got == [wrong_local] * len(ranks)
                        else "")
    fix = "use rank, not local_rank: rank numbers every process of the job, local_rank only " \
          "those on one host" if got == [wrong_local] * len(ranks) else \
          "each rank puts (rank + 1)**2 into a tensor, all_reduce (SUM), return float(t.item())"
    return feedback(f"{fn_name}() on {len(ranks)} ranks on two simulated hosts of 2",
                    f"{want} on every rank", found, fix)
