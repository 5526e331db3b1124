"""Rank map: which engine is which rank, on which host, with which local rank.

Pure functions of what each engine reports about itself (:func:`course_utils.engine.describe`),
so the mapping is unit-tested without a cluster. Introduced in ``00_cluster_tour``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class RankInfo:
    """Everything one engine needs to join a process group."""

    engine_id: int
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    host: str
    addr: str
    pid: int
    gpus: int
    master_addr: str

    def as_env(self) -> dict[str, str]:
        """The variables torchrun would set, so code written here runs under torchrun unchanged."""
        return {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "GROUP_RANK": str(self.node_rank),
            "MASTER_ADDR": self.master_addr,
        }


@dataclass(frozen=True)
class RankMap:
    """Ranks ordered 0..world_size-1; look-ups by rank or by engine id."""

    ranks: tuple[RankInfo, ...]
    hosts: tuple[str, ...] = field(default=())

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def master_addr(self) -> str:
        return self.ranks[0].master_addr

    @property
    def engine_ids(self) -> list[int]:
        """Engine ids in rank order (index = rank)."""
        return [r.engine_id for r in self.ranks]

    def by_engine(self, engine_id: int) -> RankInfo:
        for info in self.ranks:
            if info.engine_id == engine_id:
                return info
        raise KeyError(f"engine {engine_id} is not in the rank map")

    def __getitem__(self, rank: int) -> RankInfo:
        return self.ranks[rank]

    def __len__(self) -> int:
        return len(self.ranks)

    def table(self) -> str:
        """A fixed-width table for notebooks and ``course doctor``."""
        head = f"{'rank':>4} {'engine':>6} {'host':<16} {'local':>5} {'gpus':>4} {'pid':>8}"
        rows = [
            f"{r.rank:>4} {r.engine_id:>6} {r.host[:16]:<16} {r.local_rank:>5} "
            f"{r.gpus:>4} {r.pid:>8}"
            for r in self.ranks
        ]
        return "\n".join([head, *rows])

    def to_dicts(self) -> list[dict[str, Any]]:
        return [asdict(r) for r in self.ranks]


def build_rank_map(
    descriptions: Mapping[int, Mapping[str, Any]],
    host_order: Sequence[str] | None = None,
    local: bool = False,
) -> RankMap:
    """Assign ranks from engine self-descriptions.

    ``descriptions`` maps engine id -> ``{"host", "addr", "pid", "gpus"}``. Hosts keep the order
    given in ``host_order`` (the profile's order, so rank 0 lands on the first host), then any
    others alphabetically; within a host, engines are ordered by engine id. With ``local=True``
    every rank is on this machine and the master address is the loopback address.

    Engines that are the tasks of one Slurm step (each reports ``"slurm"``, see
    :func:`slurm_rank_map`) keep Slurm's numbering instead.
    """
    if not descriptions:
        raise ValueError("no engines to rank: the cluster has no registered engines")
    if slurm_step(descriptions):
        return slurm_rank_map(descriptions)
    order = list(host_order or [])
    seen = {d["host"] for d in descriptions.values()}
    order = [h for h in order if h in seen] + sorted(seen - set(order))
    host_index = {h: i for i, h in enumerate(order)}

    engines = sorted(descriptions, key=lambda e: (host_index[descriptions[e]["host"]], e))
    per_host: dict[str, list[int]] = {}
    for eid in engines:
        per_host.setdefault(descriptions[eid]["host"], []).append(eid)

    first = descriptions[engines[0]]
    master_addr = "127.0.0.1" if local else str(first["addr"])
    world = len(engines)
    infos = []
    for rank, eid in enumerate(engines):
        d = descriptions[eid]
        peers = per_host[d["host"]]
        infos.append(
            RankInfo(
                engine_id=int(eid),
                rank=rank,
                world_size=world,
                local_rank=peers.index(eid),
                local_world_size=len(peers),
                node_rank=host_index[d["host"]],
                host=str(d["host"]),
                addr="127.0.0.1" if local else str(d["addr"]),
                pid=int(d["pid"]),
                gpus=int(d.get("gpus", 0)),
                master_addr=master_addr,
            )
        )
    return RankMap(ranks=tuple(infos), hosts=tuple(order))


def slurm_step(descriptions: Mapping[int, Mapping[str, Any]]) -> bool:
    """True when the engines are exactly the tasks of one Slurm step: all report the same job,
    and their ``SLURM_PROCID`` s are 0..n-1 (engines started inside an ``salloc`` shell, which
    all inherit one PROCID, are not)."""
    facts = [d.get("slurm") for d in descriptions.values()]
    if not facts or any(not f for f in facts):
        return False
    return (len({f["job_id"] for f in facts}) == 1
            and sorted(f["procid"] for f in facts) == list(range(len(facts)))
            and all(f.get("localid") is not None and f.get("nodeid") is not None
                    for f in facts))


def slurm_rank_map(descriptions: Mapping[int, Mapping[str, Any]]) -> RankMap:
    """Ranks as Slurm numbered the tasks: rank = ``SLURM_PROCID``, local rank =
    ``SLURM_LOCALID``, node rank = ``SLURM_NODEID``, host = the Slurm node name.

    This is what ``srun`` hands a script started in the batch job of unit 6 (and what
    ``torchrun`` under ``srun`` derives), so a rank means the same process in both ways of
    starting. The master address is rank 0's address.
    """
    by_rank = sorted(descriptions, key=lambda e: descriptions[e]["slurm"]["procid"])
    facts = {eid: descriptions[eid]["slurm"] for eid in by_rank}
    nodes = sorted({(f["nodeid"], str(f["node"])) for f in facts.values()})
    per_node: dict[int, int] = {}
    for f in facts.values():
        per_node[f["nodeid"]] = per_node.get(f["nodeid"], 0) + 1
    master_addr = str(descriptions[by_rank[0]]["addr"])
    infos = tuple(
        RankInfo(
            engine_id=int(eid),
            rank=int(facts[eid]["procid"]),
            world_size=len(by_rank),
            local_rank=int(facts[eid]["localid"]),
            local_world_size=per_node[facts[eid]["nodeid"]],
            node_rank=int(facts[eid]["nodeid"]),
            host=str(facts[eid]["node"]),
            addr=str(descriptions[eid]["addr"]),
            pid=int(descriptions[eid]["pid"]),
            gpus=int(descriptions[eid].get("gpus", 0)),
            master_addr=master_addr,
        )
        for eid in by_rank
    )
    return RankMap(ranks=infos, hosts=tuple(node for _, node in nodes))
