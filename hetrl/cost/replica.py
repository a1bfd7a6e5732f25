"""The hardware a replica runs on: per stage its slowest device, its TP group's links, and the
point-to-point links between consecutive stages. A tensor-parallel group runs at its slowest
member; a stage boundary at its slowest pair of ranks."""

from __future__ import annotations

from dataclasses import dataclass

from hetrl.cost.primitives import GroupLinks, group_links
from hetrl.spec.cluster import ClusterSpec


@dataclass(frozen=True)
class StageHW:
    """``flops`` peak FLOP/s, ``hbm_Bps`` bytes/s and ``memory_bytes`` of the stage's slowest
    device, ``gpu`` its type name (for efficiency factors), ``tp`` its TP group's links."""

    gpu: str
    flops: float
    hbm_Bps: float
    memory_bytes: float
    tp: GroupLinks


@dataclass(frozen=True)
class ReplicaHW:
    stages: tuple[StageHW, ...]
    boundaries: tuple[tuple[float, float], ...]  # (latency s, bandwidth B/s) stage j -> j+1

    def __hash__(self) -> int:  # hashed in every cache key: compute once
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.stages, self.boundaries))
            object.__setattr__(self, "_hash", h)
        return h


def replica_hw(cluster: ClusterSpec, replica: tuple[tuple[int, ...], ...]) -> ReplicaHW:
    """The replica's hardware (memoised per cluster: a pure function of the device grid)."""
    cache = cluster.topology.memo.setdefault("replica_hw", {})
    out = cache.get(replica)
    if out is None:
        out = _replica_hw(cluster, replica)
        cache[replica] = out
    return out


def _replica_hw(cluster: ClusterSpec, replica: tuple[tuple[int, ...], ...]) -> ReplicaHW:
    topo = cluster.topology
    devices = cluster.devices
    flops, hbm, mem = topo.lists["flops"], topo.lists["hbm_Bps"], topo.lists["memory_bytes"]
    lat, bw = topo.latency_rows, topo.bandwidth_rows
    stages = []
    for stage in replica:
        slow_flops = min(stage, key=lambda d: (flops[d], d))
        stages.append(StageHW(
            gpu=devices[slow_flops].gpu.name,
            flops=flops[slow_flops],
            hbm_Bps=min(hbm[d] for d in stage),
            memory_bytes=min(mem[d] for d in stage),
            tp=group_links(cluster, tuple(stage)),
        ))
    boundaries = []
    for a, b in zip(replica, replica[1:], strict=False):
        boundaries.append((
            max(lat[x][y] for x, y in zip(a, b, strict=True)),
            min(bw[x][y] for x, y in zip(a, b, strict=True)),
        ))
    return ReplicaHW(tuple(stages), tuple(boundaries))
