"""The memory terms of :class:`~hetrl.cost.model.CostModel`: the memo tables around the formulas
of :mod:`hetrl.cost.group_memory` (per-device bytes of each placement: weights, trained states,
working set, KV per sequence; each task group's need and the KV budget it leaves the rollout
engine, and the report of devices over their memory; docs/cost-model.md, "Memory"). A mixin:
:class:`MemoryHost` lists what it reads of its host."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from hetrl.cost.batching import Batching
from hetrl.cost.flops import StageShape
from hetrl.cost.group_memory import (  # (re-exported: the answers' data classes)
    GroupMemory,
    GroupResult,
    PlacementMemory,
    copy_names,
    generation_peak_bytes,
    group_layout,
    group_memory_of,
    group_rows,
    kv_pool_caps,
    placement_memory_of,
    plan_structure,
    replica_batch_inputs,
    slot_bytes,
)
from hetrl.cost.lengths import LengthStats
from hetrl.cost.params import CostParams
from hetrl.cost.result import TaskResult
from hetrl.plan import Plan, TaskPlacement
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.workload import WorkloadSpec

__all__ = ["GroupMemory", "GroupResult", "MemoryHost", "MemoryTerms", "PlacementMemory"]


@runtime_checkable
class MemoryHost(Protocol):
    """What :class:`MemoryTerms` reads of the CostModel it is mixed into."""

    workload: WorkloadSpec
    cluster: ClusterSpec
    params: CostParams
    L: LengthStats
    #: per task: (kind, role, model copy name)
    _info: dict[str, tuple[str, str, str]]
    #: per inference or training task its micro-batches (a sequence count or a Batching)
    _batching: dict[str, int | Batching]
    #: per task how it recomputes activations in its backward pass (RECOMPUTE_MODES)
    _recompute: dict[str, str]
    #: usable bytes per device (memory x usable_memory_fraction), read-only
    _mem_bytes: np.ndarray
    #: memo: PlacementMemory per placement
    _memory: dict
    #: memo: GroupResult per (placements, copies)
    _groups: dict
    #: memo: task-level terms (KV pool caps per generation layout, disjoint groups)
    _tasklevel: dict
    #: shared memo: plan structures and group layouts
    _copy_groups: dict
    #: shared memo: PlacementMemory per (tasklet rows, grid)
    _dense: dict
    #: shared memo: tasklet rows per (kind, shapes, layout, batch inputs, backend, offload)
    _slot_rows: dict
    #: shared memo: GroupMemory per (tasklet rows, grids, copies)
    _group_mem: dict

    def shapes(self, task: str, p: TaskPlacement) -> tuple[StageShape, ...]: ...

    def generation_cost(self, p: TaskPlacement, kv_budget: np.ndarray) -> TaskResult: ...


class MemoryTerms:
    """Memory of placements and task groups (mixed into CostModel; host: :class:`MemoryHost`)."""

    def placement_memory(self, p: TaskPlacement) -> PlacementMemory:
        """Per-device bytes of one placement: its model copy's weights, trained states, working
        set and KV bytes of an average sequence (arrays over all devices of the cluster)."""
        out = self._memory.get(p)
        if out is not None:
            return out
        slots = self._slots(p)
        # The dense arrays are a pure function of the slot bytes and the grid: shared by
        # placements that differ in data shares or model copy only (the entry holds ``slots``,
        # so its id stays its own while the entry lives).
        key = (id(slots), p.devices)
        hit = self._dense.get(key)
        if hit is not None and hit[0] is slots:
            out = hit[1]
        else:
            out = placement_memory_of(slots, p.device_array, self.cluster.num_devices)
            self._dense.put(key, (slots, out))
        self._memory[p] = out
        return out

    def _slots(self, p: TaskPlacement) -> np.ndarray:
        """``p``'s tasklet memory rows (:func:`~hetrl.cost.group_memory.slot_bytes`), memoised
        per layout and per-replica batch inputs (the workload, lengths and params are the cost
        model's)."""
        wl = self.workload
        kind = self._info[p.task][0]
        shapes = self.shapes(p.task, p)
        mbs = self._batching.get(p.task, 0)
        n_total = wl.samples / (wl.optimizer_steps if kind == "training" else 1)
        inputs = replica_batch_inputs(kind, mbs, self.L, n_total, p.data_shares, p.pp)
        # (shapes are interned and never dropped, so their id is theirs)
        recompute = self._recompute.get(p.task, "none")
        key = (kind, id(shapes), p.dp, p.tp, inputs, p.backend, p.offload, mbs, recompute)
        slots = self._slot_rows.get(key)
        if slots is None:
            slots = slot_bytes(kind, shapes, p, inputs, mbs, n_total, self.L, self.params,
                               recompute)
            self._slot_rows.put(key, slots)
        return slots

    def _memory_rows(self, placements: tuple[TaskPlacement, ...], copies: tuple[str, ...],
                     slots: list[np.ndarray]) -> tuple[np.ndarray, int]:
        """:func:`~hetrl.cost.group_memory.group_rows` of ``placements`` (their tasklet rows
        ``slots``; ``copies``: the copy names in the order their weights are added, the plan's
        order of first use, so that a group adds in the same order as the whole plan),
        read-only, and the index of the generation placement among them (-1: none)."""
        # the layout: each placement's columns, model copy and the generation task
        layout_key = ("group layout", copies,
                      *[(p.task, p.dp * p.pp * p.tp, p.backend) for p in placements])
        layout = self._copy_groups.get(layout_key)
        if layout is None:
            layout = self._copy_groups[layout_key] = group_layout(
                placements, copies, copy_names(placements, self._info))
        wl = self.workload
        return group_rows(placements, slots, layout, len(copies), self._mem_bytes,
                          wl.mode == "async", wl.mode == "sync" and wl.gen_sleep_level > 0
                          ), layout[2]

    def _structure(self, plan: Plan) -> tuple[tuple[str, ...], list[tuple[list[int],
                                                                           tuple[str, ...]]]]:
        """:func:`~hetrl.cost.group_memory.plan_structure` of ``plan`` (memoised per task
        layout and backends)."""
        pl = plan.placements
        key = (tuple([(p.task, p.backend) for p in pl]), tuple([g.tasks for g in plan.groups]))
        out = self._copy_groups.get(key)
        if out is None:
            out = self._copy_groups[key] = plan_structure(
                copy_names(pl, self._info), key[1], tuple([p.task for p in pl]))
        return out

    def kv_budgets(self, plan: Plan) -> np.ndarray:
        """Bytes each device can give the generation engine's KV cache under ``plan``: its usable
        memory less the resident bytes of every model copy and trained state on it (in async
        mode also less the largest working set: vLLM keeps its pool while other tasks run)."""
        rows, _ = self._memory_rows(plan.placements, self._structure(plan)[0],
                                    [self._slots(p) for p in plan.placements])
        return self._kv_pool(plan.placement("actor_generation"), rows[5])

    def _kv_pool(self, gen: TaskPlacement, left: np.ndarray) -> np.ndarray:
        """The KV bytes each device's rollout engine allocates: what ``left`` leaves it, at most
        ``gen_gpu_memory_utilization`` x the device's memory less its weights
        (:func:`~hetrl.cost.group_memory.kv_pool_caps`, memoised per generation layout)."""
        u = self.workload.gen_gpu_memory_utilization
        if u is None:
            return left
        key = ("kv cap", gen.devices, gen.layers_per_stage, gen.tp)
        cap = self._tasklevel.get(key)
        if cap is None:
            cap = self._tasklevel[key] = kv_pool_caps(
                self.cluster.num_devices, gen.device_ids, self.cluster.topology.memory_bytes,
                self._slots(gen)[0], u)
        return np.minimum(left, cap)

    def _group_results(self, plan: Plan) -> list[GroupResult]:
        """The memory (and generation) results of each task group of ``plan``. Groups use
        disjoint devices, so a device's memory depends on its group's placements only; if they
        overlap (a plan that was not validated), the whole plan is one group."""
        copies, structure = self._structure(plan)
        pl = plan.placements
        out = [self._group(tuple([pl[i] for i in idx]), names) for idx, names in structure]
        if len(out) > 1:
            # whether the groups' devices are disjoint, memoised per tuple of group results
            # (the entry holds them, so their ids stay theirs while it lives)
            key = ("disjoint", *map(id, out))
            hit = self._tasklevel.get(key)
            if hit is not None and all(a is b for a, b in zip(hit[0], out, strict=True)):
                disjoint = hit[1]
            else:
                used = np.concatenate([g.peak_ids for g in out])
                disjoint = int(np.maximum.reduce(np.bincount(used))) <= 1  # (.max(): 2 calls more)
                self._tasklevel[key] = (out, disjoint)
            if not disjoint:
                out = [self._group(pl, copies)]
        return out

    def _group(self, placements: tuple[TaskPlacement, ...], copies: tuple[str, ...]) -> GroupResult:
        """Memory of one task group's devices: violations, peak bytes and, when the group holds
        the generation task, its result under the KV budget the group leaves (memoised)."""
        key = (placements, copies)
        out = self._groups.get(key)
        if out is not None:
            return out
        mem = self._group_memory(placements, copies)
        generation = budget = None
        peak_bytes = mem.need
        if mem.generation >= 0:
            budget = self._kv_pool(placements[mem.generation], mem.kv_budget)
            generation = self.generation_cost(placements[mem.generation], budget)
            peak_bytes = generation_peak_bytes(mem, budget, generation.concurrency)
        out = GroupResult(mem.over, mem.over_bytes, mem.ids, peak_bytes, generation,
                          tuple(zip([p.task for p in placements], mem.device_sets, strict=True)),
                          mem.rows, budget)
        self._groups[key] = out
        return out

    def _group_memory(self, placements: tuple[TaskPlacement, ...], copies: tuple[str, ...]
                      ) -> GroupMemory:
        """A task group's memory (:func:`~hetrl.cost.group_memory.group_memory_of`). A pure
        function of the placements' tasklet memory rows, grids and model copies: shared by
        groups whose placements differ in data shares only when their memory rows do not (the
        entry holds the rows, so their ids stay theirs)."""
        slots = [self._slots(p) for p in placements]
        key = (tuple(map(id, slots)), tuple([p.devices for p in placements]), copies)
        hit = self._group_mem.get(key)
        if hit is not None and all(a is b for a, b in zip(hit[0], slots, strict=True)):
            return hit[1]
        rows, generation = self._memory_rows(placements, copies, slots)
        out = group_memory_of(rows, generation, placements, self._mem_bytes)
        self._group_mem.put(key, (slots, out))
        return out
