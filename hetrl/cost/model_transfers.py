"""The transfers of :class:`~hetrl.cost.model.CostModel`: rollout data from generation to each
inference and training replica, and the weight sync from training to generation with its
per-call overhead and the co-located engine's switch (docs/cost-model.md, "Rollout data
transfer", "Weight sync", "The rollout engine as configured"). A mixin, and the link tables it
reads."""

from __future__ import annotations

import numpy as np

from hetrl.cost.kernels import dp_link_table, fan_in_link_facts
from hetrl.cost.memo import topology_memoised
from hetrl.cost.primitives import GroupLinks, links_from_row
from hetrl.cost.rollout import switch_seconds, sync_call_seconds
from hetrl.cost.sync import pair_factors, weight_sync_time
from hetrl.plan import Grid, TaskPlacement
from hetrl.spec.cluster import ClusterSpec

#: Bytes per token moved from generation to an inference task (token ids, int32) and to a
#: training task (ids + old log-probs, reference log-probs, advantages, returns: 4 x fp32).
DATA_BYTES_PER_TOKEN = {"inference": 4.0, "training": 20.0}


class TransferTerms:
    """Rollout data and the weight sync (mixed into CostModel)."""

    def rollout_transfer_seconds(self, gen: TaskPlacement, p: TaskPlacement) -> float:
        """Seconds of moving the rollout data from the generation replicas of ``gen`` to the
        replicas of the inference or training placement ``p`` (the slowest replica's, bounded
        by capped region pairs): the ``data`` part of ``p``'s task."""
        return self._data_transfer(gen, p, self._info[p.task][0])

    def _data_transfer(self, gen: TaskPlacement, p: TaskPlacement, kind: str) -> float:
        """Rollout data from the generation replicas to each replica of ``p`` (seconds). Only
        :meth:`_forward_task` asks, once per (``p``, ``gen``), and memoises its answer."""
        # tasks co-located on one grid with the same shares and kind (three inference, two
        # training tasks) come one after another: compare with the previous one's inputs
        # (cheaper than hashing the grid and shares into a shared key)
        last = self._last_transfer
        if last is not None and last[0] is gen and last[1] == kind and last[2] == p.devices \
                and last[3] == p.data_shares:
            return last[4]
        src = self._tasklevel.get(("firsts", gen))  # each replica's first device
        if src is None:
            src = self._tasklevel[("firsts", gen)] = tuple([r[0][0] for r in gen.devices])
        dst = tuple([r[0][0] for r in p.devices])
        links = fan_in_links(self.cluster, src, dst)
        worst = 0.0
        eff = self.params.efficiency(self.cluster.devices[dst[0]].gpu.name, "link")
        samples, seq_mean, per_token = self.workload.samples, self.L.seq_mean, \
            DATA_BYTES_PER_TOKEN[kind]
        for share, link in zip(p.data_shares, links, strict=True):
            if link is not None:
                t = link[0] + samples * share * seq_mean * per_token / (link[1] * eff)
                if t > worst:
                    worst = t
        if self.cluster.topology.has_aggregate:
            worst = max(worst, self._pair_bound(gen, p, src, dst, samples * seq_mean * per_token))
        self._last_transfer = (gen, kind, p.devices, p.data_shares, worst)
        return worst

    def _pair_bound(self, gen: TaskPlacement, p: TaskPlacement, src: tuple[int, ...],
                    dst: tuple[int, ...], nbytes: float) -> float:
        """The rollout data's bound by the region pairs' aggregates (seconds): generation
        replica g sends replica r of ``p`` the overlap of their runs of the batch (``nbytes``
        in all, from ``src[g]`` to ``dst[r]``, as :func:`hetrl.cost.flows.rollout_flows`
        counts), and every capped pair carries the bytes of the flows routed over it (each
        direction)."""
        topo = self.cluster.topology
        caps = pair_factors(self.cluster, self.params)[2]
        load = np.zeros(caps.size)
        lo_g = 0.0
        for g_share, a in zip(gen.data_shares, src, strict=True):
            hi_g, lo_r = lo_g + g_share, 0.0
            for r_share, b in zip(p.data_shares, dst, strict=True):
                hi_r = lo_r + r_share
                frac = min(hi_g, hi_r) - max(lo_g, lo_r)
                if frac > 0:
                    for r in topo.pairs_between(a, b):
                        load[r] += frac * nbytes
                lo_r = hi_r
            lo_g = hi_g
        return float((load / caps).max()) if caps.size else 0.0

    def weight_sync_seconds(self, gen: TaskPlacement, train: TaskPlacement,
                            relay: bool = False) -> float:
        """Seconds of moving the trained weights of ``train`` into the engine of ``gen`` (the
        bytes; the calls' overhead and the engine switch: :meth:`sync_overheads`); ``relay``:
        one copy per remote region and a local fan-out (``Plan.sync_relay``)."""
        return self._weight_sync(gen, train, relay)

    def _weight_sync(self, gen: TaskPlacement, train: TaskPlacement, relay: bool = False) -> float:
        """Seconds of the weight sync: a pure function of the two device grids and layer splits
        (not of the data shares), memoised per cluster. From an FSDP trainer the shards are
        first all-gathered over its group (as verl's state-dict gather does); then, like a
        Megatron replica's, each rank's full copy is a source, never shared in place."""
        key = (gen.devices, gen.layers_per_stage, train.devices, train.layers_per_stage,
               train.backend)
        if relay:
            key += (True,)
        out = self._sync.get(key)
        if out is None:
            shapes = self.shapes(gen.task, gen)
            fsdp = train.backend == "fsdp"
            shared = self.workload.mode == "sync" and not fsdp
            extra = (gen.layers_per_stage, train.layers_per_stage, shapes, self.params, shared)
            if relay:
                extra += (True,)
            out = topology_memoised(
                self.cluster, "weight_sync", (gen.devices, train.devices, extra),
                lambda: weight_sync_time(gen, shapes, train, self.cluster, self.params, shared,
                                         relay))
            if fsdp:
                out += self._fsdp_comm_and_optimizer(train, self.shapes(train.task, train))[0][1]
            self._sync[key] = out
        return out

    def sync_overheads(self, gen: TaskPlacement, data_s: float,
                       devices: dict[str, frozenset[int]]) -> tuple[float, float]:
        """(the weight sync's NCCL call overhead, the co-located rollout engine's sleep and
        wake) seconds per iteration (:mod:`hetrl.cost.rollout`): calls when weights move
        (``data_s`` > 0); a switch in sync mode when another task uses some of generation's
        GPUs (``devices``: each task's GPUs)."""
        shapes = self.shapes(gen.task, gen)
        calls_s = sync_call_seconds(shapes, self.params) if data_s > 0 else 0.0
        mine = devices[gen.task]
        shared = self.workload.mode == "sync" and any(
            t != gen.task and not d.isdisjoint(mine) for t, d in devices.items())
        switch_s = switch_seconds(max(s.weight_bytes for s in shapes), self.params,
                                  self.workload.gen_sleep_level) \
            if shared else 0.0
        return calls_s, switch_s


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
