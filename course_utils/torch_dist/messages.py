"""What known torch.distributed messages mean, for the learner (kernel side): a DETAIL-mode
collective mismatch, a timed-out or closed process group, a missing group, each turned into the
course's cause + fix. Registered with :mod:`course_utils.cluster.kernel.failures` on import (the
process group module imports it), so a failing ``%%px`` cell or ``cluster.run`` says it in those
words.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..cluster.kernel import failures
from ..errors import CollectiveMismatch, CourseError, ProcessGroupGone

_FINGERPRINT = re.compile(
    r"Rank (?P<rank>\d+) is running collective: CollectiveFingerPrint\("
    r"SequenceNumber=(?P<seq>\d+), OpType=(?P<op>\w+)"
    r"(?:, TensorShape=\[(?P<shape>[^\]]*)\])?(?:, TensorDtypes=(?P<dtype>[^,)]+))?")
_TIMEOUT = re.compile(r"Timed out waiting (?P<ms>\d+)ms|timed out after (?P<ms2>\d+) ?ms"
                      r"|Watchdog caught collective operation timeout", re.I)
_BARRIER = re.compile(r"Ranks? (?P<ranks>[\d, ]+) failed to pass monitoredBarrier in "
                      r"(?P<ms>\d+) ms")
_GONE = re.compile(r"Connection closed by peer|pair closure|Connection reset by peer"
                   r"|Broken pipe|NCCL communicator was aborted", re.I)
_OPS = {"ALLREDUCE": "all_reduce", "ALLGATHER": "all_gather",
        "REDUCE_SCATTER": "reduce_scatter", "_ALLGATHER_BASE": "all_gather_into_tensor",
        "_REDUCE_SCATTER_BASE": "reduce_scatter_tensor", "ALLTOALL": "all_to_all",
        "ALLTOALL_BASE": "all_to_all_single", "ALLREDUCE_COALESCED": "all_reduce_coalesced",
        "ALLGATHER_COALESCED": "all_gather_coalesced"}
RESTART_FIX = ("run cu.restart() (it replaces the engines and rebuilds the process group), then "
               "make every rank call the same collectives in the same order and re-run the cell")


def op_name(op_type: str) -> str:
    """torch's ``OpType`` name -> the ``torch.distributed`` function a learner calls."""
    return _OPS.get(op_type, op_type.lower())


def collective_calls(messages: Sequence[str]) -> dict[int, dict[str, str]]:
    """Per rank, the collective it was running, from DETAIL-mode mismatch messages:
    ``{rank: {"op": "all_reduce", "shape": "[2, 2]", "dtype": "float", "seq": "1"}}``."""
    calls: dict[int, dict[str, str]] = {}
    for text in messages:
        for m in _FINGERPRINT.finditer(text):
            calls.setdefault(int(m["rank"]), {
                "op": op_name(m["op"]),
                "shape": f"[{m['shape']}]" if m["shape"] is not None else "",
                "dtype": (m["dtype"] or "").strip().lower(),
                "seq": m["seq"],
            })
    return calls


def mismatch_error(messages: Sequence[str]) -> CollectiveMismatch:
    """The course's message for a DETAIL-mode "Detected mismatch between collectives"."""
    calls = collective_calls(messages)
    rows = []
    for rank in sorted(calls):
        c = calls[rank]
        bits = [c["op"]] + [f"shape {c['shape']}"] * bool(c["shape"]) + [c["dtype"]] * bool(
            c["dtype"])
        rows.append(f"rank {rank}: {', '.join(bits)}")
    differ = [k for k in ("op", "shape", "dtype") if len({c[k] for c in calls.values()}) > 1]
    what = {"op": "the collective called", "shape": "tensor shape", "dtype": "dtype"}
    seq = sorted({c["seq"] for c in calls.values()})
    where = f", collective #{'/'.join(seq)} of the group" if seq else ""
    if rows:
        said = "\n  ".join(rows) + (
            f"\nThey differ in {' and '.join(what[k] for k in differ)}." if differ else "")
    else:  # torch's words did not name each rank's call: show them rather than nothing
        first = next((t for t in messages if t.strip()), "(no message)")
        said = "torch said: " + " ".join(first.split())[:400]
    return CollectiveMismatch(
        "the ranks called collectives that do not match (caught at once by "
        f"TORCH_DISTRIBUTED_DEBUG=DETAIL{where}):\n  " + said,
        "every rank must call the same collectives in the same order, with tensors of the "
        "same shape and dtype (a size that depends on the rank, or a rank that returns early "
        "or skips a collective inside an `if rank == ...`, is the usual cause); the group "
        "is still usable: fix the code and re-run the cell",
    )


def _translate(found: Sequence[failures.Failure]) -> CourseError | None:
    texts = [f.evalue for f in found]
    if any("Detected mismatch between collectives" in t for t in texts):
        return mismatch_error(texts)
    ranks = failures.rank_list([f.rank for f in found if f.rank is not None] or [0])
    for f in found:
        m = _BARRIER.search(f.evalue)
        if m:
            late = failures.rank_list([int(r) for r in m["ranks"].replace(",", " ").split()])
            return ProcessGroupGone(
                f"{late} never reached the collective that {f.where} waited "
                f"in for {int(m['ms']) / 1000:g} s (the process-group timeout); a group that "
                "timed out is closed and cannot be used again", RESTART_FIX)
    timed = [f for f in found if _TIMEOUT.search(f.evalue)]
    if timed:
        m = _TIMEOUT.search(timed[0].evalue)
        ms = (m["ms"] or m["ms2"]) if m else None
        waited = f" for {int(ms) / 1000:g} s" if ms else ""
        who = failures.ranks_where(timed)
        return ProcessGroupGone(
            f"{who} waited in a collective{waited} (the process-group "
            "timeout) for ranks that never joined it: a collective some ranks skip, or call in "
            "another order. A group that timed out is closed and cannot be used again",
            RESTART_FIX)
    if any(_GONE.search(t) for t in texts):
        return ProcessGroupGone(
            f"the process group is gone ({ranks}): an earlier collective timed out, or a rank "
            "died, and closed its connections; a group cannot be used after that",
            "run cu.restart() (it replaces the engines and rebuilds the process group), then "
            "re-run the cell")
    if any("Default process group has not been initialized" in t for t in texts):
        return ProcessGroupGone(
            f"{ranks} have no process group (it was never built, or was destroyed)",
            "run cu.start_torch() first, then re-run the cell")
    return None


failures.add_translator("torch", _translate)
