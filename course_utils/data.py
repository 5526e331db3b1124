"""Datasets with their real loaders, offline fallbacks on small real data, and sharding.

Every loader returns plain NumPy arrays so it works on any engine and in either framework.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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


#: Held-out size of the digits fallback's test split (the rest is the training split).
DIGITS_TEST = 500


def sklearn_digits(train: bool = True, seed: int = 0) -> ArrayDataset:
    """The sklearn digits shaped like CIFAR-10: 3x32x32 float32 images in [0, 1].

    Each 8x8 digit is upsampled 4x (nearest neighbour) and copied to 3 channels, so the original
    program's CIFAR-10 CNN runs unchanged. A seeded split keeps ``DIGITS_TEST`` images for testing.
    This is the offline fallback of :func:`cifar10` (introduced in ``03_pytorch_ddp``).
    """
    d = digits()
    order = np.random.default_rng(seed).permutation(len(d))
    idx = order[DIGITS_TEST:] if train else order[:DIGITS_TEST]
    img = d.x[idx].reshape(-1, 1, 8, 8).repeat(4, axis=2).repeat(4, axis=3)
    img = np.ascontiguousarray(np.repeat(img, 3, axis=1), dtype=np.float32)
    split = "train" if train else "test"
    return ArrayDataset(img, d.y[idx], "sklearn-digits",
                        f"offline fallback: sklearn digits ({split}, {len(idx)} real 8x8 digits "
                        "upsampled to 3x32x32), not CIFAR-10")


#: The folder ``torchvision.datasets.CIFAR10`` extracts its archive to, under ``root``.
CIFAR10_FOLDER = "cifar-10-batches-py"


def cifar10(root: str, train: bool = True, n: int | None = None, download: bool = True,
            seed: int = 0, timeout: float = 30.0) -> ArrayDataset:
    """CIFAR-10 through ``torchvision.datasets.CIFAR10`` or, if that fails, the offline fallback.

    ``x`` is float32 (N, 3, 32, 32) in [0, 1], ``y`` int64. ``n`` keeps a seeded random subset.
    When the download (or a local copy under ``root``) is unavailable, e.g. in CI without
    internet, :func:`sklearn_digits` is returned instead and ``note`` says so in one line.
    On several ranks, let rank 0 download first, then barrier, then the others load with
    ``download=False`` (two processes writing the same archive corrupt it). ``timeout`` bounds
    each network operation, so a network that drops packets falls back instead of hanging.
    Introduced in ``03_pytorch_ddp``.
    """
    import socket

    previous = socket.getdefaulttimeout()
    try:
        if not download and not (Path(root) / CIFAR10_FOLDER).is_dir():
            # torchvision would say the same ("Dataset not found or corrupted"), after an
            # import that costs seconds of CPU on every rank (torchvision pulls in torch._dynamo)
            raise FileNotFoundError(f"download=False and no local copy in "
                                    f"{Path(root) / CIFAR10_FOLDER}")
        from torchvision.datasets import CIFAR10

        socket.setdefaulttimeout(timeout)
        try:
            ds = CIFAR10(root, train=train, download=download)
        finally:
            socket.setdefaulttimeout(previous)
        x = np.ascontiguousarray(ds.data.transpose(0, 3, 1, 2), dtype=np.float32) / 255.0
        y = np.asarray(ds.targets, dtype=np.int64)
        out = ArrayDataset(x, y, "cifar10",
                           f"CIFAR-10 via torchvision ({'train' if train else 'test'}, "
                           f"{len(y)} images)")
    except Exception as exc:  # no network, no local copy, or a corrupt archive
        fb = sklearn_digits(train=train, seed=seed)
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0][:80] if str(exc) else ''}"
        out = ArrayDataset(fb.x, fb.y, fb.name, f"CIFAR-10 unavailable ({reason}); {fb.note}")
    if n is not None and n < len(out):
        keep = np.sort(np.random.default_rng(seed).permutation(len(out))[:n])
        out = ArrayDataset(out.x[keep], out.y[keep], out.name, out.note + f"; subset of {n}")
    return out
