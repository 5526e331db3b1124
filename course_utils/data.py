"""Datasets with their real loaders, offline fallbacks on small real data, and sharding.

Every loader returns plain NumPy arrays so it works on any engine and in either framework.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ArrayDataset:
    """Features, labels and a one-line note saying which data this really is."""

    x: np.ndarray
    y: np.ndarray
    name: str
    note: str

    def __len__(self) -> int:
        return len(self.y)


def digits() -> ArrayDataset:
    """The 1,797 real 8x8 handwritten digits that ship inside scikit-learn (no download).

    ``x`` is float32 in [0, 1] with shape (N, 64); ``y`` is int64 in 0..9.
    Introduced in ``02_data_parallel_from_scratch`` and ``04_tf_classic_ps``.
    """
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.int64)
    return ArrayDataset(x, y, "digits", "sklearn digits: 1,797 real 8x8 handwritten digits")


def shard_indices(n: int, rank: int, world_size: int, seed: int | None = None,
                  drop_last: bool = True) -> np.ndarray:
    """Indices of rank ``rank``'s disjoint shard of ``n`` items (strided, like DistributedSampler).

    With ``seed`` the items are shuffled first (every rank must pass the same seed). With
    ``drop_last`` every shard has the same length, so ranks run the same number of steps.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
    order = np.arange(n)
    if seed is not None:
        order = np.random.default_rng(seed).permutation(n)
    if drop_last:
        order = order[: n - n % world_size]
    return order[rank::world_size]
