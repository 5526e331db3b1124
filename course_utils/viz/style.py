"""Shared figure plumbing: matplotlib is imported lazily, keeping the notebook's backend."""

from __future__ import annotations

from typing import Any


def _plt() -> Any:
    import matplotlib.pyplot as plt  # the notebook's (or MPLBACKEND's) backend is kept

    return plt
