"""Hardware primitives: kernel, HBM, point-to-point and collective times (all in seconds).

Collectives over an arbitrary device set take the best of three algorithms, as NCCL picks:
- ring over the devices ordered by node: 2(n-1) steps for all-reduce, each step bounded by the
  ring's slowest link (latency and bandwidth) -- Patarasuk & Yuan 2009;
- tree (recursive halving/doubling): 2 log2(n) latency steps, 2x the bytes -- Thakur et al. 2005;
- hierarchical (when every node holds the same number g of the devices): reduce-scatter inside each
  node, all-reduce of a 1/g slice between the k nodes over g parallel flows, all-gather inside.
Latency is counted per step, so cross-region latency dominates small messages. The ring crosses
each node boundary with one flow; the tree's and the hierarchical scheme's inter-node steps send
from every device of a node at once, so those flows share the node's uplink (NIC).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from hetrl.cost.kernels import (
    all_gather_seconds,
    all_reduce_seconds,
    ceil_log2,
    group_link_facts,
)
from hetrl.cost.memo import topology_memoised, topology_table
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
    ``cross_Bps``: one flow's bandwidth when every device of the group sends across nodes at once
    (the tree's and the hierarchical scheme's inter-node steps): its node's uplink shared by the
    group's devices on the node, the smallest over the nodes (bytes/s; inf within one node).
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
    cross_Bps: float = math.inf


def group_links(cluster: ClusterSpec, devices: tuple[int, ...]) -> GroupLinks:
    """Collective link facts of ``devices`` (order-independent: the ring goes node by node).
    Memoised per cluster (and per class of symmetric device sets, see :func:`symmetric_memo`)."""
    return symmetric_memo(cluster, "group_links", (devices,), _group_links)


def symmetric_memo(cluster: ClusterSpec, kind: str, devices: tuple, compute: Any,
                   extra: tuple = ()) -> Any:
    """``compute(cluster, *devices, *extra)`` memoised per cluster, where ``devices`` is a tuple
    of (nested tuples of) device ids, on the key and on its canonical form under the cluster's
    symmetry: where every node's devices are interchangeable (same GPU, same links to every other
    device), renaming devices within their nodes is an automorphism of the topology, so a pure
    function of the topology and the device ids gives the same answer for ``devices`` and for
    ``devices`` renamed, in order of first appearance, to each node's lowest ids. The answer must
    hold no device ids (link and hardware facts only)."""
    cache = topology_table(cluster, kind)
    key = (devices, extra)
    out = cache.get(key)
    if out is None:
        sym = node_symmetry(cluster)
        canon = devices if sym is None else _canonical(devices, sym[0], sym[1])
        out = cache.get((canon, extra))
        if out is None:
            out = cache.put((canon, extra), compute(cluster, *canon, *extra))
        cache.put(key, out)
    return out


def _canonical(devices: tuple, node_of: list[int], members: list[list[int]]) -> tuple:
    """``devices`` renamed as :func:`_rename` does, quicker for the two keys in use: one device
    set ``(ids,)`` or one device grid ``((ids, ...),)``, no device twice (each device then
    takes the next unused device of its node)."""
    if len(devices) == 1 and type(devices[0]) is tuple and devices[0]:
        rows = devices[0]
        grid = type(rows[0]) is tuple
        if not grid:
            rows = (rows,)
        if len(set().union(*rows)) == sum(map(len, rows)):  # else a device twice: one name
            used = [0] * len(members)
            out = []
            for row in rows:
                new = []
                for d in row:
                    node = node_of[d]
                    new.append(members[node][used[node]])
                    used[node] += 1
                out.append(tuple(new))
            return (tuple(out),) if grid else (out[0],)
    return _rename(devices, node_of, members, {}, {})


def _rename(devices: tuple, node_of: list[int], members: list[list[int]], names: dict[int, int],
            used: dict[int, int]) -> tuple:
    """``devices`` (nested tuples of ids) with each device renamed to the next unused device of
    its node (one renaming ``names`` for the whole key, so equal devices stay equal)."""
    out = []
    for x in devices:
        if type(x) is tuple:
            out.append(_rename(x, node_of, members, names, used))
            continue
        name = names.get(x)
        if name is None:
            node = node_of[x]
            i = used.get(node, 0)
            used[node] = i + 1
            name = names[x] = members[node][i]
        out.append(name)
    return tuple(out)


def node_symmetry(cluster: ClusterSpec) -> tuple[list[int], list[list[int]]] | None:
    """(node of each device, each node's devices in id order) if every node's devices are
    interchangeable and no two GPU types share a peak FLOP rate (the hardware facts break ties
    between a stage's slowest devices by id), else None. Memoised per cluster."""
    memo = topology_table(cluster, "symmetry")
    if "value" not in memo:
        memo["value"] = _find_symmetry(cluster)
    return memo["value"]


def _find_symmetry(cluster: ClusterSpec) -> tuple[list[int], list[list[int]]] | None:
    topo = cluster.topology
    node_of = [int(n) for n in topo.node_of]
    members: list[list[int]] = [[] for _ in range(int(max(node_of)) + 1)]
    for d, n in enumerate(node_of):
        members[n].append(d)
    flops_of: dict[float, str] = {}
    for d, dev in enumerate(cluster.devices):
        if flops_of.setdefault(float(topo.flops[d]), dev.gpu.name) != dev.gpu.name:
            return None
    per_device = [topo.flops, topo.hbm_Bps, topo.memory_bytes]
    mats = [topo.latency_s, topo.bandwidth_Bps]
    idx = np.arange(len(node_of))
    for devs in members:
        r = devs[0] if devs else 0
        for a in devs[1:]:
            if cluster.devices[a].gpu.name != cluster.devices[r].gpu.name:
                return None
            perm = idx.copy()
            perm[a], perm[r] = r, a
            if any(v[a] != v[r] for v in per_device):
                return None
            if any(not np.array_equal(m[np.ix_(perm, perm)], m) for m in mats):
                return None
    return node_of, members


def _group_links(cluster: ClusterSpec, devices: tuple[int, ...]) -> GroupLinks:
    topo = cluster.topology
    row = group_link_facts(np.array(devices, dtype=np.int64), topo.latency_s,
                           topo.bandwidth_Bps, topo.node_of, topo.uplink_Bps)
    return links_from_row(row)


def links_from_row(row: np.ndarray) -> GroupLinks:
    """A :class:`GroupLinks` from a row of link facts (:data:`hetrl.cost.kernels.LINK_FACTS`)."""
    n, ring_lat, ring_bw, nodes, per_node, *rest = row.tolist()
    return GroupLinks(int(n), ring_lat, ring_bw, int(nodes), int(per_node), *rest)


def device_efficiency(cluster: ClusterSpec, params: Any, kind: str) -> np.ndarray:
    """Per device, the efficiency factor (achieved / peak) of kernel ``kind`` on its GPU type
    under ``params`` (a read-only array; memoised per cluster)."""
    def compute() -> np.ndarray:
        out = np.array([params.efficiency(d.gpu.name, kind) for d in cluster.devices])
        out.setflags(write=False)
        return out
    return topology_memoised(cluster, "device_efficiency", (params, kind), compute)


def all_reduce_time(nbytes: float, g: GroupLinks, efficiency: float) -> float:
    """All-reduce of ``nbytes`` per device over the group (best of ring, tree, hierarchical:
    :func:`hetrl.cost.kernels.all_reduce_seconds`)."""
    return float(all_reduce_seconds(g.n, g.ring_latency_s, g.ring_Bps, g.nodes, g.per_node,
                                    g.intra_latency_s, g.intra_Bps, g.inter_latency_s,
                                    g.inter_Bps, g.cross_Bps, nbytes, efficiency))


def all_gather_time(nbytes: float, g: GroupLinks, efficiency: float) -> float:
    """All-gather where the result is ``nbytes`` per device (each contributes nbytes / n).
    Reduce-scatter of ``nbytes`` costs the same."""
    return float(all_gather_seconds(g.n, g.ring_latency_s, g.ring_Bps, g.cross_Bps, nbytes,
                                    efficiency))


reduce_scatter_time = all_gather_time


def broadcast_time(nbytes: float, g: GroupLinks, efficiency: float) -> float:
    """Broadcast of ``nbytes`` from one device: pipelined chain or binary tree."""
    n = g.n
    if n <= 1 or nbytes <= 0:
        return 0.0
    bw = g.ring_Bps * efficiency
    chain = (n - 1) * g.ring_latency_s + nbytes / bw
    tree = ceil_log2(n) * (g.ring_latency_s + nbytes / bw)
    return min(chain, tree)


def all_reduce_time_vec(nbytes: np.ndarray, g: GroupLinks, efficiency: float) -> np.ndarray:
    """:func:`all_reduce_time` element-wise over an array of message sizes (bytes)."""
    if g.n <= 1:
        return np.zeros_like(nbytes, dtype=float)
    n = g.n
    bw = g.ring_Bps * efficiency
    ring = 2 * (n - 1) * g.ring_latency_s + (2 * (n - 1) / n / bw) * nbytes
    tree = 2 * ceil_log2(n) * g.ring_latency_s + (
        2 / (min(g.ring_Bps, g.cross_Bps) * efficiency)) * nbytes
    best = np.minimum(ring, tree)
    if g.nodes > 1 and g.per_node >= 1:
        k, m = g.nodes, g.per_node
        intra = 0.0
        if m > 1:
            ibw = g.intra_Bps * efficiency
            intra = 2 * ((m - 1) * g.intra_latency_s + ((m - 1) / m / ibw) * nbytes)
        xbw = min(g.inter_Bps, g.cross_Bps) * efficiency
        inter = np.minimum(2 * (k - 1) * g.inter_latency_s + (2 * (k - 1) / k / m / xbw) * nbytes,
                           2 * ceil_log2(k) * g.inter_latency_s + (2 / m / xbw) * nbytes)
        best = np.minimum(best, intra + inter)
    return np.where(nbytes > 0, best, 0.0)


def all_reduce_pieces(g: GroupLinks, efficiency: float) -> list[tuple[float, float]]:
    """:func:`all_reduce_time` as affine pieces: for ``nbytes`` > 0 the time is the smallest
    ``a + b * nbytes`` over the (a, b) returned (no pieces: a single device, time 0)."""
    n = g.n
    if n <= 1:
        return []
    bw = g.ring_Bps * efficiency
    out = [(2 * (n - 1) * g.ring_latency_s, 2 * (n - 1) / n / bw),
           (2 * ceil_log2(n) * g.ring_latency_s, 2 / (min(g.ring_Bps, g.cross_Bps) * efficiency))]
    if g.nodes > 1 and g.per_node >= 1:
        k, m = g.nodes, g.per_node
        ia, ib = 0.0, 0.0
        if m > 1:
            ibw = g.intra_Bps * efficiency
            ia, ib = 2 * (m - 1) * g.intra_latency_s, 2 * (m - 1) / m / ibw
        xbw = min(g.inter_Bps, g.cross_Bps) * efficiency
        out.append((ia + 2 * (k - 1) * g.inter_latency_s, ib + 2 * (k - 1) / k / m / xbw))
        out.append((ia + 2 * ceil_log2(k) * g.inter_latency_s, ib + 2 / m / xbw))
    return out
