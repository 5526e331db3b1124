"""Engine-side probes behind the graded tests of ``01_collectives``.

They run the learner's ``%%px``-defined ring on every rank while spying on what it sends (and,
for the hidden tests, with every built-in collective switched off), then report plain data the
test cells assert on. Teaching helpers live in :mod:`course_utils.torch_dist.p2p`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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
    of each message really sent, a checksum of the result (equal on every rank when it is
    replicated) and, when the function failed, ``error`` (its text and the learner's line) or
    ``stuck`` (the call it waited in). Read the result with :func:`ring_problem`. Used by the
    exercise tests in ``01_collectives``.
    """
    import torch
    import torch.distributed as dist

    import __main__

    from ..torch_dist.p2p import P2PStuck, p2p_watchdog

    fn = vars(__main__).get(fn_name)
    if fn is None:
        raise NameError(f"{fn_name!r} is not defined on this engine: run the %%px cell first")
    rank, p = dist.get_rank(), dist.get_world_size()
    want = getattr(torch, dtype)

    def draw(r: int) -> Any:
        gen = torch.Generator().manual_seed(1000 * seed + r)
        return torch.randn(n, generator=gen, dtype=torch.float64).to(want)

    x = draw(rank)
    mine = x.clone()
    ref = sum((draw(r).double() for r in range(p)), torch.zeros(n, dtype=torch.float64))
    messages: list[int] = []
    out: dict[str, Any] = {"rank": rank, "n": n, "itemsize": x.element_size(), "error": None,
                           "error_line": "", "stuck": None, "bytes_sent": None}
    with p2p_watchdog(wait_s):
        saved = {name: getattr(dist, name) for name in ("send", "isend")}

        def spying(name: str) -> Callable[..., Any]:
            def spy(tensor: Any, *args: Any, **kwargs: Any) -> Any:
                messages.append(int(tensor.numel() * tensor.element_size()))
                return saved[name](tensor, *args, **kwargs)
            return spy

        for name in saved:
            setattr(dist, name, spying(name))
        try:
            out["bytes_sent"] = fn(mine)
        except P2PStuck as exc:
            out["stuck"] = exc.as_dict()
        except Exception as exc:
            out["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            out["error_line"] = learner_line(exc)
        finally:
            for name, f in saved.items():
                setattr(dist, name, f)
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
    from .feedback import feedback

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

_FORBIDDEN = ("all_reduce", "reduce_scatter", "reduce_scatter_tensor", "all_gather",
              "all_gather_into_tensor", "broadcast", "reduce", "all_to_all")


def engine_check_point_to_point_only(fn_name: str, n: int, seed: int = 0) -> dict[str, Any]:
    """Like :func:`engine_check_all_reduce`, but while the learner's function runs every
    built-in collective of ``torch.distributed`` raises, so only send/recv (blocking or
    not) can do the work. Used by the hidden tests of ``01_collectives``."""
    import torch.distributed as dist

    import __main__

    fn = vars(__main__).get(fn_name)
    if fn is None:
        raise NameError(f"{fn_name!r} is not defined on this engine: run the %%px cell first")

    saved = {name: getattr(dist, name) for name in _FORBIDDEN}

    def forbidden(*_a: Any, **_k: Any) -> None:
        raise RuntimeError("this exercise builds all-reduce from isend/irecv only")

    def guarded(t: Any) -> Any:
        for name in _FORBIDDEN:
            setattr(dist, name, forbidden)
        try:
            return fn(t)
        finally:
            for name, f in saved.items():
                setattr(dist, name, f)

    __main__.__dict__["_course_guarded"] = guarded
    try:
        return engine_check_all_reduce("_course_guarded", n, seed)
    finally:
        __main__.__dict__.pop("_course_guarded", None)
