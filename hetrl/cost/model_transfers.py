"""The transfers of :class:`~hetrl.cost.model.CostModel`: the memo tables around the formulas of
:mod:`hetrl.cost.transfers` (rollout data from generation to each inference and training
replica) and :mod:`hetrl.cost.sync` (the weight sync from training to generation, with its
per-call overhead and the co-located engine's switch; docs/cost-model.md, "Rollout data
transfer", "Weight sync", "The rollout engine as configured"). A mixin: :class:`TransferHost`
lists what it reads of its host."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from hetrl.cost.expert_parallel import expert_gather_seconds
from hetrl.cost.flops import StageShape
from hetrl.cost.lengths import LengthStats
from hetrl.cost.memo import topology_memoised
from hetrl.cost.params import CostParams
from hetrl.cost.sync import pair_factors, weight_sync_time, weights_shared_in_place
from hetrl.cost.transfers import (  # (re-exported: importers of this module's names)
    DATA_BYTES_PER_TOKEN,
    dp_links,
    fan_in_links,
    fan_in_seconds,
    pair_bound_seconds,
    sync_overhead_seconds,
)
from hetrl.plan import TaskPlacement
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.workload import WorkloadSpec

__all__ = ["DATA_BYTES_PER_TOKEN", "TransferHost", "TransferTerms", "dp_links", "fan_in_links"]


@runtime_checkable
class TransferHost(Protocol):
    """What :class:`TransferTerms` reads of the CostModel it is mixed into."""

    workload: WorkloadSpec
    cluster: ClusterSpec
    params: CostParams
    L: LengthStats
    #: per task: (kind, role, model copy name)
    _info: dict[str, tuple[str, str, str]]
    #: memo: task-level terms (each generation replica's first device)
    _tasklevel: dict
    #: memo: the weight sync's seconds per (grids, layer splits, backend, relay)
    _sync: dict
    #: (generation placement, kind, grid, data shares, seconds) of the last rollout transfer
    _last_transfer: tuple | None

    def shapes(self, task: str, p: TaskPlacement) -> tuple[StageShape, ...]: ...

    def _fsdp_comm_and_optimizer(self, p: TaskPlacement, shapes: tuple[StageShape, ...]
                                 ) -> tuple[tuple[float, float], float]: ...


class TransferTerms:
    """Rollout data and the weight sync (mixed into CostModel; host: :class:`TransferHost`)."""

    def rollout_transfer_seconds(self, gen: TaskPlacement, p: TaskPlacement) -> float:
        """Seconds of moving the rollout data from the generation replicas of ``gen`` to the
        replicas of the inference or training placement ``p`` (the slowest replica's, bounded
        by capped region pairs): the ``data`` part of ``p``'s task."""
        return self._data_transfer(gen, p, self._info[p.task][0])

    def _data_transfer(self, gen: TaskPlacement, p: TaskPlacement, kind: str) -> float:
        """:meth:`rollout_transfer_seconds` of ``p``, a task of ``kind``
        (:func:`~hetrl.cost.transfers.fan_in_seconds`,
        :func:`~hetrl.cost.transfers.pair_bound_seconds`). Only :meth:`_forward_task` asks, once
        per (``p``, ``gen``), and memoises its answer."""
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
        cluster = self.cluster
        samples, seq_mean, per_token = self.workload.samples, self.L.seq_mean, \
            DATA_BYTES_PER_TOKEN[kind]
        worst = fan_in_seconds(fan_in_links(cluster, src, dst), p.data_shares, samples,
                               seq_mean, per_token,
                               self.params.efficiency(cluster.devices[dst[0]].gpu.name, "link"))
        if cluster.topology.has_aggregate:
            caps = pair_factors(cluster, self.params)[2]
            worst = max(worst, pair_bound_seconds(cluster.topology, caps, gen.data_shares, src,
                                                  p.data_shares, dst,
                                                  samples * seq_mean * per_token))
        self._last_transfer = (gen, kind, p.devices, p.data_shares, worst)
        return worst

    def weight_sync_seconds(self, gen: TaskPlacement, train: TaskPlacement,
                            relay: bool = False) -> float:
        """Seconds of moving the trained weights of ``train`` into the engine of ``gen`` (the
        bytes; the calls' overhead and the engine switch: :meth:`sync_overheads`); ``relay``:
        one copy per remote region and a local fan-out (``Plan.sync_relay``)."""
        return self._weight_sync(gen, train, relay)

    def _weight_sync(self, gen: TaskPlacement, train: TaskPlacement, relay: bool = False) -> float:
        """Seconds of the weight sync (:func:`hetrl.cost.sync.weight_sync_time`): a pure function
        of the two device grids and layer splits (not of the data shares), memoised per cluster
        and in this cost model. From an FSDP trainer the shards are first all-gathered over its
        group (as verl's state-dict gather does); then, like a Megatron replica's, each rank's
        full copy is a source, never shared in place. A trainer with expert parallelism (either
        backend) then gathers each group's experts."""
        key = (gen.devices, gen.layers_per_stage, train.devices, train.layers_per_stage,
               train.backend, gen.ep, train.ep)
        if relay:
            key += (True,)
        out = self._sync.get(key)
        if out is None:
            shapes = self.shapes(gen.task, gen)
            fsdp = train.backend == "fsdp"
            shared = weights_shared_in_place(self.workload, train)
            extra = (gen.layers_per_stage, train.layers_per_stage, shapes, self.params, shared,
                     train.ep)
            if relay:
                extra += (True,)
            out = topology_memoised(
                self.cluster, "weight_sync", (gen.devices, train.devices, extra),
                lambda: weight_sync_time(gen, shapes, train, self.cluster, self.params, shared,
                                         relay))
            if fsdp:
                out += self._fsdp_comm_and_optimizer(train, self.shapes(train.task, train))[0][1]
            if train.ep > 1 and out > 0:  # the experts gathered before they are sent
                out += expert_gather_seconds(self.cluster, train, self.shapes(train.task, train),
                                             self.params)
            self._sync[key] = out
        return out

    def sync_overheads(self, gen: TaskPlacement, data_s: float,
                       devices: dict[str, frozenset[int]]) -> tuple[float, float]:
        """(the weight sync's NCCL call overhead, the co-located rollout engine's sleep and
        wake) seconds per iteration (:func:`~hetrl.cost.transfers.sync_overhead_seconds`):
        calls when weights move (``data_s`` > 0); a switch in sync mode when another task uses
        some of generation's GPUs (``devices``: each task's GPUs)."""
        wl = self.workload
        return sync_overhead_seconds(self.shapes(gen.task, gen), self.params, data_s, gen.task,
                                     devices, wl.mode == "sync", wl.gen_sleep_level,
                                     wl.gen_cuda_graphs)
