"""The transfers' formulas over explicit inputs (docs/cost-model.md, "Rollout data transfer",
"Weight sync", "The rollout engine as configured"): rollout data from the generation replicas
to each inference and training replica (by its links and, where region pairs are capped, by
their aggregates), the weight sync's per-call overhead and the co-located engine's switch, and
the link tables they read (memoised per cluster: pure functions of its topology). No memo tables
of a cost model here: :class:`~hetrl.cost.model_transfers.TransferTerms` looks them up and
stores what these return."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hetrl.cost.flops import StageShape
from hetrl.cost.kernels import dp_link_table, fan_in_link_facts
from hetrl.cost.memo import topology_memoised
from hetrl.cost.params import CostParams
from hetrl.cost.primitives import GroupLinks, links_from_row
from hetrl.cost.rollout import switch_seconds, sync_call_seconds
from hetrl.plan import Grid
from hetrl.spec.cluster import ClusterSpec, Topology

#: Bytes per token moved from generation to an inference task (token ids, int32) and to a
#: training task (ids + old log-probs, reference log-probs, advantages, returns: 4 x fp32).
DATA_BYTES_PER_TOKEN = {"inference": 4.0, "training": 20.0}


def fan_in_seconds(links: Sequence[tuple[float, float] | None], data_shares: Sequence[float],
                   samples: int, seq_mean: float, bytes_per_token: float,
                   link_efficiency: float) -> float:
    """Seconds until the slowest replica of a consumer has its share of the rollout: per
    replica its link from the generation replicas (``links``: slowest latency in s, narrowest
    bandwidth in bytes/s, None if it has no other source, :func:`fan_in_links`) carrying
    ``samples x share x seq_mean x bytes_per_token`` bytes at ``link_efficiency``."""
    worst = 0.0
    for share, link in zip(data_shares, links, strict=True):
        if link is not None:
            t = link[0] + samples * share * seq_mean * bytes_per_token / (link[1] * link_efficiency)
            if t > worst:
                worst = t
    return worst


def pair_bound_seconds(topology: Topology, caps: np.ndarray, src_shares: Sequence[float],
                       src: Sequence[int], dst_shares: Sequence[float], dst: Sequence[int],
                       nbytes: float) -> float:
    """The rollout data's bound by the region pairs' aggregates (seconds): generation replica g
    sends consumer replica r the overlap of their runs of the batch (``nbytes`` in all, from
    ``src[g]`` to ``dst[r]``, as :func:`hetrl.cost.flows.rollout_flows` counts), and every capped
    pair (``caps``: bytes/s per pair, :func:`hetrl.cost.sync.pair_factors`) carries the bytes of
    the flows routed over it (each direction)."""
    load = np.zeros(caps.size)
    lo_g = 0.0
    for g_share, a in zip(src_shares, src, strict=True):
        hi_g, lo_r = lo_g + g_share, 0.0
        for r_share, b in zip(dst_shares, dst, strict=True):
            hi_r = lo_r + r_share
            frac = min(hi_g, hi_r) - max(lo_g, lo_r)
            if frac > 0:
                for r in topology.pairs_between(a, b):
                    load[r] += frac * nbytes
            lo_r = hi_r
        lo_g = hi_g
    return float((load / caps).max()) if caps.size else 0.0


def sync_overhead_seconds(gen_shapes: tuple[StageShape, ...], params: CostParams, data_s: float,
                          gen_task: str, devices: dict[str, frozenset[int]], sync_mode: bool,
                          sleep_level: int, cuda_graphs: bool = True) -> tuple[float, float]:
    """(the weight sync's NCCL call overhead, the co-located rollout engine's sleep and wake)
    seconds per iteration (:mod:`hetrl.cost.rollout`): calls when weights move (``data_s``, the
    sync's seconds, > 0); a switch in sync mode when another task uses some of the GPUs of the
    engine (task ``gen_task``, stages ``gen_shapes``; ``devices``: each task's GPUs), at its
    ``sleep_level`` (level 0, a cold restart, captures the CUDA graphs again if
    ``cuda_graphs``)."""
    calls_s = sync_call_seconds(gen_shapes, params) if data_s > 0 else 0.0
    if sync_mode:
        mine = devices[gen_task]
        if any(t != gen_task and not d.isdisjoint(mine) for t, d in devices.items()):
            return calls_s, switch_seconds(max(s.weight_bytes for s in gen_shapes), params,
                                           sleep_level, cuda_graphs)
    return calls_s, 0.0


def dp_links(cluster: ClusterSpec, grid: Grid, stage_bytes: tuple[float, ...]
             ) -> list[tuple[int, GroupLinks]]:
    """Per DP group of a (dp, pp, tp) device grid (stage-major, then tp rank) its stage and
    links, a node's uplink shared by every group whose ring leaves the node (all reduce at
    once), each getting a share in proportion to its bytes (``stage_bytes``, any unit, per
    stage): the uplink stays busy until the last ring ends, so the largest ring ends at (all
    groups' bytes) / uplink, as under the simulator's max-min sharing where small rings finish
    first and free their share. See :func:`hetrl.cost.kernels.dp_link_table`."""
    topo = cluster.topology
    table = dp_link_table(np.array(grid, dtype=np.int64), np.array(stage_bytes, dtype=float),
                          topo.latency_s, topo.bandwidth_Bps, topo.node_of, topo.uplink_Bps)
    tp = len(grid[0][0])
    return [(i // tp, links_from_row(row)) for i, row in enumerate(table)]


def fan_in_links(cluster: ClusterSpec, src: tuple[int, ...],
                 dst: tuple[int, ...]) -> list[tuple[float, float] | None]:
    """Per device of ``dst``: the slowest latency (s) and narrowest bandwidth (bytes/s) from the
    devices of ``src`` other than itself (None if there are none). Memoised per cluster."""
    def compute() -> list[tuple[float, float] | None]:
        topo = cluster.topology
        lat, bw, found = fan_in_link_facts(np.array(src, dtype=np.int64),
                                           np.array(dst, dtype=np.int64), topo.latency_s,
                                           topo.bandwidth_Bps).tolist()
        return [(a, b) if f else None for a, b, f in zip(lat, bw, found, strict=True)]
    return topology_memoised(cluster, "fan_in", (src, dst), compute)
