"""Graded checks on more ranks than the notebook's cluster has: an answer that depends on the
world size (a typed 2 instead of ``world_size``) passes on 2 ranks and fails on 3.
Used by the tests of ``02_data_parallel_from_scratch`` and ``03_pytorch_ddp``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def on_more_ranks(fn_names: Sequence[str], probe: Callable[..., Any], *args: Any,
                  ranks: int = 3, cluster: Any = None, timeout: float = 120.0,
                  **kwargs: Any) -> list[Any]:
    """``probe(*args, **kwargs)`` on every rank of a cluster with at least ``ranks`` ranks;
    returns its per-rank results.

    When the notebook's cluster has that many ranks, it runs there. Otherwise the learner's
    ``%%px`` functions ``fn_names`` are copied from rank 0 (with what they use:
    :func:`course_utils.torch_dist.px_functions.engine_snapshot_of`) to a separate, short-lived
    ``ranks``-engine cluster with its own gloo group (20-40 s on a busy 2-core machine), the
    probe runs there, and that cluster is stopped, whatever happened. The notebook's own
    cluster and process group are left as they were.
    """
    from ..cluster import current, launch
    from ..torch_dist.process_group import start
    from ..torch_dist.px_functions import engine_restore, engine_snapshot_of

    cc = cluster or current()
    if cc.world_size >= ranks:
        return cc.run(probe, *args, timeout=timeout, **kwargs)
    snapshots = [cc.run_on(0, engine_snapshot_of, name, timeout=30) for name in fn_names]
    side = launch(ranks, profile="local", cluster_id=f"{cc.cluster_id}-p{ranks}")
    try:
        start(side, backend="gloo")
        for snap in snapshots:
            side.run(engine_restore, snap, timeout=timeout)
        return side.run(probe, *args, timeout=timeout, **kwargs)
    finally:
        side.stop(kill=True)  # nothing on it is worth a polite stop
