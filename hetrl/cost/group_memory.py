"""The memory formulas of placements and task groups over explicit inputs (docs/cost-model.md,
"Memory"): each placement's tasklet rows (weights, trained states, working set and KV bytes per
sequence of each device of its grid), the plan's model copies per task group, the group's rows
turned into what it needs and the devices over their memory, the rollout engine's KV pool cap
and the generation's peak. The answers' data classes live here too. No memo tables of a cost
model here: :class:`~hetrl.cost.model_memory.MemoryTerms` looks them up and stores what these
return."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hetrl.cost.batching import Batching, micro_batcher
from hetrl.cost.flops import StageShape
from hetrl.cost.fsdp import fsdp_memory_bytes
from hetrl.cost.kernels import group_memory_rows
from hetrl.cost.lengths import LengthStats
from hetrl.cost.memory import task_memory_bytes
from hetrl.cost.params import CostParams
from hetrl.cost.result import TaskResult
from hetrl.cost.rollout import kv_pool_cap
from hetrl.plan import TaskPlacement

_NO_BYTES = np.zeros((6, 0))  # MemoryReport rows of a group with no device over its memory
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
    weights, states, working, usable, rollout weights) bytes (see :class:`MemoryReport`); the
    devices it uses and the bytes per device at peak; and the generation task's result if the
    group holds it."""

    over: np.ndarray
    over_bytes: np.ndarray
    peak_ids: np.ndarray
    peak_bytes: np.ndarray
    generation: TaskResult | None
    #: (task, the devices its placement uses) per placement of the group
    device_sets: tuple[tuple[str, frozenset[int]], ...]
    #: the group's memory rows (:data:`~hetrl.cost.kernels.GROUP_MEMORY_ROWS`, read-only) and
    #: the KV budget its rollout engine allocates (bytes per device; None: no generation task)
    rows: np.ndarray
    kv_pool: np.ndarray | None


@dataclass(eq=False, slots=True)
class GroupMemory:
    """A task group's memory: per device (arrays over all devices, bytes) what it needs
    (resident + working; with a sleeping rollout the larger of its phase and the others'), its
    resident bytes while generating and the KV budget it leaves; the devices over their usable
    memory and their (need, weights, states, working, usable, rollout weights) bytes (6 x k); the
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
    #: the kernel's rows (:data:`~hetrl.cost.kernels.GROUP_MEMORY_ROWS`, read-only)
    rows: np.ndarray


def replica_batch_inputs(kind: str, batching: int | Batching, lengths: LengthStats,
                         sequences: float, data_shares: Sequence[float], pp: int) -> Any:
    """Per replica the inputs its bytes depend on, of ``sequences`` per optimizer step shared
    by ``data_shares``: none (generation: None), the micro-batch's sequences (inference), and
    for training also the micro-batches in flight (at most ``pp``); by a token budget or padded
    (``batching`` a Batching): its tokens and micro-batches in flight. Clamped, so that replicas
    of unlike shares share their rows."""
    if kind == "generation":
        return None
    if not isinstance(batching, int):
        memory = micro_batcher(batching, lengths).memory
        return tuple([(tokens, min(pp, micro)) for tokens, micro in
                      [memory(sequences * share) for share in data_shares]])
    if kind == "inference":
        return tuple([min(float(batching), max(sequences * share, 1.0)) for share in data_shares])
    return tuple([(min(float(batching), max(n, 1.0)), min(pp, max(1, math.ceil(n / batching))))
                  for n in [sequences * share for share in data_shares]])


def slot_bytes(kind: str, shapes: tuple[StageShape, ...], p: TaskPlacement, inputs: Any,
               batching: int | Batching, sequences: float, lengths: LengthStats,
               params: CostParams, recompute: bool | str) -> np.ndarray:
    """(weights, states, working, KV bytes of an average sequence, 1) per device of ``p``'s
    grid (5 x devices, in device-id order of the grid, read-only) for a task of ``kind`` with
    stages ``shapes`` holding ``sequences`` per optimizer step (:func:`task_memory_bytes
    <hetrl.cost.memory.task_memory_bytes>`, :func:`~hetrl.cost.fsdp.fsdp_memory_bytes`). Reads
    of ``p`` its layout, backend, offload and data shares; each replica's batch inputs
    ``inputs`` (:func:`replica_batch_inputs`) key the rows replicas share."""
    kv_seq = [shape.kv_bytes_per_token * lengths.seq_mean for shape in shapes]
    per_slot: list[tuple[float, float, float, float, float]] = []  # one per (replica, stage)
    seen: dict[Any, list[tuple[float, float, float, float, float]]] = {}
    for i, share in enumerate(p.data_shares):
        key = None if inputs is None else inputs[i]
        rows = seen.get(key)
        if rows is None and p.backend == "fsdp":
            rows = [(*fsdp_memory_bytes(kind, shapes[0], p.dp, sequences * share, batching,
                                        lengths, params, recompute, p.offload), 0.0, 1.0)]
        elif rows is None:
            rows = [(*task_memory_bytes(kind, shape, j, p.pp, p.dp, sequences * share, batching,
                                        lengths, params, recompute, p.offload),
                     kv_seq[j], 1.0)
                    for j, shape in enumerate(shapes)]
        seen[key] = rows
        per_slot += rows
    out = np.repeat(np.array(per_slot), p.tp, axis=0).T.copy()
    out.setflags(write=False)
    return out


def placement_memory_of(slots: np.ndarray, device_array: np.ndarray,
                        num_devices: int) -> PlacementMemory:
    """A placement's tasklet rows ``slots`` (:func:`slot_bytes`) spread over all
    ``num_devices`` devices of the cluster (read-only arrays, bytes)."""
    dense = np.zeros((5, num_devices))
    dense[:, device_array] = slots
    dense.setflags(write=False)
    return PlacementMemory(dense[0], dense[1], dense[2], dense[3])


#: The suffix of a model's FSDP copy: an FSDP task's parameter shard is shared by the model's
#: other FSDP tasks on the same devices, never with its Megatron layouts or a rollout engine.
FSDP_COPY = ":fsdp"


def copy_names(placements: Sequence[TaskPlacement], info: dict[str, tuple[str, str, str]]
               ) -> tuple[str, ...]:
    """Each placement's model copy name: its task's (``info``: per task (kind, role, model copy
    name)), with :data:`FSDP_COPY` appended for an FSDP placement."""
    return tuple([info[p.task][2] + FSDP_COPY if p.backend == "fsdp" else info[p.task][2]
                  for p in placements])


def plan_structure(names: tuple[str, ...], group_tasks: Sequence[tuple[str, ...]],
                   tasks: tuple[str, ...]
                   ) -> tuple[tuple[str, ...], list[tuple[list[int], tuple[str, ...]]]]:
    """The model copies of a plan's placements (``names``: each one's copy name, in plan order,
    :func:`copy_names`; ``tasks``: each one's task) in order of first use, and per task group
    (``group_tasks``: each group's tasks) the indices of its placements and its copies in that
    order; one group of all if the groups do not partition the tasks."""
    copies = tuple(dict.fromkeys(names))
    groups = []
    for g in group_tasks:
        idx = [i for i, t in enumerate(tasks) if t in g]
        mine = {names[i] for i in idx}
        groups.append((idx, tuple(c for c in copies if c in mine)))
    if sorted(i for idx, _ in groups for i in idx) != list(range(len(tasks))):
        groups = [(list(range(len(tasks))), copies)]  # not a partition: one group
    return copies, groups


def group_layout(placements: Sequence[TaskPlacement], copies: tuple[str, ...],
                 names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray, int]:
    """A task group's column layout for :func:`~hetrl.cost.kernels.group_memory_rows`: each
    placement's first column, its model copy's index in ``copies`` (``names``: each
    placement's copy name) and the generation placement's index (-1: none)."""
    tasks = [p.task for p in placements]
    starts = [0]
    for p in placements:
        starts.append(starts[-1] + p.dp * p.pp * p.tp)
    return (np.array(starts, dtype=np.int64),
            np.array([copies.index(n) for n in names], dtype=np.int64),
            tasks.index("actor_generation") if "actor_generation" in tasks else -1)


def group_rows(placements: Sequence[TaskPlacement], slots: Sequence[np.ndarray],
               layout: tuple[np.ndarray, np.ndarray, int], copies: int, mem_bytes: np.ndarray,
               async_mode: bool, rollout_sleeps: bool) -> np.ndarray:
    """:func:`~hetrl.cost.kernels.group_memory_rows` of a task group (read-only): its
    placements' tasklet rows ``slots``, ``layout`` (:func:`group_layout`), its number of model
    ``copies``, each device's usable bytes ``mem_bytes``; in async mode the rollout engine
    keeps its pool while other tasks run; ``rollout_sleeps`` (sync mode with vLLM's sleep mode)
    its weights leave the GPUs while other tasks run."""
    starts, copy_of, generation = layout
    if len(slots) > 1:
        flat = np.array(tuple(itertools.chain.from_iterable(
            [p.device_ids for p in placements])), dtype=np.int64)
        slots_cat = np.concatenate(slots, axis=1)
    else:
        flat, slots_cat = placements[0].device_array, slots[0]
    rows = group_memory_rows(slots_cat, flat, starts, copy_of, copies, generation, mem_bytes,
                             async_mode, rollout_sleeps)
    rows.setflags(write=False)
    return rows


def group_memory_of(rows: np.ndarray, generation: int, placements: Sequence[TaskPlacement],
                    mem_bytes: np.ndarray) -> GroupMemory:
    """A task group's :class:`GroupMemory` from its rows (:func:`group_rows`), the generation
    placement's index (-1: none) and each device's usable bytes ``mem_bytes``."""
    need, weights, states, working, resident, kv_budget, used, over_flag, kv, rollout = rows
    over = over_flag.nonzero()[0]
    over_bytes = _NO_BYTES
    if over.size:
        over_bytes = np.array([need[over], weights[over], states[over], working[over],
                               mem_bytes[over], rollout[over]])
    device_sets = []  # co-located placements on one grid share one set (hashed once)
    for i, p in enumerate(placements):
        device_sets.append(device_sets[-1] if i and p.devices == placements[i - 1].devices
                           else frozenset(p.device_ids))
    return GroupMemory(need, resident, kv_budget, over, over_bytes, used.nonzero()[0],
                       generation, kv, tuple(device_sets), rows)


def kv_pool_caps(num_devices: int, device_ids: Sequence[int], memory_bytes: np.ndarray,
                 weights: np.ndarray, utilization: float) -> np.ndarray:
    """Per device of the cluster the most KV bytes the rollout engine allocates on it
    (:func:`~hetrl.cost.rollout.kv_pool_cap`: ``utilization`` x its ``memory_bytes`` less the
    engine's ``weights`` there, one per column of its grid ``device_ids``; inf elsewhere)."""
    cap = np.full(num_devices, np.inf)
    for col, d in enumerate(device_ids):
        cap[d] = kv_pool_cap(float(memory_bytes[d]), float(weights[col]), utilization)
    return cap


def generation_peak_bytes(mem: GroupMemory, kv_budget: np.ndarray, concurrency: float
                          ) -> np.ndarray:
    """Per device the bytes at peak of a group holding the generation task: its need, or its
    resident bytes plus the KV cache of ``concurrency`` average sequences, at most its
    ``kv_budget`` (bytes)."""
    kv_used = np.minimum(np.maximum(kv_budget, 0.0), concurrency * mem.generation_kv_per_seq)
    return np.maximum(mem.need, mem.resident + kv_used)
