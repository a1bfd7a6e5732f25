"""CostModel: the analytical estimate of one RL iteration of a plan (time, parts, memory).

Memoised per (task, device grid, layout, batch share): searches change one task at a time, so
most of a new plan's tasks hit the cache. A CostModel is bound to one workload, cluster and set
of parameters; :func:`estimate` keeps one per (workload, cluster, params).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Any

import numpy as np

from hetrl.cost.batching import Batching, micro_batcher, micro_batching, micro_count
from hetrl.cost.flops import LM_HEAD_ROLES, StageShape, stage_shapes
from hetrl.cost.fsdp import fsdp_memory_bytes, fsdp_step_seconds, offload_seconds
from hetrl.cost.kernels import (
    dp_link_table,
    dp_optimizer_seconds,
    fan_in_link_facts,
    group_memory_rows,
)
from hetrl.cost.lengths import LengthStats, length_stats
from hetrl.cost.memo import topology_memoised
from hetrl.cost.memory import task_memory_bytes
from hetrl.cost.params import DEFAULT_PARAMS, CostParams
from hetrl.cost.primitives import (
    GroupLinks,
    device_efficiency,
    links_from_row,
    node_symmetry,
)
from hetrl.cost.replica import ReplicaHW, replica_hw
from hetrl.cost.rollout import kv_pool_cap, switch_seconds, sync_call_seconds
from hetrl.cost.stragglers import straggler_load
from hetrl.cost.sync import weight_sync_time
from hetrl.cost.tasks import (
    PARTS,
    ReplicaCost,
    exposed_grad_sync,
    forward_engine,
    generation_engine,
)
from hetrl.cost.workflow import iteration_time
from hetrl.plan import Grid, Plan, TaskPlacement, validate
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.tasks import REPORTED_TASKS, WEIGHT_SYNC
from hetrl.spec.workload import WorkloadSpec

#: Bytes per token moved from generation to an inference task (token ids, int32) and to a
#: training task (ids + old log-probs, reference log-probs, advantages, returns: 4 x fp32).
DATA_BYTES_PER_TOKEN = {"inference": 4.0, "training": 20.0}

_ZERO_PARTS = dict.fromkeys(PARTS, 0.0)
_NO_BYTES = np.zeros((5, 0))  # MemoryReport rows of a group with no device over its memory
_NO_BYTES.setflags(write=False)


@dataclass(frozen=True, eq=False)
class MemoryReport:
    """Per-device memory of a plan's task groups, turned into GB and messages only when read
    (a search makes estimates by the hundred thousand and reads these of one or two).

    ``peaks``: per group, its device ids and the bytes per device at peak (indexed by device id);
    ``over``: per group whose devices exceed their usable memory, those device ids and a (5, k)
    array of their needed, weight, trained-state, working and usable bytes; ``gpus``: per device
    of the cluster, its GPU type name and memory (GB)."""

    peaks: tuple[tuple[np.ndarray, np.ndarray], ...]
    over: tuple[tuple[np.ndarray, np.ndarray], ...]
    gpus: tuple[tuple[str, float], ...]

    def peak_gb(self) -> dict[int, float]:
        """Device id -> peak GB (1e9 bytes), in device order."""
        ids = np.concatenate([i for i, _ in self.peaks])
        gb = np.concatenate([b[i] for i, b in self.peaks]) / 1e9
        order = np.argsort(ids, kind="stable")
        return dict(zip(ids[order].tolist(), gb[order].tolist(), strict=True))

    def messages(self) -> tuple[str, ...]:
        """One message per device over its usable memory, in device order."""
        rows = sorted((d, *col) for ids, table in self.over
                      for d, col in zip(ids.tolist(), table.T.tolist(), strict=True))
        out = []
        for d, need, weights, states, working, usable in rows:
            name, memory_gb = self.gpus[d]
            out.append(
                f"device {d} ({name}): needs {need / 1e9:.1f} GB (weights {weights / 1e9:.1f}, "
                f"grads+optimizer {states / 1e9:.1f}, working {working / 1e9:.1f}) "
                f"> usable {usable / 1e9:.1f} GB of {memory_gb:g} GB")
        return tuple(out)


@dataclass(frozen=True, eq=False)
class Estimate:
    """The cost model's answer for one plan. Times in seconds, memory in GB (1e9 bytes).
    ``peak_memory_gb`` (device id -> GB) and ``violations`` (memory messages in device order,
    then the tasks' own) are built from ``memory`` and ``task_violations`` when first read.
    Estimates compare by :meth:`to_dict`."""

    iteration_s: float
    tasks: dict[str, float]
    parts: dict[str, dict[str, float]]
    feasible: bool
    samples_per_iteration: int
    tokens_per_iteration: float
    chain_s: float
    generation_concurrency: int
    memory: MemoryReport
    task_violations: tuple[str, ...] = ()

    @cached_property
    def peak_memory_gb(self) -> dict[int, float]:
        return self.memory.peak_gb()

    @cached_property
    def violations(self) -> tuple[str, ...]:
        return self.memory.messages() + self.task_violations

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Estimate) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]

    @property
    def throughput_samples_per_s(self) -> float:
        return self.samples_per_iteration / self.iteration_s

    @property
    def throughput_tokens_per_s(self) -> float:
        return self.tokens_per_iteration / self.iteration_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "iteration_s": self.iteration_s,
            "throughput_samples_per_s": self.throughput_samples_per_s,
            "throughput_tokens_per_s": self.throughput_tokens_per_s,
            "feasible": self.feasible,
            "violations": list(self.violations),
            "peak_memory_gb": {str(d): gb for d, gb in self.peak_memory_gb.items()},
            "tasks": dict(self.tasks),
            "parts": {t: dict(p) for t, p in self.parts.items()},
            "chain_s": self.chain_s,
            "generation_concurrency": self.generation_concurrency,
        }


@dataclass(eq=False, slots=True)
class _PlacementMemory:
    """Bytes per device of one placement, over all devices of the cluster (0 where unused):
    what the ILP prices a candidate by (``CostModel.task_alone``). Estimates take a task
    group's memory from the group kernel instead."""

    weights: np.ndarray
    states: np.ndarray
    working: np.ndarray
    kv_per_seq: np.ndarray  # generation: KV bytes of an average sequence per device


@dataclass(eq=False, slots=True)
class _GroupResult:
    """One task group's memory answer: the devices over their usable memory and their (need,
    weights, states, working, usable) bytes (see :class:`MemoryReport`); the devices it uses and
    the bytes per device at peak; and the generation task's result if the group holds it."""

    over: np.ndarray
    over_bytes: np.ndarray
    peak_ids: np.ndarray
    peak_bytes: np.ndarray
    generation: _TaskResult | None
    #: (task, the devices its placement uses) per placement of the group
    device_sets: tuple[tuple[str, frozenset[int]], ...]


@dataclass(eq=False, slots=True)
class _GroupMemory:
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


@dataclass(slots=True)
class _TaskResult:
    seconds: float
    parts: dict[str, float]
    violations: tuple[str, ...]
    concurrency: int = 0


@dataclass(frozen=True)
class _Shared:
    """Workload- and cluster-level facts of one (workload, cluster, params) and the memo tables
    every CostModel built for them shares (each table bounded where it is filled)."""

    workload: WorkloadSpec
    cluster: ClusterSpec
    params: CostParams
    lengths: LengthStats
    #: usable bytes per device (memory x usable_memory_fraction), read-only
    mem_bytes: np.ndarray
    #: per task: (kind, role, model copy name)
    info: dict[str, tuple[str, str, str]]
    #: the workflow's stages as task names
    stages: list[list[str]]
    #: per device its GPU type name and memory (GB), for memory messages
    gpus: tuple[tuple[str, float], ...]
    #: (node of each device, each node's devices) where the nodes are symmetric, else None
    symmetry: Any
    #: per task kind its micro-batches: a sequence count (padding removed), or a Batching
    batching: dict[str, Any]
    #: the copies and groups of a task layout (workload-level facts)
    copy_groups: dict = field(default_factory=dict)
    #: the interned stage shapes of a (role, layers per stage, tp)
    shapes: dict = field(default_factory=dict)
    #: replica hardware per replica grid
    hw: dict = field(default_factory=dict)
    #: engines per (task kind, id of stage shapes, id of replica hardware) -> (shapes, hw,
    #: engine): the entry holds the two objects, so their ids stay theirs while it lives
    engines: dict = field(default_factory=dict)
    #: per-device arrays of placements (for the ILP): see placement_memory
    dense: dict = field(default_factory=dict)
    #: the answers of task groups: see _group_memory
    group_mem: dict = field(default_factory=dict)
    #: the workflow's merge steps per (stage tasks, device sets): see workflow.iteration_time
    makespan: dict = field(default_factory=dict)
    #: replica hardware per (pp, tp, node of each device): see replica_hws
    hw_by_nodes: dict = field(default_factory=dict)
    #: per-device bytes of a layout's tasklets per (kind, id of the interned stage shapes, dp,
    #: tp, per-replica batch inputs, backend, offload): see _slot_bytes
    slot_rows: dict = field(default_factory=dict)


#: The shared facts and tables per (workload, cluster, params), keyed by identity; each entry
#: holds its keys, so an id is never reused while it lives.
_STATIC: dict[tuple[int, int, int], _Shared] = {}
#: A cost model's own memo entries (plans, tasks, groups, placements, decodes, ...) before they
#: start afresh: ~2.5 KB each measured (paper64 PPO, 60 s search: 1.5 GB resident at ~550,000),
#: so ~2 GB per process. Unbounded, a 10-minute search held 8.3 GB per process.
MEMO_ENTRIES = 800_000


class CostModel:
    """Estimates plans of one ``workload`` on one ``cluster`` with ``params``."""

    def __init__(self, workload: WorkloadSpec, cluster: ClusterSpec,
                 params: CostParams = DEFAULT_PARAMS):
        self.workload = workload
        self.cluster = cluster
        self.params = params
        self.evaluations = 0
        self._replica: dict[Any, ReplicaCost] = {}
        self._memory: dict[Any, _PlacementMemory] = {}
        self._tasks: dict[Any, _TaskResult] = {}
        self._tasklevel: dict[Any, Any] = {}
        self._plans: dict[Any, Estimate] = {}
        self._sync: dict[Any, float] = {}
        self._groups: dict[Any, _GroupResult] = {}
        #: (generation placement, kind, grid, data shares, seconds) of the last rollout
        #: transfer priced (see _data_transfer)
        self._last_transfer: tuple | None = None
        shared = _STATIC.get((id(workload), id(cluster), id(params)))
        if shared is None or shared.workload is not workload or shared.cluster is not cluster \
                or shared.params is not params:
            mem_bytes = cluster.topology.memory_bytes * params.usable_memory_fraction
            mem_bytes.setflags(write=False)
            shared = _Shared(
                workload, cluster, params, length_stats(workload), mem_bytes,
                info={t.name: (t.kind, t.role, self._copy_name(t.name)) for t in workload.tasks},
                stages=[[t.name for t in workload.tasks if t.stage == s] for s in (0, 1, 2)],
                gpus=tuple((d.gpu.name, d.gpu.memory_gb) for d in cluster.devices),
                symmetry=node_symmetry(cluster),
                batching={kind: micro_batching(workload, kind)
                          for kind in ("inference", "training")})
            if len(_STATIC) >= 64:
                _STATIC.clear()
            _STATIC[id(workload), id(cluster), id(params)] = shared
        # the shared facts and tables under the names the methods use (see _Shared)
        self.L: LengthStats = shared.lengths
        self._batching: dict[str, int | Batching] = shared.batching
        self._mem_bytes = shared.mem_bytes
        self._info = shared.info
        self._stages = shared.stages
        self._copy_groups: dict[Any, Any] = shared.copy_groups
        self._shapes = shared.shapes
        self._hw: dict[Any, ReplicaHW] = shared.hw
        self._engines: dict[Any, tuple] = shared.engines
        self._dense: dict[Any, tuple] = shared.dense
        self._group_mem: dict[Any, tuple] = shared.group_mem
        self._gpus: tuple[tuple[str, float], ...] = shared.gpus
        self._makespan: dict[Any, Any] = shared.makespan
        self._symmetry = shared.symmetry
        self._hw_by_nodes: dict[tuple[int, ...], ReplicaHW] = shared.hw_by_nodes
        self._slot_rows: dict[Any, np.ndarray] = shared.slot_rows
        #: entries of each of _dense, _group_mem and _makespan before it starts afresh (an
        #: entry holds at most about 16 arrays over the devices: ~100 MB at most)
        self._shared_entries = max(1000, 100_000_000 // (128 * cluster.num_devices))

    def memoised(self, key: Any, compute: Any) -> Any:
        """``compute()``, memoised per ``key`` for this cost model: for callers' pure functions
        of a plan's parts under this workload, cluster and params (e.g. the load balancer)."""
        out = self._tasklevel.get(key)
        if out is None:
            out = self._tasklevel[key] = compute()
        return out

    # --- building blocks (memoised) ---
    def shapes(self, task: str, p: TaskPlacement) -> tuple[StageShape, ...]:
        info = self._info.get(task)
        role = info[1] if info is not None else self.workload.task(task).role
        key = (role, p.layers_per_stage, p.tp)
        out = self._shapes.get(key)
        if out is None:
            out = stage_shapes(self.workload.model(role), p.layers_per_stage, p.tp,
                               role in LM_HEAD_ROLES, self.workload.bytes_per_value)
            # roles of equal stage shapes (e.g. reward and critic of one model) share one
            # object, so their engines, replica prices and task costs are shared too
            out = self._shapes.setdefault(("equal", out), out)
            self._shapes[key] = out
        return out

    def hw(self, replica: tuple[tuple[int, ...], ...]) -> ReplicaHW:
        out = self._hw.get(replica)
        if out is None:
            out = replica_hw(self.cluster, replica)
            if len(self._hw) >= 100_000:
                self._hw.clear()
            self._hw[replica] = out
        return out

    def replica_hws(self, p: TaskPlacement) -> tuple[ReplicaHW, ...]:
        """The hardware of each replica of ``p`` (:meth:`hw`). A replica seen before is looked
        up as it is; a new one, where the cluster's nodes are symmetric and no device of ``p``
        repeats, by its shape and the node of each of its devices (devices renamed within their
        nodes have the same hardware, :func:`~hetrl.cost.primitives.symmetric_memo`): one pass
        over the placement's devices instead of renaming each replica."""
        grid_key = ("hws", p.devices)  # tasks co-located on one grid ask for the same
        out = self._tasklevel.get(grid_key)
        if out is not None:
            return out
        raw, memo = self._hw, self._hw_by_nodes
        pp, tp = p.pp, p.tp
        size = pp * tp
        nodes: Any = None  # each device's node, once a replica is new (False: no symmetry)
        hws = []
        for i, replica in enumerate(p.devices):
            hw = raw.get(replica)
            if hw is None:
                if nodes is None:
                    ids = p.device_ids
                    nodes = False if self._symmetry is None or len(set(ids)) != len(ids) \
                        else [self._symmetry[0][d] for d in ids]
                if nodes is False:
                    hw = self.hw(replica)
                else:
                    key = (pp, tp, *nodes[i * size:(i + 1) * size])
                    hw = memo.get(key)
                    if hw is None:
                        if len(memo) >= 100_000:
                            memo.clear()
                        hw = memo[key] = self.hw(replica)  # (also stores it under ``replica``)
                    else:
                        if len(raw) >= 100_000:
                            raw.clear()
                        raw[replica] = hw
            hws.append(hw)
        out = self._tasklevel[grid_key] = tuple(hws)
        return out

    def _engine(self, kind: str, shapes: tuple[StageShape, ...], hw: ReplicaHW) -> Any:
        """The replica-cost engine of a task kind for one layout on one replica's hardware."""
        key = (kind, id(shapes), id(hw))
        out = self._engines.get(key)
        if out is None or out[0] is not shapes or out[1] is not hw:  # (a copy's ids differ)
            wl = self.workload
            if kind == "generation":
                engine = generation_engine(shapes, hw, self.L, self.params, wl.gen_cuda_graphs)
            else:
                engine = forward_engine(kind, shapes, hw, self.L, self.params,
                                        self._batching[kind], wl.recompute, wl.tp_comm_overlap)
            if len(self._engines) >= 100_000:
                self._engines.clear()
            out = self._engines[key] = (shapes, hw, engine)
        return out[2]

    def _copy_name(self, task: str) -> str:
        role = self.workload.task(task).role
        if task == "actor_generation" and self.workload.mode == "async":
            return "actor@generation"
        return role

    def placement_memory(self, p: TaskPlacement) -> _PlacementMemory:
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
            out = _PlacementMemory(dense[0], dense[1], dense[2], dense[3])
            if len(self._dense) >= self._shared_entries:
                self._dense.clear()
            self._dense[key] = (slots, out)
        self._memory[p] = out
        return out

    def _slots(self, p: TaskPlacement) -> np.ndarray:
        """``p``'s tasklet memory rows (see :meth:`_slot_bytes`), memoised per layout and
        per-replica batch inputs (the workload, lengths and params are the cost model's)."""
        wl = self.workload
        kind = self._info[p.task][0]
        shapes = self.shapes(p.task, p)
        mbs = self._batching.get(kind, 0)
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
        key = (kind, id(shapes), p.dp, p.tp, keys, p.backend, p.offload)
        slots = self._slot_rows.get(key)
        if slots is None:
            slots = self._slot_bytes(p, kind, shapes, keys, mbs, n_total)
            if len(self._slot_rows) >= 100_000:
                self._slot_rows.clear()
            self._slot_rows[key] = slots
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
                                            self.L, self.params, wl.recompute), kv_seq[j], 1.0)
                        for j, shape in enumerate(shapes)]
            seen[key] = rows
            per_slot += rows
        out = np.repeat(np.array(per_slot), p.tp, axis=0).T.copy()
        out.setflags(write=False)
        return out

    # --- tasks ---
    def _generation(self, p: TaskPlacement, kv_budget: np.ndarray) -> _TaskResult:
        shapes = self.shapes(p.task, p)
        flat, starts = self._stage_index(p)
        mins = np.minimum.reduceat(kv_budget[flat], starts).round(-6).reshape(p.dp, p.pp)
        budgets = tuple(map(tuple, mins.tolist()))
        key = (p, budgets)
        out = self._tasks.get(key)
        if out is not None:
            return out
        engine_of = self._engine
        samples, max_conc = self.workload.samples, self.workload.gen_max_concurrency
        # A replica's time rises with its sequence count for a given engine (hardware) and KV
        # budget (docs/cost-model.md), so per (engine, budget) only the replica with the most
        # sequences (the first of equals) can be the slowest: price that one. Violations depend
        # on the engine and budget alone and are reported for every replica.
        classes: dict[Any, list] = {}  # (engine, budget) -> [most sequences, its index, engine]
        members: list[Any] = []
        for i, (share, hw, budget) in enumerate(zip(p.data_shares, self.replica_hws(p),
                                                     budgets, strict=True)):
            engine = engine_of("generation", shapes, hw)
            cls_key = (id(engine), budget)
            n = samples * share
            cls = classes.get(cls_key)
            if cls is None:
                classes[cls_key] = [n, i, engine, budget]
            elif n > cls[0]:
                cls[0], cls[1] = n, i
            members.append(cls_key)
        worst: ReplicaCost | None = None
        worst_i = -1
        priced: dict[Any, ReplicaCost] = {}
        for cls_key, (n, i, engine, budget) in classes.items():
            rc = priced[cls_key] = engine.replica(n, budget, max_conc)
            if worst is None or rc.seconds > worst.seconds or (
                    rc.seconds == worst.seconds and i < worst_i):
                worst, worst_i = rc, i
        assert worst is not None
        violations: list[str] = []
        for replica, cls_key in zip(p.devices, members, strict=True):
            rc = priced[cls_key]
            if rc.violations:
                violations += [f"actor_generation replica {replica[0][0]}..: {v}"
                               for v in rc.violations]
        out = _TaskResult(worst.seconds, dict(worst.parts), tuple(violations), worst.concurrency)
        self._tasks[key] = out
        return out

    def replica_seconds(self, p: TaskPlacement) -> list[float]:
        """Each replica's time for an equal share of the batch, the task running alone (for
        generation: the KV cache gets the device memory left after its own weights). Used by the
        load balancer to estimate replica speeds."""
        wl = self.workload
        kind = self._info[p.task][0] if p.task in self._info else wl.task(p.task).kind
        shapes = self.shapes(p.task, p)
        steps = wl.optimizer_steps if kind == "training" else 1
        n = wl.samples / p.dp / steps
        usable = self.params.usable_memory_fraction
        out = []
        for hw in self.replica_hws(p):
            engine = self._engine(kind, shapes, hw)
            key = (engine, n)  # the engine holds the layout and hardware (and so the budget)
            rc = self._replica.get(key)
            if rc is None:
                if kind == "generation":
                    budget = tuple(round(st.memory_bytes * usable - s.weight_bytes, -6)
                                   for s, st in zip(shapes, engine.hw.stages, strict=True))
                    rc = engine.replica(n, budget, wl.gen_max_concurrency)
                else:
                    rc = engine.replica(n)
                self._replica[key] = rc
            out.append(rc.seconds)
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

    def task_alone(self, p: TaskPlacement) -> tuple[float, np.ndarray]:
        """A task's seconds when it runs alone on its devices (generation: its KV cache gets the
        memory left after its own weights; no input transfer) and the bytes it needs on each
        device (resident + working; generation: weights + one max-length sequence's KV).
        Used by the ILP, which prices each (task, device set, layout) candidate on its own."""
        mem = self.placement_memory(p)
        need = mem.weights + mem.states + mem.working
        if self.workload.task(p.task).kind == "generation":
            own = self._kv_pool(p, self._mem_bytes - mem.weights)
            seconds = self._generation(p, np.where(mem.weights > 0, own, 0.0)).seconds
            seq_max = (self.L.prompt_max + self.L.response_max) / self.L.seq_mean
            need = need + mem.kv_per_seq * seq_max
        else:
            seconds = self._forward_task_compute(p).seconds
        return seconds, need

    def _stage_index(self, p: TaskPlacement) -> tuple[np.ndarray, np.ndarray]:
        """Device ids flattened (replica, stage, rank) and the start of each (replica, stage)."""
        key = (len(p.device_ids), p.tp)
        starts = _STAGE_STARTS.get(key)
        if starts is None:
            starts = _STAGE_STARTS[key] = np.arange(0, key[0], key[1])
            starts.setflags(write=False)
        return p.device_array, starts

    def _forward_task(self, p: TaskPlacement, gen: TaskPlacement) -> _TaskResult:
        """An inference or training task, with its input transfer from generation."""
        key = (p, gen)
        out = self._tasks.get(key)
        if out is not None:
            return out
        kind = self._info[p.task][0]
        out = self._tasks.get(p)
        if out is None:
            # a pure function of the kind, stage shapes, grid and data shares: shared by tasks
            # of equal shapes on one layout (e.g. reward and critic inference of one model)
            # (shapes are interned and never dropped (``self._shapes``), so their id is theirs)
            compute_key = ("compute", kind, id(self.shapes(p.task, p)), p.devices, p.data_shares,
                           p.backend, p.offload)
            out = self._tasks.get(compute_key)
            if out is None:
                out = self._tasks[compute_key] = self._forward_task_compute(p)
            self._tasks[p] = out
        data_s = self._data_transfer(gen, p, kind)
        if data_s != 0.0:
            parts = dict(out.parts)
            parts["data"] += data_s
            out = _TaskResult(out.seconds + data_s, parts, out.violations)
        self._tasks[key] = out
        return out

    def _forward_task_compute(self, p: TaskPlacement) -> _TaskResult:
        wl = self.workload
        kind = wl.task(p.task).kind
        shapes = self.shapes(p.task, p)
        steps = wl.optimizer_steps if kind == "training" else 1
        worst: ReplicaCost | None = None
        engine_of, samples, priced = self._engine, wl.samples, self._replica
        group = wl.responses_per_prompt
        for share, hw in zip(p.data_shares, self.replica_hws(p), strict=True):
            # replicas on like hardware with equal shares are priced once (the engine holds the
            # layout and hardware); each as the slowest of the dp replicas would be
            n = samples * share / steps
            key = (engine_of(kind, shapes, hw), n, p.dp)
            rc = priced.get(key)
            if rc is None:
                rc = priced[key] = key[0].replica(n, straggler_load(n, p.dp, self.L, group))
            if worst is None or rc.seconds > worst.seconds:
                worst = rc
        assert worst is not None
        parts = {k: v * steps for k, v in worst.parts.items()}
        seconds = worst.seconds * steps
        if p.backend == "fsdp":
            n = samples * max(p.data_shares) / steps
            mbs = self._batching[kind]
            micro, _ = micro_count(n, mbs, self.L.seq_mean, straggler_load(n, p.dp, self.L, group))
            comm_s, opt_s = self._fsdp_comm_and_optimizer(p, shapes)
            if kind != "training":
                comm_s, opt_s = comm_s[1], 0.0  # one all-gather of the weights per micro-batch
            else:
                comm_s = comm_s[0] + comm_s[1]
            off_s = offload_seconds(kind, shapes[0], p.dp, self.params) if p.offload else 0.0
            step_s, exposed = fsdp_step_seconds(worst.seconds, micro, comm_s,
                                                opt_s, off_s)
            parts["dp"] += exposed * steps
            parts["hbm"] += opt_s * steps
            parts["offload"] += off_s * steps
            seconds = step_s * steps
        elif kind == "training":
            dp_s, opt_s = self._dp_and_optimizer(p, shapes)
            if self.workload.overlap_grad_reduce and dp_s > 0:
                n = samples * max(p.data_shares) / steps
                micro, _ = micro_count(n, self._batching[kind], self.L.seq_mean,
                                       straggler_load(n, p.dp, self.L, group))
                work = (worst.parts["compute"] + worst.parts["hbm"]) / max(micro, 1)
                dp_s = exposed_grad_sync(dp_s, work, 4.0 if self.workload.recompute else 3.0)
            parts["dp"] += dp_s * steps
            parts["hbm"] += opt_s * steps
            seconds += (dp_s + opt_s) * steps
        return _TaskResult(seconds, parts, ())

    def _dp_and_optimizer(self, p: TaskPlacement, shapes: tuple[StageShape, ...]) -> tuple[float, float]:
        """Gradient reduce-scatter + parameter all-gather over each DP group (ZeRO-1) and the
        sharded Adam step, per optimizer step (seconds). A pure function of the device grid and
        the stage shapes: memoised per cluster."""
        key = ("dp", p.devices, id(shapes))  # (shapes are interned: their id is theirs)
        out = self._tasklevel.get(key)
        if out is None:
            out = topology_memoised(
                self.cluster, "dp_optimizer", (p.devices, shapes, self.params),
                lambda: _dp_and_optimizer(self.cluster, p, shapes, self.params,
                                          self.workload.bytes_per_value))
            self._tasklevel[key] = out
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
        switch_s = switch_seconds(max(s.weight_bytes for s in shapes), self.params) \
            if shared else 0.0
        return calls_s, switch_s

    def _fsdp_comm_and_optimizer(self, p: TaskPlacement, shapes: tuple[StageShape, ...]
                                 ) -> tuple[tuple[float, float], float]:
        """((reduce-scatter of the gradients + one all-gather of the weights, one all-gather of
        the weights), the sharded optimizer step) seconds over an FSDP placement's group: a
        training micro-batch costs both collectives (weights gathered for forward and again for
        backward), an inference micro-batch the second."""
        key = ("fsdp", p.devices, id(shapes))
        out = self._tasklevel.get(key)
        if out is None:
            once, opt_s = self._dp_and_optimizer(p, shapes)  # reduce-scatter + one all-gather
            gather, _ = topology_memoised(
                self.cluster, "fsdp_gather", (p.devices, shapes, self.params),
                lambda: _dp_and_optimizer(self.cluster, p, shapes, self.params,
                                          self.workload.bytes_per_value, grad_bytes=0.0))
            out = self._tasklevel[key] = ((once, gather), opt_s)
        return out

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
        self._last_transfer = (gen, kind, p.devices, p.data_shares, worst)
        return worst

    def _weight_sync(self, gen: TaskPlacement, train: TaskPlacement) -> float:
        """Seconds of the weight sync: a pure function of the two device grids and layer splits
        (not of the data shares), memoised per cluster. From an FSDP trainer the shards are
        first all-gathered over its group (as verl's state-dict gather does); then, like a
        Megatron replica's, each rank's full copy is a source, never shared in place."""
        key = (gen.devices, gen.layers_per_stage, train.devices, train.layers_per_stage,
               train.backend)
        out = self._sync.get(key)
        if out is None:
            shapes = self.shapes(gen.task, gen)
            fsdp = train.backend == "fsdp"
            shared = self.workload.mode == "sync" and not fsdp
            extra = (gen.layers_per_stage, train.layers_per_stage, shapes, self.params, shared)
            out = topology_memoised(
                self.cluster, "weight_sync", (gen.devices, train.devices, extra),
                lambda: weight_sync_time(gen, shapes, train, self.cluster, self.params, shared))
            if fsdp:
                out += self._fsdp_comm_and_optimizer(train, self.shapes(train.task, train))[0][1]
            self._sync[key] = out
        return out

    # --- the estimate ---
    def estimate(self, plan: Plan, check: bool = True) -> Estimate:
        """Estimate ``plan``; ``check`` validates it first (schedulers that build valid plans
        may skip that)."""
        if check:
            validate(plan, self.workload, self.cluster)
        self.evaluations += 1
        cached = self._plans.get(plan.placements)
        if cached is not None:
            return cached
        if self.memo_entries() > MEMO_ENTRIES:
            self.clear_memos()
        est = self._estimate(plan)
        self._plans[plan.placements] = est
        return est

    def _own_memos(self) -> tuple[dict, ...]:
        return (self._plans, self._tasks, self._groups, self._memory, self._tasklevel,
                self._replica, self._sync)

    def memo_entries(self) -> int:
        """How many entries this cost model's own memos hold (not the shared, bounded ones)."""
        return sum(map(len, self._own_memos()))

    def clear_memos(self) -> None:
        """Empty this cost model's own memos (all at once: some are read on the others' hits).
        Estimates do not change, only their speed until the memos fill again."""
        for memo in self._own_memos():
            memo.clear()

    def _estimate(self, plan: Plan) -> Estimate:
        wl = self.workload
        placements = {p.task: p for p in plan.placements}
        gen = placements["actor_generation"]
        groups = self._group_results(plan)
        gen_result = [g.generation for g in groups if g.generation is not None][0]
        results: dict[str, _TaskResult] = {"actor_generation": gen_result}
        for p in plan.placements:
            if p.task != "actor_generation":
                results[p.task] = self._forward_task(p, gen)
        task_violations = tuple(itertools.chain.from_iterable(
            [r.violations for r in results.values() if r.violations]))
        memory = MemoryReport(tuple([(g.peak_ids, g.peak_bytes) for g in groups]),
                              tuple([(g.over, g.over_bytes) for g in groups if g.over.size]),
                              self._gpus)
        data_s = self._weight_sync(gen, placements["actor_training"])
        devices = {t: d for g in groups for t, d in g.device_sets}
        calls_s, switch_s = self.sync_overheads(gen, data_s, devices)
        sync_s = data_s + calls_s + switch_s
        seconds = {t: r.seconds for t, r in results.items()}
        if len(self._makespan) >= self._shared_entries:
            self._makespan.clear()
        it, chain = iteration_time(self._stages, seconds, devices, sync_s, wl.mode, wl.staleness,
                                   self.params.eta, self._makespan)
        tasks = {t: seconds.get(t, 0.0) for t in REPORTED_TASKS}
        tasks[WEIGHT_SYNC] = sync_s
        parts = {t: results[t].parts if t in results else _ZERO_PARTS for t in REPORTED_TASKS}
        parts[WEIGHT_SYNC] = {**_ZERO_PARTS, "data": data_s, "overhead": calls_s + switch_s}
        if not math.isfinite(it) or it <= 0:
            raise ValueError(f"cost model produced a non-finite iteration time {it!r}")
        return Estimate(
            iteration_s=float(it), tasks=tasks, parts=parts,
            feasible=not (memory.over or task_violations),
            samples_per_iteration=wl.samples, tokens_per_iteration=wl.samples * self.L.seq_mean,
            chain_s=float(chain), generation_concurrency=gen_result.concurrency,
            memory=memory, task_violations=task_violations,
        )

    def _group_results(self, plan: Plan) -> list[_GroupResult]:
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

    def _group(self, placements: tuple[TaskPlacement, ...], copies: tuple[str, ...]) -> _GroupResult:
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
            generation = self._generation(placements[mem.generation], budget)
            kv_used = np.minimum(np.maximum(budget, 0.0),
                                 generation.concurrency * mem.generation_kv_per_seq)
            peak_bytes = np.maximum(mem.need, mem.resident + kv_used)
        out = _GroupResult(mem.over, mem.over_bytes, mem.ids, peak_bytes, generation,
                           tuple(zip([p.task for p in placements], mem.device_sets,
                                     strict=True)))
        self._groups[key] = out
        return out

    def _group_memory(self, placements: tuple[TaskPlacement, ...], copies: tuple[str, ...]
                      ) -> _GroupMemory:
        """A task group's memory (see :class:`_GroupMemory` and
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
        out = _GroupMemory(need, resident, kv_budget, over, over_bytes, used.nonzero()[0],
                           generation, kv, tuple(device_sets))
        if len(self._group_mem) >= self._shared_entries:
            self._group_mem.clear()
        self._group_mem[key] = (slots, out)
        return out


def _dp_and_optimizer(cluster: ClusterSpec, p: TaskPlacement, shapes: tuple[StageShape, ...],
                      params: CostParams, bytes_per_value: int,
                      grad_bytes: float | None = None) -> tuple[float, float]:
    """(DP gradient sync, optimizer step) seconds per optimizer step of a training task on
    ``p``'s grid: see :meth:`CostModel._dp_and_optimizer` and
    :func:`hetrl.cost.kernels.dp_optimizer_seconds`. ``grad_bytes`` per parameter reduced
    (default ``params.grad_bytes``; 0: the weights' all-gather alone, as FSDP's second one)."""
    topo = cluster.topology
    hbm_eff, link_eff = topology_memoised(
        cluster, "dp_efficiency", params, lambda: (device_efficiency(cluster, params, "hbm"),
                                          device_efficiency(cluster, params, "link")))
    stage_params = _STAGE_PARAMS.get(shapes)
    if stage_params is None:
        if len(_STAGE_PARAMS) >= 10_000:
            _STAGE_PARAMS.clear()
        stage_params = _STAGE_PARAMS[shapes] = np.array([sh.params for sh in shapes], dtype=float)
        stage_params.setflags(write=False)
    dp_s, opt_s = dp_optimizer_seconds(
        _grid_array(p), stage_params,
        float(params.grad_bytes if grad_bytes is None else grad_bytes), float(bytes_per_value),
        float(params.optimizer_step_hbm_bytes), topo.hbm_Bps, hbm_eff, link_eff, topo.latency_s,
        topo.bandwidth_Bps, topo.node_of, topo.uplink_Bps)
    return float(dp_s), float(opt_s)


#: The first index of each (replica, stage) in a grid's flat device ids, per (devices, tp).
_STAGE_STARTS: dict[tuple[int, int], np.ndarray] = {}
#: Parameters per stage (one tp rank) of stage shapes, as an array (see _dp_and_optimizer).
_STAGE_PARAMS: dict[tuple[StageShape, ...], np.ndarray] = {}


def _grid_array(p: TaskPlacement) -> np.ndarray:
    """``p``'s device ids as a (dp, pp, tp) array."""
    return p.device_array.reshape(p.dp, p.pp, p.tp)


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


@lru_cache(maxsize=32)
def cost_model(workload: WorkloadSpec, cluster: ClusterSpec,
               params: CostParams = DEFAULT_PARAMS) -> CostModel:
    """A shared, memoised CostModel per (workload, cluster, params)."""
    return CostModel(workload, cluster, params)


def estimate(plan: Plan, workload: WorkloadSpec, cluster: ClusterSpec,
             params: CostParams = DEFAULT_PARAMS, check: bool = True) -> Estimate:
    """Estimate ``plan`` (see :class:`CostModel`)."""
    return cost_model(workload, cluster, params).estimate(plan, check=check)
