"""A pipeline stage that keeps its own timeline (``11_tensor_and_pipeline``): when each
microbatch's forward and backward ran on this rank, and how many bytes of activations autograd
kept alive for them. Engine side only (it imports torch); the learner's schedules and torch's
``PipelineStage`` call it like the stage it wraps.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn


class TimedStage(nn.Module):
    """A pipeline stage that records, on this rank, when each microbatch's forward and backward
    ran and how many bytes of activations autograd kept for it, from the moment its forward
    saved them until its backward was done. Called like the stage (``y = stage(x)``).

    ``events``: ``(kind, microbatch, start, end)`` with kind ``"F"`` or ``"B"`` and times from
    ``time.monotonic`` (one clock for every process on a host). A backward starts when the
    gradient of the stage's output arrives (a hook on the output) and ends when the stage's
    first weight has its gradient (the last one backward computes)."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module
        self.reset()
        first = next(q for q in module.parameters() if q.requires_grad)
        first.register_post_accumulate_grad_hook(self._backward_done)

    def reset(self) -> None:
        """Forget the events and activations recorded so far (a new step is timed)."""
        self.events: list[tuple[str, int, float, float]] = []
        self.live = 0
        self.peak_live = 0
        self.saved_per_micro: list[int] = []
        self._in_backward: list[tuple[int, float]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled():  # a look at shapes (torch's PipelineStage), no step
            return self.module(x)
        i = sum(1 for e in self.events if e[0] == "F")
        seen: set[int] = set()
        saved = [0]

        def pack(t: Any) -> Any:
            if t.data_ptr() not in seen:  # a tensor saved twice is kept once
                seen.add(t.data_ptr())
                saved[0] += t.nbytes
            return t

        start = time.monotonic()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = self.module(x)
        self.events.append(("F", i, start, time.monotonic()))
        self.saved_per_micro.append(saved[0])
        self.live += saved[0]
        self.peak_live = max(self.peak_live, self.live)
        if y.requires_grad:
            y.register_hook(lambda g, i=i: self._backward_starts(i))
        return y

    def _backward_starts(self, i: int) -> None:
        self._in_backward.append((i, time.monotonic()))

    def _backward_done(self, _param: Any) -> None:
        if self._in_backward:
            i, start = self._in_backward.pop(0)
            self.events.append(("B", i, start, time.monotonic()))
            self.live -= self.saved_per_micro[i]

    def most_in_flight(self) -> int:
        """The most microbatches whose forward had run and backward had not, at any moment."""
        marks = sorted([(e[3], 1) for e in self.events if e[0] == "F"]
                       + [(e[3], -1) for e in self.events if e[0] == "B"])
        level = peak = 0
        for _, step in marks:
            level += step
            peak = max(peak, level)
        return peak
