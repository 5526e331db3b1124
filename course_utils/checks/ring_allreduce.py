"""Engine-side probes behind the graded tests of ``01_collectives``.

They run the learner's ``%%px``-defined ring on every rank while spying on what it sends (and,
for the hidden tests, with every built-in collective switched off), then report plain data the
test cells assert on. Teaching helpers live in :mod:`course_utils.torch_dist.p2p`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..cluster.engines.engine import px_name
from ..torch_dist.spies import replaced
from .common import learner_line


def engine_check_all_reduce(fn_name: str, n: int, seed: int = 0, dtype: str = "float32",
                            wait_s: float = 5.0) -> dict[str, Any]:
    """Run the ``%%px``-defined function ``fn_name(t)`` and compare with the true sum.

    Every rank draws its own random tensor of ``n`` items (seeded by ``seed`` and its rank) and
    runs the learner's function on it, recording the size of every message sent with
    ``dist.send``/``dist.isend`` meanwhile, under :func:`~course_utils.p2p.p2p_watchdog`
    (a send or receive that waits more than ``wait_s`` seconds stops with the call it was
    stuck in). The true sum is computed on each rank from every rank's known input, without a
    collective, so one rank's failure can never leave the others waiting here.

    Returns the max abs difference, the bytes the learner's function reported sending, the bytes
    of each message really sent and its ``routes`` (destination, first element in ``t``; -1 for
    a copy), this rank's ``local_rank``, a checksum of the result (equal on every rank when it is
    replicated) and, when the function failed, ``error`` (its text and the learner's line) or
    ``stuck`` (the call it waited in). Read the result with :func:`ring_problem`. Used by the
    exercise tests in ``01_collectives``.
    """
    import torch
    import torch.distributed as dist

    import __main__

    from ..torch_dist.p2p import P2PStuck, p2p_watchdog

    fn = px_name(fn_name, to_call=True)
    rank, p = dist.get_rank(), dist.get_world_size()
    want = getattr(torch, dtype)

    def draw(r: int) -> Any:
        gen = torch.Generator().manual_seed(1000 * seed + r)
        return torch.randn(n, generator=gen, dtype=torch.float64).to(want)

    x = draw(rank)
    mine = x.clone()
    ref = sum((draw(r).double() for r in range(p)), torch.zeros(n, dtype=torch.float64))
    messages: list[int] = []
    routes: list[tuple[int, int]] = []   # (destination, first element in t or -1) per send
    base = mine.view(-1)
    out: dict[str, Any] = {"rank": rank, "n": n, "itemsize": x.element_size(), "error": None,
                           "local_rank": getattr(__main__, "local_rank", rank), "routes": routes,
                           "error_line": "", "stuck": None, "bytes_sent": None}
    with p2p_watchdog(wait_s) as watch:
        def spying(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
            def spy(tensor: Any, *args: Any, **kwargs: Any) -> Any:
                messages.append(int(tensor.numel() * tensor.element_size()))
                dst = args[0] if args else kwargs.get("dst", -1)
                same = n and tensor.untyped_storage().data_ptr() == \
                    base.untyped_storage().data_ptr()
                at = (tensor.data_ptr() - base.data_ptr()) // base.element_size() if same else -1
                routes.append((int(dst if dst is not None else -1), int(at)))
                return real(tensor, *args, **kwargs)
            return spy

        try:
            with replaced(spying, ("send", "isend")):
                out["bytes_sent"] = fn(mine)
        except P2PStuck as exc:
            out["stuck"] = exc.as_dict()
        except Exception as exc:
            watch.clean = False  # its requests were left by the error, not forgotten
            out["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            out["error_line"] = learner_line(exc)
    diff = (mine.double() - ref).abs()
    out.update(
        max_abs_diff=float(diff.max()) if n else 0.0,
        worst_index=int(diff.argmax()) if n else -1,
        tol=1e-5 * max(1.0, float(ref.abs().max())) if n else 0.0,
        messages=messages,
        checksum=float(mine.double().sum()) if n else 0.0,
    )
    return out


def ring_problem(results: list[dict[str, Any]], fn_name: str = "ring_all_reduce"
                 ) -> str | None:
    """What went wrong in one :func:`engine_check_all_reduce` run (one dict per rank), as a
    checked/expected/found/try message; ``None`` when the result is right. Kernel side, pure.
    """
    from .feedback_format import feedback

    n, p = results[0]["n"], len(results)
    checked = f"{fn_name}(t) on every rank, t of {n} random numbers ({p} ranks)"
    shape_hint = ""
    if n < p:
        shape_hint = (f" With n={n} < p={p} some chunks are empty (chunk_bounds gives (k, k)):"
                      " a rank may have nothing to send or receive at a step; skip empty chunks"
                      " on BOTH sides, or send them, but the two sides must agree.")
    elif n % p:
        shape_hint = (f" n={n} does not divide by p={p}: chunks differ in size by one; take every"
                      " chunk's bounds from chunk_bounds(n, p), never n // p.")
    restart = (" (The check ran your messages on a throwaway group, so the course's process "
               "group is unharmed. Run outside the check, the same code blocks for the group's "
               "whole timeout and leaves its messages queued in the group: then run "
               "cluster = cu.restart() and re-run the cells from Setup.)")
    errors = [r for r in results if r.get("error")]
    stuck = [r for r in results if r.get("stuck")]
    waiting = "; ".join(
        f"rank {r['rank']} in dist.{r['stuck']['call']} "
        f"{'to' if 'send' in r['stuck']['call'] else 'from'} rank {r['stuck']['peer']}"
        for r in stuck)
    if errors:
        first = errors[0]
        found = f"rank {first['rank']} raised {first['error']}"
        if first.get("error_line"):
            found += f" ({first['error_line']})"
        if len(errors) > 1:
            found += f"; ranks {[r['rank'] for r in errors]} raised errors"
        fix = "read the error and the line above." + shape_hint
        if "pair closure" in first["error"] or "connection closed" in first["error"].lower():
            fix = ("the process group lost a connection after an earlier timeout (a stuck "
                   "send/recv or collective): it must be rebuilt. Run cluster = cu.restart(), "
                   "re-run the cells from Setup, then this test.")
        elif "isend/irecv only" in first["error"]:
            fix = ("build the sum from dist.isend/dist.irecv only: no dist.all_reduce, "
                   "reduce_scatter, all_gather, broadcast or reduce inside your function.")
        if stuck:
            found += f"; meanwhile ranks were left waiting ({waiting})"
            fix += restart
        return feedback(checked, "the sum over ranks, on every rank, without errors", found, fix)
    if stuck:
        all_send = all("send" in r["stuck"]["call"] for r in stuck) and len(stuck) == p
        if all_send:
            found = (f"a send/recv deadlock: every rank is stuck in a send ({waiting}), none "
                     f"reached its recv, after {stuck[0]['stuck']['seconds']:g} s")
            fix = ("on gloo a send completes only when the receiver has posted the matching "
                   "recv, at any message size, so a ring where every rank sends first and "
                   "receives second never moves: post both sides with dist.isend and "
                   "dist.irecv, then wait() on both (or let even ranks send first and odd "
                   "ranks receive first)." + restart)
        else:
            found = (f"ranks waiting for a message that never came ({waiting}) after "
                     f"{stuck[0]['stuck']['seconds']:g} s")
            fix = ("every send needs a matching recv on the peer, at the same step: check "
                   "the peers (right = (rank + 1) % world_size, left = (rank - 1) % "
                   "world_size) and that every rank runs the same number of steps."
                   + shape_hint + restart)
        return feedback(checked, "every send and recv completes within seconds", found, fix)
    bad = [r for r in results if r["max_abs_diff"] > r["tol"]]
    if bad:
        r = bad[0]
        return feedback(
            checked, "the same numbers as the true sum over ranks (within float rounding)",
            f"rank {r['rank']} differs by {r['max_abs_diff']:.3g} (worst at element "
            f"{r['worst_index']} of {n})",
            "in reduce-scatter ADD the received chunk into yours (a scratch buffer, then +=), "
            "in all-gather OVERWRITE yours; work in place on t.view(-1)." + shape_hint)
    if len({round(r["checksum"], 3) for r in results}) != 1:
        return feedback(checked, "the same result on every rank",
                        f"checksums per rank {[round(r['checksum'], 3) for r in results]}",
                        "after all-gather every rank must hold every finished chunk.")
    return None

_FORBIDDEN = ("all_reduce", "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single",
              "all_gather", "all_gather_into_tensor", "all_gather_single", "broadcast",
              "reduce", "all_to_all", "all_to_all_single")


def engine_check_point_to_point_only(fn_name: str, n: int, seed: int = 0) -> dict[str, Any]:
    """Like :func:`engine_check_all_reduce`, but while the learner's function runs every
    built-in collective of ``torch.distributed`` raises, so only send/recv (blocking or
    not) can do the work. Used by the hidden tests of ``01_collectives``."""
    import __main__

    fn = px_name(fn_name, to_call=True)

    def forbidden(*_a: Any, **_k: Any) -> None:
        raise RuntimeError("this exercise builds all-reduce from isend/irecv only")

    def guarded(t: Any) -> Any:
        with replaced(lambda _name, _real: forbidden, _FORBIDDEN):
            return fn(t)

    __main__.__dict__["_course_guarded"] = guarded
    try:
        return engine_check_all_reduce("_course_guarded", n, seed)
    finally:
        __main__.__dict__.pop("_course_guarded", None)


def ring_bytes_problem(results: list[dict[str, Any]], fn_name: str = "ring_all_reduce"
                       ) -> str | None:
    """Whether the bytes of one :func:`engine_check_all_reduce` run are a chunked ring's: an
    int per rank, ``2(p-1)`` buffers summed over ranks, each rank's share, the count equal to
    what ``dist.isend`` really sent, no message over one chunk. ``None`` when right. Pure."""
    from ..torch_dist.p2p import ring_bytes
    from .feedback_format import feedback

    n, p, size = results[0]["n"], len(results), results[0]["itemsize"]
    want = ring_bytes(n, p, size)
    sent = [x["bytes_sent"] for x in results]
    what = f"the bytes {fn_name} returned for n={n} on {p} ranks"
    if not all(isinstance(b, int) for b in sent):
        return feedback(what, "an int per rank", f"{sent}",
                        "count elements * t.element_size() as a Python int")
    if sum(sent) != want["total"]:
        return feedback(what + ", summed over ranks",
                        f"{want['total']} = 2(p-1) buffers of {n * size} bytes",
                        f"{sum(sent)} (per rank {sent})",
                        "each of the 2(p-1) steps sends one chunk: count every chunk you send, "
                        "once")
    if not all(want["min"] <= b <= want["max"] for b in sent):
        return feedback(what + ", per rank", f"between {want['min']} and {want['max']}",
                        f"{sent}", "every rank sends one chunk per step, 2(p-1) steps")
    really = [sum(x["messages"]) for x in results]
    if really != sent:
        return feedback("your byte count against the messages dist.isend really sent",
                        f"{really}", f"{sent}",
                        "add each sent chunk's numel() * element_size(), and send with "
                        "dist.isend")
    chunk = -(-n // p) * size
    biggest = max(max(x["messages"], default=0) for x in results)
    if biggest > chunk:
        return feedback(f"the largest single message for n={n} on {p} ranks",
                        f"at most one chunk: {chunk} bytes", f"a message of {biggest} bytes",
                        "send one chunk per step (chunk_bounds), not the whole buffer: each "
                        "step may move one chunk")
    return None


#: Why a ring can pass on 2 ranks and fail on more (starts every failure on more ranks).
MORE_RANKS_NOTE = (" With 2 ranks each phase has one step, and left and right are the same rank,"
                   " so a ring can pass there and be wrong here.")


def ring_schedule_chunks(r: int, p: int) -> list[int]:
    """The chunk index rank ``r`` sends at each of the ``2(p-1)`` steps of the ring (pure):
    ``(r - s) % p`` in reduce-scatter, then ``(r + 1 - s) % p`` in all-gather."""
    return [(r - s) % p for s in range(p - 1)] + [(r + 1 - s) % p for s in range(p - 1)]


def ring_route_hint(results: list[dict[str, Any]]) -> str:
    """What the messages of one :func:`engine_check_all_reduce` run say about the ring's route
    (pure): sent to the left, to ``local_rank``'s neighbour, or chunks that do not move with
    the step. ``""`` when the route is the ring's (or it cannot tell: copies, empty chunks)."""
    from ..torch_dist.p2p import chunk_bounds

    p, n = len(results), results[0]["n"]
    dsts = {r["rank"]: [d for d, _ in r.get("routes", [])] for r in results}
    # with 2 ranks left and right are the same rank: the destinations say nothing
    if p > 2 and all(set(d) == {(k - 1) % p} for k, d in dsts.items() if d) and any(
            dsts.values()):
        return (" Every rank sent to its LEFT neighbour (rank - 1) % world_size: send to the "
                "right, (rank + 1) % world_size, and receive from the left.")
    local = {r["rank"]: r.get("local_rank", r["rank"]) for r in results}
    off = [k for k, d in dsts.items() if d and set(d) != {(k + 1) % p}]
    if p > 2 and off and any(local[k] != k for k in off) and all(
            set(dsts[k]) <= {(local[k] + 1) % p, (local[k] - 1) % p} for k in off):
        k = off[0]
        return (f" Rank {k} (local rank {local[k]} on its host) sent to rank {dsts[k][0]}: the "
                "ring's neighbours come from local_rank. Use rank, the global rank: right = "
                "(rank + 1) % world_size; local_rank only numbers the ranks on one host (it "
                "picks the GPU).")
    starts = [a for a, b in chunk_bounds(n, p)]
    if n < p or off:
        return ""
    for res in results:
        r, sent = res["rank"], [at for _, at in res.get("routes", [])]
        if -1 in sent or len(sent) != 2 * (p - 1) or any(at not in starts for at in sent):
            continue
        got, want = [starts.index(at) for at in sent], ring_schedule_chunks(r, p)
        if got != want:
            return (f" Rank {r} sent chunks {got} at steps 0..{2 * p - 3}; the ring sends "
                    f"{want}. The chunk must move with the step: at step s rank r sends chunk "
                    "(r - s) % p and receives (r - s - 1) % p in reduce-scatter, sends "
                    "(r + 1 - s) % p and receives (r - s) % p in all-gather.")
    return ""


def ring_on_more_ranks(fn_name: str = "ring_all_reduce", ranks: tuple[int, ...] = (4, 3),
                       sizes: tuple[Any, ...] = (12, 13, 7, 1, 1001), bytes_sizes: tuple[int, ...]
                       = (), dtype: str = "float32", point_to_point_only: bool = False,
                       cluster: Any = None, timeout: float = 90.0) -> str | None:
    """Kernel side. Run the learner's ``%%px`` ring on ranks of its own, ``ranks`` of them in
    turn (default 4 on two simulated hosts of 2, then 3), for every size in ``sizes`` (an
    ``n``, or ``(n, dtype)``; else ``dtype``) and the byte checks for ``bytes_sizes``, through
    :func:`~course_utils.checks.spawn.spawn`. Returns the first problem (with
    :data:`MORE_RANKS_NOTE` past 2 ranks, and :func:`ring_route_hint`), or ``None``. The
    course's cluster and process group are not used for the messages: a ring whose two sides
    disagree on a chunk's size makes gloo abort the receiving process, which here is the
    check's own. Introduced in ``01_collectives``."""
    from .spawn import RankFailed, spawn

    probe = "engine_check_point_to_point_only" if point_to_point_only else \
        "engine_check_all_reduce"
    pairs = [(s, dtype) if isinstance(s, int) else tuple(s) for s in sizes]
    calls = [(probe, [fn_name, n, 20 + k] + ([] if point_to_point_only else [dt]))
             for k, (n, dt) in enumerate(pairs)]
    calls += [("engine_check_all_reduce", [fn_name, n]) for n in bytes_sizes]
    for p in ranks:
        note = MORE_RANKS_NOTE if p > 2 else ""
        try:
            done = spawn(f"{__name__}:engine_ring_calls", p, cells=[fn_name], cluster=cluster,
                         hosts=(p // 2, p - p // 2) if p >= 4 else (p,), timeout=timeout,
                         collective_timeout=20, calls=calls)
        except RankFailed as exc:
            return ring_crash_problem(fn_name, exc.rank, exc.said, note) if exc.signal_name \
                else feedback_side(fn_name, p, [exc.said], note)
        for k in range(len(calls)):
            res = [per_rank[k] if k < len(per_rank) else {"side_error": "stopped: a peer "
                   "failed an earlier size"} for per_rank in done]
            failed = [r["side_error"] for r in res if isinstance(r, dict) and "side_error" in r]
            if failed:
                return feedback_side(fn_name, len(res), failed, note)
            problem = ring_problem(res, fn_name) if k < len(pairs) else \
                ring_bytes_problem(res, fn_name)
            if problem is not None:
                return problem + note + ring_route_hint(res)
    return None


def try_ring(fn_name: str = "ring_all_reduce", n: int = 7, ranks: int | None = None,
             timeout: float = 30.0) -> list[str]:
    """Kernel side. The learner's ``%%px`` ring on ``ranks`` ranks of its own (default: as many
    as the cluster has), rank ``r`` holding ``r + 1`` in each of ``n`` elements; prints (and
    returns) what each rank holds afterwards and the bytes it said it sent, or the problem.
    A ring whose sides disagree on a chunk's size makes gloo abort the receiving process, so
    a first try runs where that process is not one of the learner's engines. Introduced in
    ``01_collectives`` (exercise 1)."""
    from ..cluster import current
    from .spawn import RankFailed, spawn

    p = ranks or current().world_size
    try:
        done = spawn(f"{__name__}:engine_try_ring", p, cells=[fn_name], timeout=timeout,
                     collective_timeout=min(timeout, 20), fn_name=fn_name, n=n)
    except RankFailed as exc:
        lines = [ring_crash_problem(fn_name, exc.rank, exc.said, "") if exc.signal_name
                 else feedback_side(fn_name, p, [exc.said], "")]
    else:
        lines = [f"rank {r}: {res['x']}  ({res['sent']} bytes sent)" if "error" not in res
                 else f"rank {r}: {res['error']}" for r, res in enumerate(done)]
    print("\n".join(lines))
    return lines


def engine_try_ring(fn_name: str, n: int, wait_s: float = 5.0) -> dict[str, Any]:
    """On a rank of :func:`try_ring`'s world: the learner's ring on ``r + 1`` everywhere,
    under the watchdog."""
    import torch
    import torch.distributed as dist

    from ..torch_dist.p2p import P2PStuck, p2p_watchdog

    x = torch.full((n,), dist.get_rank() + 1.0)
    try:
        with p2p_watchdog(seconds=wait_s):
            sent = px_name(fn_name, to_call=True)(x)
    except NotImplementedError:
        return {"error": f"{fn_name} is not written yet"}
    except P2PStuck as exc:
        return {"error": f"stuck: {exc}"}
    except Exception as exc:  # noqa: BLE001  # the learner's error, said on their rank's line
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    return {"x": x.tolist(), "sent": sent}


def engine_ring_calls(calls: list[tuple[str, list[Any]]]) -> list[Any]:
    """*Collective*, on a rank of :func:`ring_on_more_ranks`'s world: each probe of this module
    in turn; a probe's error is said (``{"side_error": ...}``), not raised, and ends the run
    (the group is not fit for the next size: each would wait out its timeout), as does a result
    that got stuck or raised. The ranks stop together: one that went on alone would wait for
    the others in the next probe's group until its timeout."""
    out: list[Any] = []
    for name, args in calls:
        try:
            out.append(globals()[name](*args))
            # reported first anyway; a deadlock would cost its 5 s again per size
            stop = isinstance(out[-1], dict) and bool(out[-1].get("stuck") or out[-1].get("error"))
        except Exception as exc:
            out.append({"side_error": f"{type(exc).__name__}: {str(exc)[:300]}"})
            stop = True
        if _any_rank(stop):
            break
    return out


def _any_rank(flag: bool) -> bool:
    """*Collective*: True on every rank when ``flag`` is True on any (on the world's own group;
    the learner's messages went over the watchdog's). A group that no longer answers: True."""
    import torch
    import torch.distributed as dist

    vote = torch.tensor([int(flag)])
    try:
        dist.all_reduce(vote, op=dist.ReduceOp.MAX)
    except Exception:  # noqa: BLE001 - a broken group ends the run as a stop would
        return True
    return bool(vote.item())


def ring_crash_problem(fn_name: str, rank: int, said: str, note: str = MORE_RANKS_NOTE) -> str:
    """The message for a rank of the check's own that gloo aborted (pure)."""
    from .feedback_format import feedback

    return feedback(
        f"{fn_name} on the check's own ranks", "every chunk received into a buffer of its size "
        "and dtype", f"gloo aborted rank {rank}: {said}",
        "a rank received a different chunk than its neighbour sent at that step: sender and "
        "receiver must agree at every step, on the chunk and on the dtype." + note + " Send to "
        "the right, (rank + 1) % world_size, and receive from the left; use rank, not "
        "local_rank; the chunk must move with the step: at step s send (r - s) % p and receive "
        "(r - s - 1) % p in reduce-scatter, send (r + 1 - s) % p and receive (r - s) % p in "
        "all-gather; receive into buffers of t's dtype.")


def feedback_side(fn_name: str, p: int, failed: list[str], note: str = MORE_RANKS_NOTE) -> str:
    """The message for a probe that raised on the check's own ranks."""
    from .feedback_format import feedback

    return feedback(f"{fn_name} on the check's own {p} ranks", "no error", failed[0],
                    "read the error: it is your function's, raised on these ranks." + note)
