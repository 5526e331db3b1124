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
    hostname: str = ""  # what the host calls itself (cloned hosts may share it)

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

    def has_engine(self, engine_id: int) -> bool:
        return any(info.engine_id == engine_id for info in self.ranks)

    def __getitem__(self, rank: int) -> RankInfo:
        return self.ranks[rank]

    def __len__(self) -> int:
        return len(self.ranks)

    def table(self) -> str:
        """A fixed-width table for notebooks and ``course doctor``."""
        head = (f"{'rank':>4} {'engine':>6} {'host':<16} {'address':<15} {'node':>4} "
                f"{'local':>5} {'gpus':>4} {'pid':>8}")
        rows = [
            f"{r.rank:>4} {r.engine_id:>6} {r.host[:16]:<16} {r.addr[:15]:<15} {r.node_rank:>4} "
            f"{r.local_rank:>5} {r.gpus:>4} {r.pid:>8}"
            for r in self.ranks
        ]
        return "\n".join([head, *rows])

    def to_dicts(self) -> list[dict[str, Any]]:
        return [asdict(r) for r in self.ranks]


def host_key(description: Mapping[str, Any], local: bool = False) -> str:
    """Which host an engine is on, for the rank map.

    The profile's host entry when the launcher told the engine (``node``: SSH profiles set
    ``$COURSE_NODE`` per host), else the host name, plus the address on multi-host profiles:
    two cloned hosts (or network namespaces) share a host name but not an address.
    """
    node = description.get("node")
    if node:
        return str(node)
    if local:
        return str(description["host"])
    return f"{description['host']}@{description['addr']}"


def _is_loopback(addr: str) -> bool:
    return addr.startswith("127.") or addr in ("::1", "localhost")


def build_rank_map(
    descriptions: Mapping[int, Mapping[str, Any]],
    host_order: Sequence[str] | None = None,
    local: bool = False,
) -> RankMap:
    """Assign ranks from engine self-descriptions.

    ``descriptions`` maps engine id -> ``{"host", "addr", "pid", "gpus"}`` and, on SSH
    profiles, ``"node"`` (the profile's host entry; see :func:`host_key`). Hosts keep the order
    given in ``host_order`` (the profile's order, so rank 0 lands on the first host), then any
    others alphabetically; within a host, engines are ordered by engine id. ``node_rank`` is a
    host's place in that order. With ``local=True`` every rank is on this machine and the
    master address is the loopback address; otherwise it is rank 0's own address, which must
    not be loopback when ranks sit on more than one host.

    Engines that are the tasks of one Slurm step (each reports ``"slurm"``, see
    :func:`slurm_rank_map`) keep Slurm's numbering instead.
    """
    if not descriptions:
        raise ValueError("no engines to rank: the cluster has no registered engines")
    if slurm_step(descriptions):
        return slurm_rank_map(descriptions)
    keys = {e: host_key(d, local) for e, d in descriptions.items()}
    given = list(host_order or [])

    def place(eid: int) -> tuple[int, str]:
        d = descriptions[eid]
        names = (keys[eid], d.get("node"), d["host"], d.get("addr"))
        return next((i for i, h in enumerate(given) if h in names), len(given)), keys[eid]

    order = sorted({keys[e]: place(e) for e in descriptions}.items(), key=lambda kv: kv[1])
    order = [k for k, _ in order]
    host_index = {h: i for i, h in enumerate(order)}

    engines = sorted(descriptions, key=lambda e: (host_index[keys[e]], e))
    per_host: dict[str, list[int]] = {}
    for eid in engines:
        per_host.setdefault(keys[eid], []).append(eid)

    first = descriptions[engines[0]]
    master_addr = "127.0.0.1" if local else str(first["addr"])
    if not local and len(order) > 1 and _is_loopback(master_addr):
        raise ValueError(
            f"rank 0 ({order[0]}) reports the loopback address {master_addr}: the other hosts "
            "could not reach it. Its route towards controller_ip goes over loopback: set "
            "controller_ip to this machine's address on the link the hosts share")
    world = len(engines)
    infos = []
    for rank, eid in enumerate(engines):
        d = descriptions[eid]
        peers = per_host[keys[eid]]
        infos.append(
            RankInfo(
                engine_id=int(eid),
                rank=rank,
                world_size=world,
                local_rank=peers.index(eid),
                local_world_size=len(peers),
                node_rank=host_index[keys[eid]],
                host=str(d.get("node") or d["host"]),
                addr="127.0.0.1" if local else str(d["addr"]),
                pid=int(d["pid"]),
                gpus=int(d.get("gpus", 0)),
                master_addr=master_addr,
                hostname=str(d["host"]),
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
