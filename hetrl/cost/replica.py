"""The hardware a replica runs on: per stage its slowest device, its TP group's links, and the
point-to-point links between consecutive stages. A tensor-parallel group runs at its slowest
member; a stage boundary at its slowest pair of ranks."""

from __future__ import annotations

from dataclasses import dataclass

from hetrl.cost.primitives import GroupLinks, group_links, symmetric_memo
from hetrl.spec.cluster import ClusterSpec


@dataclass(frozen=True)
class StageHW:
    """``flops`` peak FLOP/s, ``hbm_Bps`` bytes/s and ``memory_bytes`` of the stage's slowest
    device, ``gpu`` its type name (for efficiency factors), ``tp`` its TP group's links,
    ``fp8_flops`` the smallest FP8 peak of its devices (FLOP/s; 0 if one has no FP8 units)."""

    gpu: str
    flops: float
    hbm_Bps: float
    memory_bytes: float
    tp: GroupLinks
    fp8_flops: float = 0.0


@dataclass(frozen=True)
class ReplicaHW:
    stages: tuple[StageHW, ...]
    #: stage j -> j+1: (latency s, bandwidth B/s for the whole boundary message, all tp ranks'
    #: slices in parallel)
    boundaries: tuple[tuple[float, float], ...]

    def __hash__(self) -> int:  # hashed in every cache key: compute once
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.stages, self.boundaries))
            object.__setattr__(self, "_hash", h)
        return h


def replica_hw(cluster: ClusterSpec, replica: tuple[tuple[int, ...], ...]) -> ReplicaHW:
    """The replica's hardware (memoised per cluster: a pure function of the device grid, the
    same for device grids renamed within nodes of interchangeable devices)."""
    return symmetric_memo(cluster, "replica_hw", (replica,), _replica_hw)


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
            fp8_flops=min(devices[d].gpu.fp8_flops for d in stage),
        ))
    boundaries = []
    node_of = topo.node_of
    for a, b in zip(replica, replica[1:], strict=False):
        pairs = list(zip(a, b, strict=True))
        # The tp ranks send their slices in parallel: together at most tp x the slowest flow,
        # and at most what the node uplinks they cross can carry.
        total = len(pairs) * min(bw[x][y] for x, y in pairs)
        crossing = [(int(node_of[x]), int(node_of[y])) for x, y in pairs if node_of[x] != node_of[y]]
        for na, nb in set(crossing):
            flows = crossing.count((na, nb))
            share = min(topo.uplink_Bps[na], topo.uplink_Bps[nb]) / flows
            total = min(total, len(pairs) * share)
        boundaries.append((max(lat[x][y] for x, y in pairs), float(total)))
    return ReplicaHW(tuple(stages), tuple(boundaries))
