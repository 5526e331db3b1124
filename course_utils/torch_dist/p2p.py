"""Point-to-point support for the learner's ring all-reduce: chunk bounds, the bytes a ring
must send, a watchdog on ``send``/``recv``, and a spy on what each rank sends.

Introduced in ``01_collectives``. ``chunk_bounds`` and ``ring_bytes`` are pure and run anywhere;
:func:`p2p_watchdog`, :func:`record_sends` and :func:`engine_record_ring` run on the engines
(inside ``%%px`` cells or through ``cluster.run``) and import torch there. Bandwidth and timing
live in :mod:`course_utils.torch_dist.bandwidth`.

The ring all-reduce itself is the learner's exercise in ``01_collectives``; nothing here
implements it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from ..cluster.engines.engine import px_name
from .spies import replaced


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


class P2PUnwaited(RuntimeError):
    """Requests from ``dist.isend``/``dist.irecv`` under :func:`p2p_watchdog` that the code
    never called ``wait()`` on (``unwaited``: one ``(call, peer, number)`` each)."""

    def __init__(self, rank: int, unwaited: list[tuple[str, int | None, int]]) -> None:
        self.rank, self.unwaited = rank, unwaited
        call, peer, number = unwaited[0]
        towards = "to" if "send" in call else "from"
        super().__init__(
            f"rank {rank}: {len(unwaited)} request(s) from dist.isend/dist.irecv were never "
            f"waited for (the first: dist.{call} {towards} rank {peer}, message {number} of "
            "this rank). Until wait() returns, a receive buffer may not hold the message yet "
            "and a send buffer must not change: keep each request and call wait() on it "
            "before you read or reuse its tensor.")


#: False in a process that ends right after its check (a rank of
#: :func:`course_utils.checks.spawn.spawn`'s world): :func:`p2p_watchdog` then leaves its
#: throwaway group to the process's end. Destroying a gloo group waits for its pending
#: requests: after a send found stuck, the group's whole timeout (35 s), for nothing.
DESTROY_SCRATCH = True


class P2PWatch:
    """What :func:`p2p_watchdog` yields: ``clean`` stays True while no wait failed. A caller
    that catches a learner's error inside the block sets it False: requests left behind by a
    failure are not the learner's forgotten ``wait()``."""

    def __init__(self) -> None:
        self.clean = True


class _TimedWork:
    """A request from ``isend``/``irecv`` whose ``wait()`` gives up after the watchdog's limit."""

    def __init__(self, work: Any, on_wait: Callable[[Any, float | None], Any]) -> None:
        self._work, self._on_wait = work, on_wait

    def wait(self, timeout: Any = None) -> Any:
        return self._on_wait(self._work, timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


@contextlib.contextmanager
def p2p_watchdog(seconds: float = 5.0) -> Iterator[P2PWatch]:
    """*Collective* (every rank enters it). Inside the block, ``dist.send``/``dist.recv`` and
    the ``wait()`` of requests from ``dist.isend``/``dist.irecv`` raise :class:`P2PStuck`
    after ``seconds`` instead of blocking until the process group's timeout, and a request
    never waited for raises :class:`P2PUnwaited` when the block ends cleanly (it yields a
    :class:`P2PWatch`). Engine side; introduced in ``01_collectives``.

    The messages travel on a throwaway group of all ranks (made on entry, destroyed on exit):
    gloo closes a connection whose wait timed out, and the course's process group must not
    lose its connections to a learner's deadlock. A blocking ``send`` still waits for its
    ``recv`` (``isend`` + ``wait``, as in gloo): a deadlock still deadlocks, but says so."""
    import datetime

    import torch.distributed as dist

    saved = {name: getattr(dist, name) for name in ("send", "recv", "isend", "irecv")}
    rank = dist.get_rank()
    count = [0]
    limit = datetime.timedelta(seconds=seconds)
    scratch = dist.new_group(timeout=datetime.timedelta(seconds=max(seconds, 1.0) + 30))
    posted: dict[int, tuple[Any, str, int | None]] = {}  # message number -> not yet waited
    watch = P2PWatch()

    def waiter(call: str, peer: int | None, tensor: Any, number: int
               ) -> Callable[[Any, Any], Any]:
        def wait(work: Any, timeout: Any = None) -> Any:
            posted.pop(number, None)
            try:
                return work.wait(timeout=limit if timeout is None else timeout)
            except RuntimeError as exc:
                watch.clean = False
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
        posted[count[0]] = (work, call, peer)
        return work, waiter(call, peer, tensor, count[0])

    def send(tensor: Any, dst: int | None = None, *args: Any, **kwargs: Any) -> None:
        work, wait = post("send", tensor, dst, *args, **kwargs)
        wait(work)

    def recv(tensor: Any, src: int | None = None, *args: Any, **kwargs: Any) -> Any:
        work, wait = post("recv", tensor, src, *args, **kwargs)
        wait(work)
        return src

    def posting(call: str, key: str) -> Callable[..., Any]:  # a request with a timed wait
        def fn(tensor: Any, *args: Any, **kwargs: Any) -> Any:  # key: "dst" or "src"
            peer = args[0] if args else kwargs.pop(key, None)
            return _TimedWork(*post(call, tensor, peer, *args[1:], **kwargs))
        return fn

    timed = {"send": send, "recv": recv, "isend": posting("isend", "dst"),
             "irecv": posting("irecv", "src")}
    unwaited: list[tuple[str, int | None, int]] = []
    failed = True  # until the block ends without an exception
    try:
        with replaced(lambda name, _real: timed[name], timed):
            yield watch
        failed = False
    finally:
        if not failed and watch.clean:
            unwaited = _land_unwaited(posted, limit)
        if DESTROY_SCRATCH:
            _leave_together(scratch, seconds)
    if unwaited:
        raise P2PUnwaited(rank, unwaited)


def _land_unwaited(posted: dict[int, tuple[Any, str, int | None]], limit: Any
                   ) -> list[tuple[str, int | None, int]]:
    """The requests never waited for, as ``(call, peer, number)``, after letting each land
    (for at most ``limit``) so that the throwaway group goes with nothing in flight."""
    for work, _, _ in posted.values():
        with contextlib.suppress(Exception):
            work.wait(timeout=limit)
    return [(call, peer, k) for k, (_, call, peer) in sorted(posted.items())]


def _leave_together(scratch: Any, seconds: float) -> None:
    """Destroy the watchdog's group once every rank is done with it: a rank that finished must
    not tear the group down under a neighbour still waiting on it (that neighbour would see
    "connection closed", not its timeout)."""
    import datetime

    import torch.distributed as dist

    with contextlib.suppress(Exception):
        dist.barrier(group=scratch, async_op=True).wait(
            timeout=datetime.timedelta(seconds=seconds + 5))
    dist.destroy_process_group(scratch)


def record_sends(fn: Callable[[Any], Any], t: Any) -> list[dict[str, Any]]:
    """Call ``fn(t)`` with ``dist.send``/``dist.isend`` watched, and return one dict per message
    this rank sent, in order: ``dst``, ``values`` (the message as sent), ``start`` (its offset
    in ``t``'s flat buffer; when a copy was sent, where its values first occur in ``t``, or -1)
    and ``buffer`` (all of ``t`` just before the send). Engine side; as collective as ``fn``.

    The one spy on sends of the course's recorders (:func:`engine_record_ring` here,
    :func:`course_utils.torch_dist.record.engine_record_ring_frames` for the ring replay).
    """
    flat = t.view(-1)
    base, n, size = flat.data_ptr(), flat.numel(), flat.element_size()
    storage = flat.untyped_storage().data_ptr()
    sent: list[dict[str, Any]] = []

    def spying(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def spy(tensor: Any, dst: int, *args: Any, **kwargs: Any) -> Any:
            values = tensor.detach().reshape(-1).tolist()
            buffer = flat.tolist()
            view = tensor.untyped_storage().data_ptr() == storage  # a view into t
            start = (tensor.data_ptr() - base) // size if view else -1
            if not 0 <= start <= n - len(values):  # a copy: find it in the buffer by value
                start = _find(buffer, values)
            sent.append({"dst": int(dst), "values": values, "start": int(start),
                         "buffer": buffer})
            return real(tensor, dst, *args, **kwargs)
        return spy

    with replaced(spying, ("send", "isend")):
        fn(t)
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

    fn = px_name(fn_name, to_call=True)
    rank = dist.get_rank()
    t = torch.arange(n, dtype=torch.float32) + 100.0 * rank
    before = t.tolist()
    messages = [(m["dst"], m["values"]) for m in record_sends(fn, t)]
    return {"rank": rank, "before": before, "messages": messages, "after": t.tolist()}
