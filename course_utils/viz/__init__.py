"""Figures for the PyTorch track: pure functions of recorded arrays; none talks to a cluster.

Record on the engines, ``cluster.pull`` the arrays, then plot here (so figures are testable
without engines and can be replayed in slides). Each function returns a matplotlib ``Figure``.
Introduced in ``01_collectives`` (``per_rank_tensors``, ``bandwidth_bars``),
``02_data_parallel_from_scratch`` (``replica_divergence``) and ``03_pytorch_ddp``
(``per_rank_curves``); the TensorFlow pictures in :mod:`.tf_pictures` (units 4-5).
"""

from __future__ import annotations

from .collectives import bandwidth_bars, per_rank_tensors, ring_trace
from .tf_pictures import coordinator_queue, ps_cluster, ps_vs_all_reduce
from .training import per_rank_curves, replica_divergence

__all__ = ["bandwidth_bars", "coordinator_queue", "per_rank_curves", "per_rank_tensors",
           "ps_cluster", "ps_vs_all_reduce", "replica_divergence", "ring_trace"]
