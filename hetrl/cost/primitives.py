"""Hardware primitives: kernel, HBM, point-to-point and collective times (all in seconds).

Collectives over an arbitrary device set take the best of three algorithms, as NCCL picks:
- ring over the devices ordered by node: 2(n-1) steps for all-reduce, each step bounded by the
  ring's slowest link (latency and bandwidth) -- Patarasuk & Yuan 2009;
- tree (recursive halving/doubling): 2 log2(n) latency steps, 2x the bytes -- Thakur et al. 2005;
- hierarchical (when every node holds the same number g of the devices): reduce-scatter inside each
  node, all-reduce of a 1/g slice between the k nodes over g parallel flows, all-gather inside.
Latency is counted per step, so cross-region latency dominates small messages.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hetrl.spec.cluster import ClusterSpec


def matmul_time(flops: float, peak_flops: float, efficiency: float) -> float:
    """Time of a compute-bound kernel: FLOPs / (peak FLOP/s x efficiency)."""
    return flops / (peak_flops * efficiency)


def hbm_time(nbytes: float, hbm_Bps: float, efficiency: float) -> float:
    """Time to stream ``nbytes`` from device memory at ``efficiency`` x peak bandwidth."""
    return nbytes / (hbm_Bps * efficiency)


def p2p_time(nbytes: float, latency_s: float, bandwidth_Bps: float, efficiency: float) -> float:
    """One message over a path: latency + bytes / (bandwidth x efficiency)."""
    if nbytes <= 0:
        return 0.0
    return latency_s + nbytes / (bandwidth_Bps * efficiency)


@dataclass(frozen=True)
class GroupLinks:
    """Link facts of a device set for collectives.

    ``ring_latency_s``/``ring_Bps``: slowest latency / narrowest bandwidth on the node-ordered
    ring. ``nodes``/``per_node``: node count and devices per node (0 if uneven); ``intra_*``: the
    slowest in-node ring; ``inter_*``: the slowest ring between node representatives.
    """

    n: int
    ring_latency_s: float
    ring_Bps: float
    nodes: int
    per_node: int
    intra_latency_s: float
    intra_Bps: float
    inter_latency_s: float
    inter_Bps: float


def _ring(lat: list[list[float]], bw: list[list[float]], order: list[int]) -> tuple[float, float]:
    """Slowest latency and narrowest bandwidth on the ring through ``order``."""
    if len(order) < 2:
        return 0.0, math.inf
    pairs = list(zip(order, order[1:] + order[:1], strict=True))
    return max(lat[a][b] for a, b in pairs), min(bw[a][b] for a, b in pairs)


def group_links(cluster: ClusterSpec, devices: tuple[int, ...]) -> GroupLinks:
    """Collective link facts of ``devices`` (order-independent: the ring goes node by node).
    Memoised per cluster."""
    return cluster.topology.memoised("group_links", devices,
                                     lambda: _group_links(cluster, devices))


def _group_links(cluster: ClusterSpec, devices: tuple[int, ...]) -> GroupLinks:
    topo = cluster.topology
    lat, bw, node_of = topo.latency_rows, topo.bandwidth_rows, topo.node_of
    order = sorted(devices, key=lambda d: (int(node_of[d]), d))
    ring_lat, ring_bw = _ring(lat, bw, order)
    by_node: dict[int, list[int]] = {}
    for d in order:
        by_node.setdefault(int(node_of[d]), []).append(d)
    sizes = {len(v) for v in by_node.values()}
    per_node = sizes.pop() if len(sizes) == 1 else 0
    intra_lat, intra_bw = 0.0, math.inf
    for members in by_node.values():
        la, ba = _ring(lat, bw, members)
        intra_lat, intra_bw = max(intra_lat, la), min(intra_bw, ba)
    reps = [members[0] for members in by_node.values()]
    inter_lat, inter_bw = _ring(lat, bw, reps)
    return GroupLinks(len(devices), ring_lat, ring_bw, len(by_node), per_node,
                      intra_lat, intra_bw, inter_lat, inter_bw)


def _log2(n: int) -> int:
    return max(1, math.ceil(math.log2(n)))


def all_reduce_time(nbytes: float, g: GroupLinks, efficiency: float) -> float:
    """All-reduce of ``nbytes`` per device over the group (best of ring, tree, hierarchical)."""
    n = g.n
    if n <= 1 or nbytes <= 0:
        return 0.0
    bw = g.ring_Bps * efficiency
    ring = 2 * (n - 1) * g.ring_latency_s + 2 * (n - 1) / n * nbytes / bw
    tree = 2 * _log2(n) * g.ring_latency_s + 2 * nbytes / bw
    best = min(ring, tree)
    if g.nodes > 1 and g.per_node >= 1:
        k, m = g.nodes, g.per_node
        intra = 0.0
        if m > 1:
            ibw = g.intra_Bps * efficiency
            intra = 2 * ((m - 1) * g.intra_latency_s + (m - 1) / m * nbytes / ibw)
        slice_bytes = nbytes / m  # each local rank carries its slice on its own flow
        xbw = g.inter_Bps * efficiency
        inter = min(2 * (k - 1) * g.inter_latency_s + 2 * (k - 1) / k * slice_bytes / xbw,
                    2 * _log2(k) * g.inter_latency_s + 2 * slice_bytes / xbw)
        best = min(best, intra + inter)
    return best


def all_gather_time(nbytes: float, g: GroupLinks, efficiency: float) -> float:
    """All-gather where the result is ``nbytes`` per device (each contributes nbytes / n).
    Reduce-scatter of ``nbytes`` costs the same."""
    n = g.n
    if n <= 1 or nbytes <= 0:
        return 0.0
    bw = g.ring_Bps * efficiency
    ring = (n - 1) * g.ring_latency_s + (n - 1) / n * nbytes / bw
    tree = _log2(n) * g.ring_latency_s + nbytes / bw
    return min(ring, tree)


reduce_scatter_time = all_gather_time


def broadcast_time(nbytes: float, g: GroupLinks, efficiency: float) -> float:
    """Broadcast of ``nbytes`` from one device: pipelined chain or binary tree."""
    n = g.n
    if n <= 1 or nbytes <= 0:
        return 0.0
    bw = g.ring_Bps * efficiency
    chain = (n - 1) * g.ring_latency_s + nbytes / bw
    tree = _log2(n) * (g.ring_latency_s + nbytes / bw)
    return min(chain, tree)


def all_reduce_time_vec(nbytes: np.ndarray, g: GroupLinks, efficiency: float) -> np.ndarray:
    """:func:`all_reduce_time` element-wise over an array of message sizes (bytes)."""
    if g.n <= 1:
        return np.zeros_like(nbytes, dtype=float)
    n = g.n
    bw = g.ring_Bps * efficiency
    ring = 2 * (n - 1) * g.ring_latency_s + (2 * (n - 1) / n / bw) * nbytes
    tree = 2 * _log2(n) * g.ring_latency_s + (2 / bw) * nbytes
    best = np.minimum(ring, tree)
    if g.nodes > 1 and g.per_node >= 1:
        k, m = g.nodes, g.per_node
        intra = 0.0
        if m > 1:
            ibw = g.intra_Bps * efficiency
            intra = 2 * ((m - 1) * g.intra_latency_s + ((m - 1) / m / ibw) * nbytes)
        xbw = g.inter_Bps * efficiency
        inter = np.minimum(2 * (k - 1) * g.inter_latency_s + (2 * (k - 1) / k / m / xbw) * nbytes,
                           2 * _log2(k) * g.inter_latency_s + (2 / m / xbw) * nbytes)
        best = np.minimum(best, intra + inter)
    return np.where(nbytes > 0, best, 0.0)
