"""CostModel: the analytical estimate of one RL iteration of a plan (time, parts, memory).

The formulas are pure functions, one module per task kind: :mod:`~hetrl.cost.generation` (the
rollout), :mod:`~hetrl.cost.forward` (inference and training, Megatron and FSDP),
:mod:`~hetrl.cost.transfers` (rollout data, the weight sync's overheads) and
:mod:`~hetrl.cost.group_memory` (placements' and task groups' memory). CostModel is the caching
facade around them: its mixins :mod:`~hetrl.cost.model_generation`,
:mod:`~hetrl.cost.model_forward`, :mod:`~hetrl.cost.model_transfers` and
:mod:`~hetrl.cost.model_memory` key the memo tables and call the formulas (each declares what it
reads of CostModel in a Protocol), and CostModel builds the building blocks (stage shapes,
replica hardware, engines) and puts the answer together (:meth:`CostModel.estimate`, with
:mod:`~hetrl.cost.workflow`). Every memo table is named and bounded in :mod:`~hetrl.cost.memo`:
searches change one task at a time, so most of a new plan's tasks hit them. A CostModel is
bound to one workload, cluster and set of parameters; :func:`estimate` keeps one per (workload,
cluster, params). docs/cost-model.md, "Code layout", lists the public methods and their users.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from hetrl.cost.batching import Batching, micro_batching
from hetrl.cost.flops import LM_HEAD_ROLES, StageShape, stage_shapes
from hetrl.cost.framework import batch_tokens, task_framework_seconds
from hetrl.cost.lengths import LengthStats, length_stats
from hetrl.cost.memo import MODEL_FACTS, OwnTables, SharedTables
from hetrl.cost.model_forward import ForwardTerms
from hetrl.cost.model_generation import GenerationTerms
from hetrl.cost.model_memory import MemoryTerms
from hetrl.cost.model_transfers import TransferTerms
from hetrl.cost.params import DEFAULT_PARAMS, CostParams, optimizer_params
from hetrl.cost.primitives import node_symmetry
from hetrl.cost.profiles import framework_params
from hetrl.cost.replica import ReplicaHW, replica_hw
from hetrl.cost.result import Estimate, MemoryReport, TaskResult
from hetrl.cost.tasks import PARTS, forward_engine, generation_engine
from hetrl.cost.transfers import (
    DATA_BYTES_PER_TOKEN,
    dp_links,
    fan_in_links,
    sync_overhead_seconds,
)
from hetrl.cost.workflow import iteration_time
from hetrl.plan import Plan, TaskPlacement, fp8_lacking, validate
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.tasks import REPORTED_TASKS, WEIGHT_SYNC
from hetrl.spec.workload import WorkloadSpec

__all__ = ["DATA_BYTES_PER_TOKEN", "CostModel", "Estimate", "MemoryReport", "cost_model",
           "dp_links", "estimate", "fan_in_links"]

_ZERO_PARTS = dict.fromkeys(PARTS, 0.0)


@dataclass(frozen=True)
class _Facts:
    """Workload- and cluster-level facts of one (workload, cluster, params), and the tables
    every CostModel built for them shares."""

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
    #: per inference or training task its micro-batches: a sequence count (padding removed),
    #: or a Batching
    batching: dict[str, Any]
    #: per task kind its per-call framework seconds (hetrl.cost.framework)
    framework: dict[str, float]
    tables: SharedTables


class CostModel(GenerationTerms, ForwardTerms, TransferTerms, MemoryTerms):
    """Estimates plans of one ``workload`` on one ``cluster`` with ``params``."""

    def __init__(self, workload: WorkloadSpec, cluster: ClusterSpec,
                 params: CostParams = DEFAULT_PARAMS):
        self.workload = workload
        self.cluster = cluster
        # the per-step costs of the framework that runs the job (hetrl.cost.profiles), the bytes
        # per parameter its optimizer keeps
        self.params = params = optimizer_params(framework_params(params, workload.framework),
                                                workload.optimizer_precision)
        self.evaluations = 0
        own = self._own = OwnTables()
        # this cost model's tables (memo.OwnTables) under the names the terms use
        self._replica, self._memory, self._tasks = own.replica, own.memory, own.tasks
        self._tasklevel, self._plans, self._sync = own.tasklevel, own.plans, own.sync
        self._groups, self._briefs = own.groups, own.briefs
        #: (generation placement, kind, grid, data shares, seconds) of the last rollout
        #: transfer priced (see _data_transfer)
        self._last_transfer: tuple | None = None
        key = (id(workload), id(cluster), id(params))
        facts = MODEL_FACTS.get(key)
        if facts is None or facts.workload is not workload or facts.cluster is not cluster \
                or facts.params is not params:
            mem_bytes = cluster.topology.memory_bytes * params.usable_memory_fraction
            mem_bytes.setflags(write=False)
            facts = MODEL_FACTS.put(key, _Facts(
                workload, cluster, params, length_stats(workload), mem_bytes,
                info={t.name: (t.kind, t.role, self._copy_name(t.name)) for t in workload.tasks},
                stages=[[t.name for t in workload.tasks if t.stage == s] for s in (0, 1, 2)],
                gpus=tuple((d.gpu.name, d.gpu.memory_bytes / 1e9) for d in cluster.devices),
                symmetry=node_symmetry(cluster),
                batching={t.name: micro_batching(workload, t.kind, t.name)
                          for t in workload.tasks if t.kind != "generation"},
                framework=_framework(workload, params),
                # an entry of the device tables holds at most ~16 arrays over the devices
                tables=SharedTables(max(1000, 100_000_000 // (128 * cluster.num_devices)))))
        # the shared facts and tables under the names the terms use (see _Facts, SharedTables)
        tables = facts.tables
        self.L: LengthStats = facts.lengths
        self._batching: dict[str, int | Batching] = facts.batching
        self._framework: dict[str, float] = facts.framework
        self._mem_bytes = facts.mem_bytes
        self._info = facts.info
        self._stages = facts.stages
        self._gpus: tuple[tuple[str, float], ...] = facts.gpus
        self._symmetry = facts.symmetry
        #: per task kind whether it runs in FP8
        self._fp8 = {k: workload.fp8_for(k) for k in ("generation", "inference", "training")}
        #: per task how it recomputes activations (WorkloadSpec.task_recompute_mode)
        self._recompute = {t.name: workload.task_recompute_mode(t.name) for t in workload.tasks}
        self._copy_groups = tables.copy_groups
        self._shapes = tables.shapes
        self._hw = tables.hw
        self._engines = tables.engines
        self._dense = tables.dense
        self._group_mem = tables.group_mem
        self._makespan = tables.makespan
        self._hw_by_nodes = tables.hw_by_nodes
        self._slot_rows = tables.slot_rows

    def memoised(self, key: Any, compute: Any) -> Any:
        """``compute()``, memoised per ``key`` for this cost model: for callers' pure functions
        of a plan's parts under this workload, cluster and params (e.g. the load balancer)."""
        out = self._tasklevel.get(key)
        if out is None:
            out = self._tasklevel[key] = compute()
        return out

    def shapes(self, task: str, p: TaskPlacement) -> tuple[StageShape, ...]:
        info = self._info.get(task)
        if info is not None:
            kind, role = info[0], info[1]
        else:
            t = self.workload.task(task)
            kind, role = t.kind, t.role
        fp8 = self._fp8[kind]
        fp8_weights = fp8 and kind == "generation"  # (training keeps BF16 master weights)
        # (the common key: no expert parallelism, no FP8)
        key = (role, p.layers_per_stage, p.tp) if p.ep == 1 and not fp8 else (
            role, p.layers_per_stage, p.tp, p.ep, fp8_weights, fp8)
        out = self._shapes.get(key)
        if out is None:
            out = stage_shapes(self.workload.model(role), p.layers_per_stage, p.tp,
                               role in LM_HEAD_ROLES, self.workload.bytes_per_value, p.ep,
                               self.params.moe_load_imbalance, fp8_weights, fp8,
                               self.workload.sequence_parallel)
            # roles of equal stage shapes (e.g. reward and critic of one model) share one
            # object, so their engines, replica prices and task costs are shared too
            out = self._shapes.setdefault(("equal", out), out)
            self._shapes[key] = out
        return out

    def fp8_violations(self, p: TaskPlacement) -> tuple[str, ...]:
        """A task that runs in FP8 on devices without FP8 tensor cores: one violation, what
        :func:`~hetrl.plan.fp8_lacking` says (none otherwise; memoised)."""
        kind = self._info[p.task][0] if p.task in self._info else self.workload.task(p.task).kind
        if not self._fp8[kind]:
            return ()
        key = ("fp8", p.task, p.devices)
        out = self._tasklevel.get(key)
        if out is None:
            lacking = fp8_lacking(p, self.workload, self.cluster)
            out = self._tasklevel[key] = () if lacking is None else (lacking[1],)
        return out

    def hw(self, replica: tuple[tuple[int, ...], ...]) -> ReplicaHW:
        out = self._hw.get(replica)
        if out is None:
            out = self._hw.put(replica, replica_hw(self.cluster, replica))
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
                        hw = memo.put(key, self.hw(replica))  # (also stores it under ``replica``)
                    else:
                        raw.put(replica, hw)
            hws.append(hw)
        out = self._tasklevel[grid_key] = tuple(hws)
        return out

    def _engine(self, kind: str, shapes: tuple[StageShape, ...], hw: ReplicaHW,
                task: str = "actor_generation") -> Any:
        """The replica-cost engine of ``task`` (of ``kind``) for one layout on one replica's
        hardware; tasks of one kind and equal micro-batching share it."""
        batching = self._batching.get(task)
        recompute = self._recompute.get(task, "none")
        key = (kind, id(shapes), id(hw), batching, recompute)
        out = self._engines.get(key)
        if out is None or out[0] is not shapes or out[1] is not hw:  # (a copy's ids differ)
            wl = self.workload
            if kind == "generation":
                engine = generation_engine(shapes, hw, self.L, self.params, wl.gen_cuda_graphs)
            else:
                engine = forward_engine(kind, shapes, hw, self.L, self.params,
                                        batching, recompute, wl.tp_comm_overlap)
            out = self._engines.put(key, (shapes, hw, engine))
        return out[2]

    def framework_seconds(self, kind: str) -> float:
        """The RL framework's seconds per call of a task of ``kind`` ("generation", "inference",
        "training") over the iteration's batch (:func:`~hetrl.cost.framework.task_framework_seconds`),
        added once to each task's time as its ``framework`` part."""
        return self._framework[kind]

    def _copy_name(self, task: str) -> str:
        role = self.workload.task(task).role
        if task == "actor_generation" and self.workload.mode == "async":
            return "actor@generation"
        return role

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
            engine = self._engine(kind, shapes, hw, p.task)
            key = (engine, n)  # the engine holds the layout and hardware (and so the budget)
            rc = self._replica.get(key)
            if rc is None:
                if kind == "generation":
                    budget = tuple(round(st.memory_bytes * usable - s.weight_bytes, -6)
                                   for s, st in zip(shapes, engine.hw.stages, strict=True))
                    rc = engine.replica(n, budget, wl.gen_max_concurrency, wl.samples)
                else:
                    rc = engine.replica(n)
                self._replica[key] = rc
            out.append(rc.seconds)
        return out

    def task_alone(self, p: TaskPlacement) -> tuple[float, np.ndarray]:
        """A task's seconds when it runs alone on its devices (generation: its KV cache gets the
        memory left after its own weights; no input transfer) and the bytes it needs on each
        device (resident + working; generation: weights + one max-length sequence's KV).
        Used by the ILP, which prices each (task, device set, layout) candidate on its own."""
        mem = self.placement_memory(p)
        need = mem.weights + mem.states + mem.working
        if self.workload.task(p.task).kind == "generation":
            own = self._kv_pool(p, self._mem_bytes - mem.weights)
            seconds = self.generation_cost(p, np.where(mem.weights > 0, own, 0.0)).seconds
            seq_max = (self.L.prompt_max + self.L.response_max) / self.L.seq_mean
            need = need + mem.kv_per_seq * seq_max
        else:
            seconds = self.forward_task_cost(p).seconds
        return seconds, need

    def estimate(self, plan: Plan, check: bool = True) -> Estimate:
        """Estimate ``plan``; ``check`` validates it first (schedulers that build valid plans
        may skip that)."""
        if check:
            validate(plan, self.workload, self.cluster)
        self.evaluations += 1
        key = plan_key(plan)
        cached = self._plans.get(key)
        if cached is not None:
            return cached
        if self._own.full():
            self.clear_memos()
        est = self.estimate_uncached(plan)
        self._plans[key] = est
        return est

    def memo_entries(self) -> int:
        """How many entries this cost model's own tables hold (not the shared ones)."""
        return self._own.entries()

    def clear_memos(self) -> None:
        """Empty this cost model's own tables (all at once: some are read on the others' hits).
        Estimates do not change, only their speed until the tables fill again."""
        self._own.clear()

    def estimate_uncached(self, plan: Plan) -> Estimate:
        """Estimate ``plan`` without the plan-level memo and without validating it: every task,
        memory and sync term still comes from (or fills) its memo table. What :meth:`estimate`
        calls on a miss; the benchmark's warm-task path and the golden check's shared run."""
        wl = self.workload
        groups = self._group_results(plan)
        gen_result = [g.generation for g in groups if g.generation is not None][0]
        devices = {t: d for g in groups for t, d in g.device_sets}
        timing = self.timing(plan, gen_result, devices)
        results = timing.results
        task_violations = tuple(itertools.chain.from_iterable(
            [r.violations for r in results.values() if r.violations]))
        memory = MemoryReport(tuple([(g.peak_ids, g.peak_bytes) for g in groups]),
                              tuple([(g.over, g.over_bytes) for g in groups if g.over.size]),
                              self._gpus, tuple([(g.rows, g.kv_pool) for g in groups]),
                              self._mem_bytes)
        sync_s = timing.sync_s
        tasks = {t: results[t].seconds if t in results else 0.0 for t in REPORTED_TASKS}
        tasks[WEIGHT_SYNC] = sync_s
        parts = {t: results[t].parts if t in results else _ZERO_PARTS for t in REPORTED_TASKS}
        parts[WEIGHT_SYNC] = {**_ZERO_PARTS, "data": timing.data_s,
                              "overhead": timing.calls_s + timing.switch_s}
        return Estimate(
            iteration_s=timing.iteration_s, tasks=tasks, parts=parts,
            feasible=not (memory.over or task_violations),
            samples_per_iteration=wl.samples, tokens_per_iteration=wl.samples * self.L.seq_mean,
            chain_s=timing.chain_s, generation_concurrency=gen_result.concurrency,
            memory=memory, task_violations=task_violations,
            generation_phases=gen_result.phases,
        )

    def timing(self, plan: Plan, gen_result: TaskResult, devices: dict[str, frozenset[int]]
               ) -> Timing:
        """Everything of ``plan``'s estimate but its memory: each inference and training task
        (with its input transfer), the weight sync and the iteration's seconds, given the
        generation task's result under its KV budget ``gen_result`` and the devices each task
        uses ``devices``. :meth:`estimate_uncached` and the neighbourhood pricer
        (:mod:`hetrl.cost.neighbourhood`) both price through it."""
        wl = self.workload
        placements = {p.task: p for p in plan.placements}
        gen = placements["actor_generation"]
        results: dict[str, TaskResult] = {"actor_generation": gen_result}
        for p in plan.placements:
            if p.task != "actor_generation":
                results[p.task] = self._forward_task(p, gen)
        data_s = self._weight_sync(gen, placements["actor_training"], plan.sync_relay)
        # (the formula directly, not through sync_overheads: one call less per estimate)
        calls_s, switch_s = sync_overhead_seconds(self.shapes(gen.task, gen), self.params, data_s,
                                                  gen.task, devices, wl.mode == "sync",
                                                  wl.gen_sleep_level, wl.gen_cuda_graphs)
        sync_s = data_s + calls_s + switch_s
        seconds = {t: r.seconds for t, r in results.items()}
        if len(self._makespan) >= self._makespan.limit:  # (iteration_time fills it)
            self._makespan.clear()
        it, chain = iteration_time(self._stages, seconds, devices, sync_s, wl.mode, wl.staleness,
                                   self.params.eta, self._makespan)
        if not math.isfinite(it) or it <= 0:
            raise ValueError(f"cost model produced a non-finite iteration time {it!r}")
        return Timing(float(it), float(chain), results, data_s, calls_s, switch_s)


@dataclass(frozen=True, slots=True)
class Timing:
    """What :meth:`CostModel.timing` returns: the iteration's and the sync-mode chain's
    seconds, each task's result (generation's as given), and the weight sync's data, call and
    switch seconds."""

    iteration_s: float
    chain_s: float
    results: dict[str, TaskResult]
    data_s: float
    calls_s: float
    switch_s: float

    @property
    def sync_s(self) -> float:
        """The weight sync's seconds (data + calls + switch)."""
        return self.data_s + self.calls_s + self.switch_s


def plan_key(plan: Plan) -> Any:
    """A plan's key in the cost model's plan memo tables: its placements, and its relay where
    it has one (the placements alone key a plan without the relay: the common case stays
    cheap)."""
    return (plan.placements, True) if plan.sync_relay else plan.placements


def _framework(workload: WorkloadSpec, params: CostParams) -> dict[str, float]:
    """Per task kind the framework seconds of one call over the iteration's batch (as the
    driver holds it: padded to the maxima)."""
    tokens = batch_tokens(workload.samples, workload.prompt_length.max,
                          workload.response_length.max)
    return {kind: task_framework_seconds(kind, workload.samples, tokens,
                                         workload.reward == "rule", params)
            for kind in ("generation", "inference", "training")}


@lru_cache(maxsize=32)
def cost_model(workload: WorkloadSpec, cluster: ClusterSpec,
               params: CostParams = DEFAULT_PARAMS) -> CostModel:
    """A shared, memoised CostModel per (workload, cluster, params)."""
    return CostModel(workload, cluster, params)


def estimate(plan: Plan, workload: WorkloadSpec, cluster: ClusterSpec,
             params: CostParams = DEFAULT_PARAMS, check: bool = True) -> Estimate:
    """Estimate ``plan`` (see :class:`CostModel`)."""
    return cost_model(workload, cluster, params).estimate(plan, check=check)
