"""The memory terms of :class:`~hetrl.cost.model.CostModel`: per-device bytes of each
placement (weights, trained states, working set, KV per sequence), each task group's need and
the KV budget it leaves the rollout engine, and the report of devices over their memory
(docs/cost-model.md, "Memory"). A mixin: the CostModel holds the workload, tables and facts it
reads."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from hetrl.cost.batching import Batching, micro_batcher
from hetrl.cost.flops import StageShape
from hetrl.cost.fsdp import fsdp_memory_bytes
from hetrl.cost.kernels import group_memory_rows
from hetrl.cost.memory import task_memory_bytes
from hetrl.cost.result import TaskResult
from hetrl.cost.rollout import kv_pool_cap
from hetrl.plan import Plan, TaskPlacement

_NO_BYTES = np.zeros((5, 0))  # MemoryReport rows of a group with no device over its memory
_NO_BYTES.setflags(write=False)


@dataclass(eq=False, slots=True)
class PlacementMemory:
    """Bytes per device of one placement, over all devices of the cluster (0 where unused):
    what the ILP prices a candidate by (``CostModel.task_alone``). Estimates take a task
    group's memory from the group kernel instead."""

    weights: np.ndarray
    states: np.ndarray
    working: np.ndarray
    kv_per_seq: np.ndarray  # generation: KV bytes of an average sequence per device


@dataclass(eq=False, slots=True)
class GroupResult:
    """One task group's memory answer: the devices over their usable memory and their (need,
    weights, states, working, usable) bytes (see :class:`MemoryReport`); the devices it uses and
    the bytes per device at peak; and the generation task's result if the group holds it."""

    over: np.ndarray
    over_bytes: np.ndarray
    peak_ids: np.ndarray
    peak_bytes: np.ndarray
    generation: TaskResult | None
    #: (task, the devices its placement uses) per placement of the group
    device_sets: tuple[tuple[str, frozenset[int]], ...]


@dataclass(eq=False, slots=True)
class GroupMemory:
    """A task group's memory: per device (arrays over all devices, bytes) what it needs
    (resident + working), its resident bytes and the KV budget it leaves; the devices over
    their usable memory and their (need, weights, states, working, usable) bytes (5 x k); the
    devices the group uses; the generation placement's index in the group (-1: none) and its
    KV bytes of an average sequence per device; each placement's device set."""

    need: np.ndarray
    resident: np.ndarray
    kv_budget: np.ndarray
    over: np.ndarray
    over_bytes: np.ndarray
    ids: np.ndarray
    generation: int
    generation_kv_per_seq: np.ndarray
    device_sets: tuple[frozenset[int], ...]


class MemoryTerms:
    """Memory of placements and task groups (mixed into CostModel)."""

    def placement_memory(self, p: TaskPlacement) -> PlacementMemory:
        """Per-device bytes of one placement: its model copy's weights, trained states, working set."""
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
            dense = np.zeros((5, self.cluster.num_devices))
            dense[:, p.device_array] = slots
            dense.setflags(write=False)
            out = PlacementMemory(dense[0], dense[1], dense[2], dense[3])
            self._dense.put(key, (slots, out))
        self._memory[p] = out
        return out

    def _slots(self, p: TaskPlacement) -> np.ndarray:
        """``p``'s tasklet memory rows (see :meth:`_slot_bytes`), memoised per layout and
        per-replica batch inputs (the workload, lengths and params are the cost model's)."""
        wl = self.workload
        kind = self._info[p.task][0]
        shapes = self.shapes(p.task, p)
        mbs = self._batching.get(p.task, 0)
        n_total = wl.samples / (wl.optimizer_steps if kind == "training" else 1)
        # per replica the inputs its bytes depend on: none (generation), the micro-batch's
        # sequences (inference), and for training also the micro-batches in flight (at most pp)
        if kind == "generation":
            keys: Any = None
        elif not isinstance(mbs, int):  # by a token budget or padded: its tokens and count
            memory = micro_batcher(mbs, self.L).memory
            keys = tuple([(tokens, min(p.pp, micro)) for tokens, micro in
                          [memory(n_total * share) for share in p.data_shares]])
        elif kind == "inference":
            keys = tuple([min(float(mbs), max(n_total * share, 1.0)) for share in p.data_shares])
        else:
            keys = tuple([(min(float(mbs), max(n, 1.0)), min(p.pp, max(1, math.ceil(n / mbs))))
                          for n in [n_total * share for share in p.data_shares]])
        # (shapes are interned and never dropped, so their id is theirs)
        key = (kind, id(shapes), p.dp, p.tp, keys, p.backend, p.offload, mbs)
        slots = self._slot_rows.get(key)
        if slots is None:
            slots = self._slot_bytes(p, kind, shapes, keys, mbs, n_total)
            self._slot_rows.put(key, slots)
        return slots

    def _slot_bytes(self, p: TaskPlacement, kind: str, shapes: tuple[StageShape, ...],
                    keys: Any, mbs: int | Batching, n_total: float) -> np.ndarray:
        """(weights, states, working, KV bytes of an average sequence, 1) per device of ``p``'s
        grid (5 x devices, in device-id order of the grid). A pure function of the layout and
        of each replica's batch inputs ``keys`` (see :meth:`_slots`)."""
        wl = self.workload
        kv_seq = [shape.kv_bytes_per_token * self.L.seq_mean for shape in shapes]
        per_slot: list[tuple[float, float, float, float, float]] = []  # one per (replica, stage)
        seen: dict[Any, list[tuple[float, float, float, float, float]]] = {}
        for i, share in enumerate(p.data_shares):
            key = None if keys is None else keys[i]
            rows = seen.get(key)
            if rows is None and p.backend == "fsdp":
                rows = [(*fsdp_memory_bytes(kind, shapes[0], p.dp, n_total * share, mbs, self.L,
                                            self.params, wl.recompute, p.offload), 0.0, 1.0)]
            elif rows is None:
                rows = [(*task_memory_bytes(kind, shape, j, p.pp, p.dp, n_total * share, mbs,
                                            self.L, self.params, wl.recompute, p.offload),
                         kv_seq[j], 1.0)
                        for j, shape in enumerate(shapes)]
            seen[key] = rows
            per_slot += rows
        out = np.repeat(np.array(per_slot), p.tp, axis=0).T.copy()
        out.setflags(write=False)
        return out

    def _memory_rows(self, placements: tuple[TaskPlacement, ...], copies: tuple[str, ...],
                     slots: list[np.ndarray]) -> tuple[np.ndarray, int]:
        """:func:`~hetrl.cost.kernels.group_memory_rows` of ``placements`` (their tasklet rows
        ``slots``; ``copies``: the copy names in the order their weights are added, the plan's
        order of first use, so that a group adds in the same order as the whole plan),
        read-only, and the index of the generation placement among them (-1: none)."""
        # the layout: each placement's columns, model copy and the generation task
        layout_key = ("group layout", copies, *[(p.task, p.dp * p.pp * p.tp) for p in placements])
        layout = self._copy_groups.get(layout_key)
        if layout is None:
            tasks = [p.task for p in placements]
            starts = [0]
            for p in placements:
                starts.append(starts[-1] + p.dp * p.pp * p.tp)
            layout = self._copy_groups[layout_key] = (
                np.array(starts, dtype=np.int64),
                np.array([copies.index(self._info[t][2]) for t in tasks], dtype=np.int64),
                tasks.index("actor_generation") if "actor_generation" in tasks else -1)
        starts, copy_of, generation = layout
        if len(slots) > 1:
            flat = np.array(tuple(itertools.chain.from_iterable(
                [p.device_ids for p in placements])), dtype=np.int64)
            slots_cat = np.concatenate(slots, axis=1)
        else:
            flat, slots_cat = placements[0].device_array, slots[0]
        rows = group_memory_rows(slots_cat, flat, starts, copy_of, len(copies), generation,
                                 self._mem_bytes, self.workload.mode == "async")
        rows.setflags(write=False)
        return rows, generation

    def _structure(self, plan: Plan) -> tuple[tuple[str, ...], list[tuple[list[int],
                                                                           tuple[str, ...]]]]:
        """The plan's model copies in order of first use, and per task group the indices of its
        placements (in plan order) and its copies in that order (memoised per task layout)."""
        tasks = tuple([p.task for p in plan.placements])
        key = (tasks, tuple([g.tasks for g in plan.groups]))
        out = self._copy_groups.get(key)
        if out is None:
            copies = tuple(dict.fromkeys(self._info[t][2] for t in tasks))
            groups = []
            for g in plan.groups:
                idx = [i for i, t in enumerate(tasks) if t in g.tasks]
                mine = {self._info[tasks[i]][2] for i in idx}
                groups.append((idx, tuple(c for c in copies if c in mine)))
            if sorted(i for idx, _ in groups for i in idx) != list(range(len(tasks))):
                groups = [(list(range(len(tasks))), copies)]  # not a partition: one group
            out = (copies, groups)
            self._copy_groups[key] = out
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
        (:func:`~hetrl.cost.rollout.kv_pool_cap`)."""
        u = self.workload.gen_gpu_memory_utilization
        if u is None:
            return left
        key = ("kv cap", gen.devices, gen.layers_per_stage, gen.tp)
        cap = self._tasklevel.get(key)
        if cap is None:
            cap = np.full(self.cluster.num_devices, np.inf)
            weights = self._slots(gen)[0]
            total = self.cluster.topology.memory_bytes
            for col, d in enumerate(gen.device_ids):
                cap[d] = kv_pool_cap(float(total[d]), float(weights[col]), u)
            self._tasklevel[key] = cap
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
        """Memory of one task group's devices: violations, peak GB and, when the group holds the
        generation task, its result under the KV budget the group leaves (memoised)."""
        key = (placements, copies)
        out = self._groups.get(key)
        if out is not None:
            return out
        mem = self._group_memory(placements, copies)
        generation = None
        peak_bytes = mem.need
        if mem.generation >= 0:
            budget = self._kv_pool(placements[mem.generation], mem.kv_budget)
            generation = self.generation_cost(placements[mem.generation], budget)
            kv_used = np.minimum(np.maximum(budget, 0.0),
                                 generation.concurrency * mem.generation_kv_per_seq)
            peak_bytes = np.maximum(mem.need, mem.resident + kv_used)
        out = GroupResult(mem.over, mem.over_bytes, mem.ids, peak_bytes, generation,
                           tuple(zip([p.task for p in placements], mem.device_sets,
                                     strict=True)))
        self._groups[key] = out
        return out

    def _group_memory(self, placements: tuple[TaskPlacement, ...], copies: tuple[str, ...]
                      ) -> GroupMemory:
        """A task group's memory (see :class:`GroupMemory` and
        :func:`hetrl.cost.kernels.group_memory_rows`). A pure function of the placements'
        tasklet memory rows, grids and model copies: shared by groups whose placements differ
        in data shares only when their memory rows do not (the entry holds the rows, so their
        ids stay theirs)."""
        slots = [self._slots(p) for p in placements]
        key = (tuple(map(id, slots)), tuple([p.devices for p in placements]), copies)
        hit = self._group_mem.get(key)
        if hit is not None and all(a is b for a, b in zip(hit[0], slots, strict=True)):
            return hit[1]
        rows, generation = self._memory_rows(placements, copies, slots)
        need, weights, states, working, resident, kv_budget, used, over_flag, kv = rows[:9]
        over = over_flag.nonzero()[0]
        over_bytes = _NO_BYTES
        if over.size:
            over_bytes = np.array([need[over], weights[over], states[over], working[over],
                                   self._mem_bytes[over]])
        device_sets = []  # co-located placements on one grid share one set (hashed once)
        for i, p in enumerate(placements):
            device_sets.append(device_sets[-1] if i and p.devices == placements[i - 1].devices
                               else frozenset(p.device_ids))
        out = GroupMemory(need, resident, kv_budget, over, over_bytes, used.nonzero()[0],
                           generation, kv, tuple(device_sets))
        self._group_mem.put(key, (slots, out))
        return out
