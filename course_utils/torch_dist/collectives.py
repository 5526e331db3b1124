"""Collectives support: ring chunking, byte accounting, algbw/busbw and collective timing.

Introduced in ``01_collectives``. The pure functions (``chunk_bounds``, ``ring_bytes``,
``algbw``, ``busbw``, ``bandwidth_table``) run anywhere; the ``engine_*`` functions and
``p2p_watchdog`` run on the engines (inside ``%%px`` cells or through ``cluster.run``) and import
torch there.

The ring all-reduce itself is the learner's exercise in ``01_collectives``; nothing here
implements it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

#: Bus-bandwidth correction factors, as nccl-tests defines them, for ``p`` ranks.
_BUS_FACTORS: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda p: 2 * (p - 1) / p,
    "all_gather": lambda p: (p - 1) / p,
    "reduce_scatter": lambda p: (p - 1) / p,
    "broadcast": lambda p: 1.0,
    "reduce": lambda p: 1.0,
}


def chunk_bounds(n: int, p: int) -> list[tuple[int, int]]:
    """Split ``n`` elements into ``p`` contiguous chunks whose sizes differ by at most one.

    The first ``n % p`` chunks get one extra element; with ``n < p`` some chunks are empty.
    ``chunk_bounds(10, 3) == [(0, 4), (4, 7), (7, 10)]``.
    """
    if p < 1 or n < 0:
        raise ValueError(f"need p >= 1 and n >= 0, got n={n}, p={p}")
    q, rem = divmod(n, p)
    out: list[tuple[int, int]] = []
    start = 0
    for i in range(p):
        stop = start + q + (1 if i < rem else 0)
        out.append((start, stop))
        start = stop
    return out


def ring_bytes(n: int, p: int, itemsize: int) -> dict[str, Any]:
    """What a chunked ring all-reduce of ``n`` items must send, per rank and in total.

    Each of the ``2(p-1)`` steps sends one chunk, so summed over ranks exactly
    ``2(p-1) * n * itemsize`` bytes move, i.e. ``2(p-1)/p`` of the buffer per rank on average.
    With sizes not divisible by ``p`` one rank may send a chunk more or less than another, so
    per-rank bytes lie between ``min`` and ``max``.
    """
    sizes = [b - a for a, b in chunk_bounds(n, p)]
    steps = 2 * (p - 1)
    return {
        "total": steps * n * itemsize,
        "per_rank": 2 * (p - 1) / p * n * itemsize,
        "min": steps * min(sizes) * itemsize,
        "max": steps * max(sizes) * itemsize,
        "buffer": n * itemsize,
    }


def algbw(nbytes: float, seconds: float) -> float:
    """Algorithm bandwidth in GB/s: buffer size over time (what the caller experiences)."""
    return nbytes / seconds / 1e9


def busbw(nbytes: float, seconds: float, p: int, op: str = "all_reduce") -> float:
    """Bus bandwidth in GB/s: algbw times the op's factor (``2(p-1)/p`` for all_reduce).

    busbw is comparable across world sizes and with the link's peak, because it counts the
    bytes a ring really moves per rank.
    """
    if op not in _BUS_FACTORS:
        raise ValueError(f"unknown op {op!r}; one of {sorted(_BUS_FACTORS)}")
    return algbw(nbytes, seconds) * _BUS_FACTORS[op](p)


def bandwidth_table(rows: dict[str, float], nbytes: int, p: int,
                    op: str = "all_reduce") -> str:
    """A printable table of time, algbw and busbw for named timings (seconds), plus ratios
    against the first row."""
    names = list(rows)
    if not names:
        return "(no timings)"
    base = busbw(nbytes, rows[names[0]], p, op)
    lines = [f"{'implementation':<22}{'time ms':>10}{'algbw GB/s':>12}{'busbw GB/s':>12}"
             f"{'busbw ratio':>14}"]
    for name in names:
        s = rows[name]
        bb = busbw(nbytes, s, p, op)
        lines.append(f"{name:<22}{s * 1e3:>10.1f}{algbw(nbytes, s):>12.3f}{bb:>12.3f}"
                     f"{bb / base:>13.2f}x")
    lines.append(f"buffer {nbytes / 2**20:.0f} MiB, {p} ranks, busbw = algbw * 2(p-1)/p, "
                 f"ratio against {names[0]}")
    return "\n".join(lines)


# ---- engine side ---------------------------------------------------------------------------
class P2PStuck(RuntimeError):
    """A send or receive under :func:`p2p_watchdog` waited longer than its limit.

    Attributes say which call (``send``, ``recv``, ``isend``, ``irecv``), the peer rank, the
    message size in bytes, which message of this rank it was (1 = first) and how long it waited.
    """

    def __init__(self, rank: int, call: str, peer: int | None, nbytes: int, number: int,
                 seconds: float) -> None:
        self.rank, self.call, self.peer, self.nbytes = rank, call, peer, nbytes
        self.number, self.seconds = number, seconds
        towards = "to" if "send" in call else "from"
        super().__init__(
            f"rank {rank}: dist.{call} {towards} rank {peer} ({nbytes} bytes, message {number} "
            f"of this rank) did not complete within {seconds:g} s. On gloo a send completes only "
            "when the receiving rank has posted the matching recv, at any message size. If "
            "every rank is stuck in a send, it is a send/recv deadlock: post both sides with "
            "dist.isend/dist.irecv and then wait() on both (or let even ranks send first and odd "
            "ranks receive first). The watchdog ran these messages on a throwaway group, so the "
            "course's process group is unharmed; the same code run without the watchdog blocks "
            "for the group's whole timeout and leaves its messages queued in the group: then "
            "run cluster = cu.restart() and re-run the cells from Setup.")

    def as_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "call": self.call, "peer": self.peer, "bytes": self.nbytes,
                "number": self.number, "seconds": self.seconds}


class _TimedWork:
    """A request from ``isend``/``irecv`` whose ``wait()`` gives up after the watchdog's limit."""

    def __init__(self, work: Any, on_wait: Callable[[Any, float | None], Any]) -> None:
        self._work, self._on_wait = work, on_wait

    def wait(self, timeout: Any = None) -> Any:
        return self._on_wait(self._work, timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


@contextlib.contextmanager
def p2p_watchdog(seconds: float = 5.0) -> Iterator[None]:
    """*Collective* (every rank enters it). Inside the block, ``dist.send``/``dist.recv`` and
    the ``wait()`` of requests from ``dist.isend``/``dist.irecv`` raise :class:`P2PStuck`
    after ``seconds`` instead of blocking until the process group's timeout. Engine side;
    introduced in ``01_collectives``.

    The messages travel on a throwaway group of all ranks (made on entry, destroyed on exit):
    gloo closes a connection whose wait timed out, and the course's process group must not
    lose its connections to a learner's deadlock. Nothing else changes: a blocking ``send``
    still waits for its matching ``recv`` (it is ``isend`` + ``wait``, which is what gloo does
    too), so a deadlocking ring still deadlocks, but it says so within ``seconds``.
    """
    import datetime

    import torch.distributed as dist

    names = ("send", "recv", "isend", "irecv")
    saved = {name: getattr(dist, name) for name in names}
    rank = dist.get_rank()
    count = [0]
    limit = datetime.timedelta(seconds=seconds)
    scratch = dist.new_group(timeout=datetime.timedelta(seconds=max(seconds, 1.0) + 30))

    def waiter(call: str, peer: int | None, tensor: Any, number: int
               ) -> Callable[[Any, Any], Any]:
        def wait(work: Any, timeout: Any = None) -> Any:
            try:
                return work.wait(timeout=limit if timeout is None else timeout)
            except RuntimeError as exc:
                # gloo: "Timed out waiting ...", or, once the peer's own wait timed out and
                # closed the connection, "Application timeout caused pair closure".
                text = str(exc).lower()
                if not any(k in text for k in ("timed out", "timeout", "closed", "reset")):
                    raise
                raise P2PStuck(rank, call, peer, int(tensor.numel() * tensor.element_size()),
                               number, seconds) from None
        return wait

    def post(call: str, tensor: Any, peer: int | None, *args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        real = saved["isend" if "send" in call else "irecv"]
        if not args and kwargs.get("group") is None:
            kwargs["group"] = scratch   # peer stays a global rank: the same in this group
        work = real(tensor, peer, *args, **kwargs)
        return work, waiter(call, peer, tensor, count[0])

    def send(tensor: Any, dst: int | None = None, *args: Any, **kwargs: Any) -> None:
        work, wait = post("send", tensor, dst, *args, **kwargs)
        wait(work)

    def recv(tensor: Any, src: int | None = None, *args: Any, **kwargs: Any) -> Any:
        work, wait = post("recv", tensor, src, *args, **kwargs)
        wait(work)
        return src

    def isend(tensor: Any, dst: int | None = None, *args: Any, **kwargs: Any) -> Any:
        work, wait = post("isend", tensor, dst, *args, **kwargs)
        return _TimedWork(work, wait)

    def irecv(tensor: Any, src: int | None = None, *args: Any, **kwargs: Any) -> Any:
        work, wait = post("irecv", tensor, src, *args, **kwargs)
        return _TimedWork(work, wait)

    for name, fn in (("send", send), ("recv", recv), ("isend", isend), ("irecv", irecv)):
        setattr(dist, name, fn)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)
        # Leave together: a rank that finished must not tear the group down under a neighbour
        # still waiting on it (that neighbour would see "connection closed", not its timeout).
        with contextlib.suppress(Exception):
            dist.barrier(group=scratch, async_op=True).wait(
                timeout=datetime.timedelta(seconds=seconds + 5))
        dist.destroy_process_group(scratch)


def engine_time(fn: Callable[[], Any], iters: int = 5, warmup: int = 1) -> float:
    """Median seconds of ``fn()`` over ``iters`` runs, the slowest rank's time for each run.

    Collective: every rank must call it with the same ``iters``/``warmup``. Each run starts
    after a barrier, and each rank's time is max-reduced, because a collective is only done
    when its last rank is.
    """
    import time

    import torch
    import torch.distributed as dist

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        times.append(float(dt.item()))
    times.sort()
    return times[len(times) // 2]


def engine_compare(fns: dict[str, Callable[[], Any]], iters: int = 7, warmup: int = 1
                   ) -> dict[str, float]:
    """*Collective.* Median seconds of each named ``fn()``, the slowest rank's time per run.

    The functions take turns (A, B, A, B, ...) rather than running all of A then all of B, so
    a machine whose load changes during the measurement (a shared CI box) biases neither.
    """
    import time

    import torch
    import torch.distributed as dist

    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(iters):
        for name, fn in fns.items():
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)
            times[name].append(float(dt.item()))
    return {name: sorted(ts)[len(ts) // 2] for name, ts in times.items()}


def px_function(name: str) -> Callable[..., Any]:
    """The function ``name`` that a ``%%px`` cell defined on this engine (engine side; what
    the recorders of ``01_collectives`` call the learner's ring through)."""
    import __main__

    fn = vars(__main__).get(name)
    if not callable(fn):
        raise NameError(f"{name!r} is not defined on this engine: run the %%px cell first")
    return fn


def engine_bench_all_reduce(fn_name: str, nbytes: int = 64 * 2**20, iters: int = 7
                            ) -> dict[str, float]:
    """*Collective.* Median seconds of the ``%%px`` function ``fn_name(t)`` and of
    ``dist.all_reduce(t)`` on a float32 buffer of ``nbytes``, measured in turns
    (:func:`engine_compare`). Used in ``01_collectives``."""
    import torch
    import torch.distributed as dist

    fn = px_function(fn_name)
    t = torch.full((nbytes // 4,), 1e-3)
    return engine_compare({"dist.all_reduce (gloo)": lambda: dist.all_reduce(t),
                           fn_name: lambda: fn(t)}, iters=iters)


def record_sends(fn: Callable[[Any], Any], t: Any) -> list[dict[str, Any]]:
    """Call ``fn(t)`` with ``dist.send``/``dist.isend`` watched, and return one dict per message
    this rank sent, in order: ``dst``, ``values`` (the message as sent), ``start`` (its offset
    in ``t``'s flat buffer; when a copy was sent, where its values first occur in ``t``, or -1)
    and ``buffer`` (all of ``t`` just before the send). Engine side; as collective as ``fn``.

    The one spy on sends of the course's recorders (:func:`engine_record_ring` here,
    :func:`course_utils.torch_dist.record.engine_record_ring_frames` for the ring replay).
    """
    import torch.distributed as dist

    flat = t.view(-1)
    base, n, size = flat.data_ptr(), flat.numel(), flat.element_size()
    storage = flat.untyped_storage().data_ptr()
    sent: list[dict[str, Any]] = []
    saved = {name: getattr(dist, name) for name in ("send", "isend")}

    def spying(name: str) -> Callable[..., Any]:
        def spy(tensor: Any, dst: int, *args: Any, **kwargs: Any) -> Any:
            values = tensor.detach().reshape(-1).tolist()
            buffer = flat.tolist()
            view = tensor.untyped_storage().data_ptr() == storage  # a view into t
            start = (tensor.data_ptr() - base) // size if view else -1
            if not 0 <= start <= n - len(values):  # a copy: find it in the buffer by value
                start = _find(buffer, values)
            sent.append({"dst": int(dst), "values": values, "start": int(start),
                         "buffer": buffer})
            return saved[name](tensor, dst, *args, **kwargs)
        return spy

    for name in saved:
        setattr(dist, name, spying(name))
    try:
        fn(t)
    finally:
        for name, f in saved.items():
            setattr(dist, name, f)
    return sent


def _find(buffer: list[float], part: list[float]) -> int:
    for i in range(len(buffer) - len(part) + 1):
        if buffer[i:i + len(part)] == part:
            return i
    return -1


def engine_record_ring(fn_name: str, n: int) -> dict[str, Any]:
    """*Collective.* Run the ``%%px`` function ``fn_name(t)`` on a small readable tensor (rank
    ``r`` holds ``100*r + [0, 1, ..., n-1]``) and record every message it sends with
    ``dist.isend``/``dist.send``: destination and the chunk's values *at the moment it was
    sent*. Returns this rank's ``before``, ``messages`` and ``after``, for
    :func:`course_utils.viz.ring_trace` (the gallery's static trace).
    """
    import torch
    import torch.distributed as dist

    fn = px_function(fn_name)
    rank = dist.get_rank()
    t = torch.arange(n, dtype=torch.float32) + 100.0 * rank
    before = t.tolist()
    messages = [(m["dst"], m["values"]) for m in record_sends(fn, t)]
    return {"rank": rank, "before": before, "messages": messages, "after": t.tolist()}
