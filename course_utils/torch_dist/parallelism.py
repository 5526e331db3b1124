"""Tensor and pipeline parallelism, measured (unit ``11_tensor_and_pipeline``).

The models the unit splits, a counter of the bytes ``send``/``isend`` put on the wire, and the
arithmetic the kernel prints beside the measurements: the bubble, the bytes TP and PP send per
step. The models and :class:`P2PCounter` are used on ranks (``cluster.run``, or a world from
:func:`course_utils.checks.spawn`), beside :class:`~.pipeline_stage.TimedStage`; the formulas
are plain arithmetic for the kernel.
"""

from __future__ import annotations

import contextlib
from typing import Any

from .spies import replaced

#: the tensor-parallel block's sizes: d_model and the hidden width (divisible by 1, 2, 4, 8)
D_MODEL, HIDDEN = 16, 64
#: the pipeline's stage width and layers per stage: wide enough that a microbatch's compute,
#: not the message, is what a timeline shows
STAGE_WIDTH, STAGE_LAYERS = 256, 2


def mlp_block(d: int = D_MODEL, hidden: int = HIDDEN, seed: int = 0) -> Any:
    """A transformer's MLP block: ``Linear(d, hidden)``, GELU, ``Linear(hidden, d)``, its
    layers named ``"0"``, ``"1"``, ``"2"`` (as ``parallelize_module``'s plan names them)."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d, hidden), nn.GELU(), nn.Linear(hidden, d))


def pipeline_model(stages: int, width: int = STAGE_WIDTH, layers: int = STAGE_LAYERS,
                   seed: int = 0) -> Any:
    """``stages`` stages of ``layers`` × (``Linear(width, width)``, Tanh), one
    ``nn.Sequential`` per stage inside one ``nn.Sequential``: ``model[r]`` is rank r's stage."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    return nn.Sequential(*[nn.Sequential(*[m for _ in range(layers)
                                           for m in (nn.Linear(width, width), nn.Tanh())])
                           for _ in range(stages)])


def microbatches(m: int, rows: int = 8, width: int = STAGE_WIDTH, seed: int = 1
                 ) -> tuple[list[Any], list[Any]]:
    """``m`` microbatches of inputs and targets, ``rows`` rows each (the same on every rank)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(rows, width, generator=g) for _ in range(m)]
    return xs, [torch.randn(rows, width, generator=g) for _ in range(m)]


def bubble_measured(timelines: list[list[tuple[str, int, float, float]]]) -> float:
    """The idle share of a step, from every rank's events: 1 - (time busy, summed over the
    ranks) / (ranks × the step's span, first start to last end on any rank)."""
    starts = [e[2] for tl in timelines for e in tl]
    span = max(e[3] for tl in timelines for e in tl) - min(starts)
    busy = sum(e[3] - e[2] for tl in timelines for e in tl)
    return 1.0 - busy / (len(timelines) * span)


def bubble_formula(p: int, m: int) -> float:
    """The idle share of GPipe and 1F1B with ``p`` equal stages and ``m`` microbatches, when a
    backward costs a fixed multiple of a forward: ``(p - 1) / (m + p - 1)``."""
    return (p - 1) / (m + p - 1)


def tp_sent_bytes(batch_rows: int, d_model: int, p: int, elem_bytes: int = 4) -> float:
    """What a ring all_reduce sends per rank for one Megatron MLP block's step: one all_reduce
    of the (rows, d_model) activations in forward and one of their gradient in backward, each
    ``2·(p-1)/p`` of the tensor's bytes."""
    return 2 * 2 * (p - 1) / p * batch_rows * d_model * elem_bytes


def pp_sent_bytes(m: int, rows: int, width: int, elem_bytes: int = 4) -> int:
    """What one pipeline stage boundary carries per step: ``m`` activations forward and ``m``
    gradients back, (rows, width) each; an inner rank sends one of each per microbatch."""
    return 2 * m * rows * width * elem_bytes


class P2PCounter:
    """Counts the calls and bytes of ``send``/``isend`` while active, in ``torch.distributed``
    and in ``distributed_c10d`` (where ``batch_isend_irecv``'s ``P2POp`` looks them up), so
    every way of sending is counted."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.sent = 0
        self.sizes: dict[int, int] = {}  # bytes of a send: how many sends of that size
        self._spies = contextlib.ExitStack()
        self._inside = False  # torch's send calls isend: count the outer call only

    def __enter__(self) -> P2PCounter:
        self._spies.enter_context(replaced(self._spy, ("send", "isend"), c10d=True))
        return self

    def __exit__(self, *exc: Any) -> None:
        self._spies.close()

    def _spy(self, name: str, real: Any) -> Any:
        def spy(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            if self._inside:
                return real(tensor, *args, **kwargs)
            self.calls[name] = self.calls.get(name, 0) + 1
            n = tensor.nbytes
            self.sent += n
            self.sizes[n] = self.sizes.get(n, 0) + 1
            self._inside = True
            try:
                return real(tensor, *args, **kwargs)
            finally:
                self._inside = False
        return spy
