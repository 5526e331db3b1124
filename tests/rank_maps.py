"""Rank maps for tests of messages that name ranks and hosts (no cluster needed)."""

from __future__ import annotations

from course_utils.cluster.ranks import RankInfo, RankMap


def two_hosts() -> RankMap:
    """Four ranks, two on host ``a`` (engines 10, 11) and two on host ``b`` (12, 13)."""
    return RankMap(tuple(
        RankInfo(engine_id=10 + r, rank=r, world_size=4, local_rank=r % 2, local_world_size=2,
                 node_rank=r // 2, host="ab"[r // 2], addr=f"10.0.0.{r // 2}", pid=100 + r,
                 gpus=0, master_addr="10.0.0.0")
        for r in range(4)), hosts=("a", "b"))
