"""CostModel: the analytical estimate of one RL iteration of a plan (time, parts, memory).

Memoised per (task, device grid, layout, batch share): searches change one task at a time, so
most of a new plan's tasks hit the cache. A CostModel is bound to one workload, cluster and set
of parameters; :func:`estimate` keeps one per (workload, cluster, params).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import numpy as np

from hetrl.cost.flops import LM_HEAD_ROLES, StageShape, stage_shapes
from hetrl.cost.lengths import LengthStats, length_stats
from hetrl.cost.memory import task_memory
from hetrl.cost.params import DEFAULT_PARAMS, CostParams
from hetrl.cost.primitives import all_gather_time, group_links, hbm_time, reduce_scatter_time
from hetrl.cost.replica import ReplicaHW, replica_hw
from hetrl.cost.sync import weight_sync_time
from hetrl.cost.tasks import (
    PARTS,
    ReplicaCost,
    generation_replica,
    inference_replica,
    training_replica,
)
from hetrl.cost.workflow import iteration_time
from hetrl.plan import Plan, TaskPlacement, validate
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.tasks import REPORTED_TASKS, WEIGHT_SYNC
from hetrl.spec.workload import WorkloadSpec

#: Bytes per token moved from generation to an inference task (token ids, int32) and to a
#: training task (ids + old log-probs, reference log-probs, advantages, returns: 4 x fp32).
DATA_BYTES_PER_TOKEN = {"inference": 4.0, "training": 20.0}


@dataclass(frozen=True)
class Estimate:
    """The cost model's answer for one plan. Times in seconds, memory in GB (1e9 bytes)."""

    iteration_s: float
    tasks: dict[str, float]
    parts: dict[str, dict[str, float]]
    peak_memory_gb: dict[int, float]
    feasible: bool
    violations: tuple[str, ...]
    samples_per_iteration: int
    tokens_per_iteration: float
    chain_s: float
    generation_concurrency: int

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


@dataclass(frozen=True, eq=False)
class _PlacementMemory:
    copy: str
    weights: np.ndarray  # bytes per device (0 where unused)
    states: np.ndarray
    working: np.ndarray
    devices: np.ndarray
    kv_per_seq: np.ndarray  # generation: KV bytes of an average sequence per device


@dataclass(frozen=True)
class _TaskResult:
    seconds: float
    parts: dict[str, float]
    violations: tuple[str, ...]
    concurrency: int = 0


class CostModel:
    """Estimates plans of one ``workload`` on one ``cluster`` with ``params``."""

    def __init__(self, workload: WorkloadSpec, cluster: ClusterSpec,
                 params: CostParams = DEFAULT_PARAMS):
        self.workload = workload
        self.cluster = cluster
        self.params = params
        self.L: LengthStats = length_stats(workload)
        self.evaluations = 0
        self._hw: dict[Any, ReplicaHW] = {}
        self._shapes: dict[Any, tuple[StageShape, ...]] = {}
        self._replica: dict[Any, ReplicaCost] = {}
        self._memory: dict[Any, _PlacementMemory] = {}
        self._tasks: dict[Any, _TaskResult] = {}
        self._tasklevel: dict[Any, Any] = {}
        self._plans: dict[Any, Estimate] = {}
        self._sync: dict[Any, float] = {}
        self._mem_bytes = cluster.topology.memory_bytes * params.usable_memory_fraction

    # --- building blocks (memoised) ---
    def shapes(self, task: str, p: TaskPlacement) -> tuple[StageShape, ...]:
        role = self.workload.task(task).role
        key = (role, p.layers_per_stage, p.tp)
        out = self._shapes.get(key)
        if out is None:
            out = stage_shapes(self.workload.model(role), p.layers_per_stage, p.tp,
                               role in LM_HEAD_ROLES, self.workload.bytes_per_value)
            self._shapes[key] = out
        return out

    def hw(self, replica: tuple[tuple[int, ...], ...]) -> ReplicaHW:
        out = self._hw.get(replica)
        if out is None:
            out = replica_hw(self.cluster, replica)
            self._hw[replica] = out
        return out

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
        wl, kind = self.workload, self.workload.task(p.task).kind
        shapes = self.shapes(p.task, p)
        mbs = wl.micro_batch_size if kind == "training" else wl.inference_micro_batch_size
        n_total = wl.samples / (wl.optimizer_steps if kind == "training" else 1)
        n_dev = self.cluster.num_devices
        per_slot: list[tuple[float, float, float, float]] = []  # one per (replica, stage)
        seen: dict[tuple[int, float], tuple[float, float, float, float]] = {}
        for share in p.data_shares:
            for j, shape in enumerate(shapes):
                row = seen.get((j, share))
                if row is None:
                    mem = task_memory(kind, self._copy_name(p.task), shape, j, p.pp, p.dp,
                                      n_total * share, mbs, self.L, self.params, wl.recompute)
                    row = (mem.weight_bytes, mem.state_bytes, mem.working_bytes,
                           shape.kv_bytes_per_token * self.L.seq_mean)
                    seen[(j, share)] = row
                per_slot.append(row)
        flat = np.array(p.device_ids)
        values = np.repeat(np.array(per_slot), p.tp, axis=0)  # (devices, 4)
        weights, states, working, kv_per_seq = (np.zeros(n_dev) for _ in range(4))
        weights[flat], states[flat], working[flat], kv_per_seq[flat] = values.T
        out = _PlacementMemory(self._copy_name(p.task), weights, states, working, flat, kv_per_seq)
        self._memory[p] = out
        return out

    # --- tasks ---
    def _generation(self, p: TaskPlacement, kv_budget: np.ndarray) -> _TaskResult:
        shapes = self.shapes(p.task, p)
        flat, starts = self._stage_index(p)
        mins = np.round(np.minimum.reduceat(kv_budget[flat], starts), -6).reshape(p.dp, p.pp)
        budgets = tuple(map(tuple, mins.tolist()))
        key = (p, budgets)
        out = self._tasks.get(key)
        if out is not None:
            return out
        worst: ReplicaCost | None = None
        violations: list[str] = []
        for share, replica, budget in zip(p.data_shares, p.devices, budgets, strict=True):
            hw = self.hw(replica)
            n = self.workload.samples * share
            rkey = ("gen", shapes, hw, round(n, 6), budget)
            rc = self._replica.get(rkey)
            if rc is None:
                rc = generation_replica(shapes, hw, n, budget, self.L,
                                        self.workload.gen_max_concurrency, self.params)
                self._replica[rkey] = rc
            violations += [f"actor_generation replica {replica[0][0]}..: {v}" for v in rc.violations]
            if worst is None or rc.seconds > worst.seconds:
                worst = rc
        assert worst is not None
        out = _TaskResult(worst.seconds, dict(worst.parts), tuple(violations), worst.concurrency)
        self._tasks[key] = out
        return out

    def replica_seconds(self, p: TaskPlacement) -> list[float]:
        """Each replica's time for an equal share of the batch, the task running alone (for
        generation: the KV cache gets the device memory left after its own weights). Used by the
        load balancer to estimate replica speeds."""
        wl = self.workload
        kind = wl.task(p.task).kind
        shapes = self.shapes(p.task, p)
        steps = wl.optimizer_steps if kind == "training" else 1
        n = wl.samples / p.dp / steps
        out = []
        for replica in p.devices:
            hw = self.hw(replica)
            if kind == "generation":
                budget = tuple(round(st.memory_bytes * self.params.usable_memory_fraction
                                     - s.weight_bytes, -6) for s, st in zip(shapes, hw.stages,
                                                                           strict=True))
                key = ("gen", shapes, hw, round(n, 6), budget)
            else:
                key = (kind, shapes, hw, round(n, 6))
            rc = self._replica.get(key)
            if rc is None:
                if kind == "generation":
                    rc = generation_replica(shapes, hw, n, budget, self.L, wl.gen_max_concurrency,
                                            self.params)
                else:
                    rc = self._forward_replica(kind, shapes, hw, n)
                self._replica[key] = rc
            out.append(rc.seconds)
        return out

    def _memory_layers(self, plan: Plan) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray,
                                                   np.ndarray]:
        """Per device: weights of each model copy, trained states, the largest working set, and
        which devices the plan uses (bytes; arrays over all devices)."""
        copies: dict[str, np.ndarray] = {}
        states = working = None
        used = np.zeros(self.cluster.num_devices, dtype=bool)
        for p in plan.placements:
            m = self.placement_memory(p)
            prev = copies.get(m.copy)
            copies[m.copy] = m.weights if prev is None else np.maximum(prev, m.weights)
            states = m.states if states is None else states + m.states
            working = m.working if working is None else np.maximum(working, m.working)
            used[m.devices] = True
        assert states is not None and working is not None
        return copies, states, working, used

    def _kv_budget(self, resident: np.ndarray, working: np.ndarray) -> np.ndarray:
        kv_budget = self._mem_bytes - resident
        if self.workload.mode == "async":
            # vLLM keeps its KV pool allocated while other tasks run on a shared device.
            kv_budget = kv_budget - working
        return kv_budget

    def kv_budgets(self, plan: Plan) -> np.ndarray:
        """Bytes each device can give the generation engine's KV cache under ``plan``."""
        copies, states, working, _ = self._memory_layers(plan)
        return self._kv_budget(sum(copies.values()) + states, working)

    def task_alone(self, p: TaskPlacement) -> tuple[float, np.ndarray]:
        """A task's seconds when it runs alone on its devices (generation: its KV cache gets the
        memory left after its own weights; no input transfer) and the bytes it needs on each
        device (resident + working; generation: weights + one max-length sequence's KV).
        Used by the ILP, which prices each (task, device set, layout) candidate on its own."""
        mem = self.placement_memory(p)
        need = mem.weights + mem.states + mem.working
        if self.workload.task(p.task).kind == "generation":
            own = self._mem_bytes - mem.weights
            seconds = self._generation(p, np.where(mem.weights > 0, own, 0.0)).seconds
            seq_max = (self.L.prompt_max + self.L.response_max) / self.L.seq_mean
            need = need + mem.kv_per_seq * seq_max
        else:
            seconds = self._forward_task_compute(p).seconds
        return seconds, need

    def _stage_index(self, p: TaskPlacement) -> tuple[np.ndarray, np.ndarray]:
        """Device ids flattened (replica, stage, rank) and the start of each (replica, stage)."""
        key = ("stage_index", p)
        out = self._tasklevel.get(key)
        if out is None:
            out = (np.array(p.device_ids), np.arange(0, len(p.device_ids), p.tp))
            self._tasklevel[key] = out
        return out

    def _forward_task(self, p: TaskPlacement, gen: TaskPlacement) -> _TaskResult:
        out = self._tasks.get(p)
        if out is None:
            out = self._forward_task_compute(p)
            self._tasks[p] = out
        data_s = self._data_transfer(gen, p, self.workload.task(p.task).kind)
        if data_s == 0.0:
            return out
        parts = dict(out.parts)
        parts["data"] += data_s
        return _TaskResult(out.seconds + data_s, parts, out.violations)

    def _forward_task_compute(self, p: TaskPlacement) -> _TaskResult:
        wl = self.workload
        kind = wl.task(p.task).kind
        shapes = self.shapes(p.task, p)
        steps = wl.optimizer_steps if kind == "training" else 1
        worst: ReplicaCost | None = None
        for share, replica in zip(p.data_shares, p.devices, strict=True):
            hw = self.hw(replica)
            n = wl.samples * share / steps
            key = (kind, shapes, hw, round(n, 6))
            rc = self._replica.get(key)
            if rc is None:
                rc = self._forward_replica(kind, shapes, hw, n)
                self._replica[key] = rc
            if worst is None or rc.seconds > worst.seconds:
                worst = rc
        assert worst is not None
        parts = {k: v * steps for k, v in worst.parts.items()}
        seconds = worst.seconds * steps
        if kind == "training":
            dp_s, opt_s = self._dp_and_optimizer(p, shapes)
            parts["dp"] += dp_s * steps
            parts["hbm"] += opt_s * steps
            seconds += (dp_s + opt_s) * steps
        return _TaskResult(seconds, parts, ())

    def _forward_replica(self, kind: str, shapes: tuple[StageShape, ...], hw: ReplicaHW,
                         n: float) -> ReplicaCost:
        """One replica of an inference or training task over ``n`` sequences."""
        wl = self.workload
        if kind == "training":
            return training_replica(shapes, hw, n, wl.micro_batch_size, self.L, self.params,
                                    wl.recompute)
        return inference_replica(shapes, hw, n, wl.inference_micro_batch_size, self.L, self.params)

    def _dp_and_optimizer(self, p: TaskPlacement, shapes: tuple[StageShape, ...]) -> tuple[float, float]:
        """Gradient reduce-scatter + parameter all-gather over each DP group (ZeRO-1) and the
        sharded Adam step, per optimizer step (seconds)."""
        key = ("dp", p.task, p.devices, p.layers_per_stage)
        if key in self._tasklevel:
            return self._tasklevel[key], self._tasklevel[key + ("opt",)]
        params, topo = self.params, self.cluster.topology
        grid = np.array(p.devices)  # (dp, pp, tp)
        dp_s = opt_s = 0.0
        # All DP groups (one per stage and tp rank) reduce at once: a node's uplink is shared by
        # every group whose ring leaves the node.
        groups = [(j, k, tuple(grid[:, j, k].tolist())) for j in range(p.pp) for k in range(p.tp)]
        crossing = np.zeros(len(self.cluster.nodes))
        for _, _, members in groups:
            nodes = {int(topo.node_of[d]) for d in members}
            if len(nodes) > 1:
                crossing[list(nodes)] += 1
        for j, shape in enumerate(shapes):
            stage = grid[:, j, :]
            hbm = topo.hbm_Bps[stage].min()
            gpu = self.cluster.devices[int(stage[0, 0])].gpu.name
            opt_s = max(opt_s, hbm_time(shape.params * params.optimizer_step_hbm_bytes / p.dp,
                                        float(hbm), params.efficiency(gpu, "hbm")))
        if p.dp > 1:
            for j, _k, members in groups:
                shape = shapes[j]
                gpu = self.cluster.devices[members[0]].gpu.name
                eff = params.efficiency(gpu, "link")
                g = group_links(self.cluster, members)
                if g.nodes > 1:
                    nodes = list({int(topo.node_of[d]) for d in members})
                    share = float((topo.uplink_Bps[nodes] / crossing[nodes]).min())
                    g = replace(g, ring_Bps=min(g.ring_Bps, share),
                                inter_Bps=min(g.inter_Bps, share / max(g.per_node, 1)))
                t = (reduce_scatter_time(shape.params * params.grad_bytes, g, eff)
                     + all_gather_time(shape.params * self.workload.bytes_per_value, g, eff))
                dp_s = max(dp_s, t)
        self._tasklevel[key] = dp_s
        self._tasklevel[key + ("opt",)] = opt_s
        return dp_s, opt_s

    def _data_transfer(self, gen: TaskPlacement, p: TaskPlacement, kind: str) -> float:
        """Rollout data from the generation replicas to each replica of ``p`` (seconds)."""
        key = ("data", gen, p)
        if key in self._tasklevel:
            return self._tasklevel[key]
        src = tuple(r[0][0] for r in gen.devices)
        dst = tuple(r[0][0] for r in p.devices)
        topo = self.cluster.topology
        worst = 0.0
        eff = self.params.efficiency(self.cluster.devices[dst[0]].gpu.name, "link")
        for share, d in zip(p.data_shares, dst, strict=True):
            others = [s for s in src if s != d]
            if not others:
                continue
            nbytes = self.workload.samples * share * self.L.seq_mean * DATA_BYTES_PER_TOKEN[kind]
            lat = max(float(topo.latency_s[s, d]) for s in others)
            bw = min(float(topo.bandwidth_Bps[s, d]) for s in others)
            worst = max(worst, lat + nbytes / (bw * eff))
        self._tasklevel[key] = worst
        return worst

    def _weight_sync(self, gen: TaskPlacement, train: TaskPlacement) -> float:
        key = (gen, train)
        out = self._sync.get(key)
        if out is None:
            out = weight_sync_time(gen, self.shapes(gen.task, gen), train, self.cluster,
                                   self.params, shared_in_place=self.workload.mode == "sync")
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
        est = self._estimate(plan)
        if len(self._plans) < 200_000:
            self._plans[plan.placements] = est
        return est

    def _estimate(self, plan: Plan) -> Estimate:
        wl = self.workload
        placements = {p.task: p for p in plan.placements}
        copies, states, working, used = self._memory_layers(plan)
        resident = sum(copies.values()) + states
        need = resident + working
        kv_budget = self._kv_budget(resident, working)
        violations: list[str] = []
        for d in np.nonzero(used & (need > self._mem_bytes))[0].tolist():
            gpu = self.cluster.devices[d].gpu
            w = sum(float(c[d]) for c in copies.values())
            violations.append(
                f"device {d} ({gpu.name}): needs {need[d] / 1e9:.1f} GB (weights {w / 1e9:.1f}, "
                f"grads+optimizer {states[d] / 1e9:.1f}, working {working[d] / 1e9:.1f}) > usable "
                f"{self._mem_bytes[d] / 1e9:.1f} GB of {gpu.memory_gb:g} GB")
        # Tasks.
        gen = placements["actor_generation"]
        results: dict[str, _TaskResult] = {"actor_generation": self._generation(gen, kv_budget)}
        for p in plan.placements:
            if p.task != "actor_generation":
                results[p.task] = self._forward_task(p, gen)
        for r in results.values():
            violations.extend(r.violations)
        concurrency = results["actor_generation"].concurrency
        gm = self.placement_memory(gen)
        kv_used = np.minimum(np.maximum(kv_budget, 0.0), concurrency * gm.kv_per_seq)
        peak_bytes = np.maximum(need, resident + kv_used)
        ids = np.nonzero(used)[0]
        peak = dict(zip(ids.tolist(), (peak_bytes[ids] / 1e9).tolist(), strict=True))
        sync_s = self._weight_sync(gen, placements["actor_training"])
        seconds = {t: r.seconds for t, r in results.items()}
        devices = {p.task: frozenset(p.device_ids) for p in plan.placements}
        stages = [[t.name for t in wl.tasks if t.stage == s] for s in (0, 1, 2)]
        it, chain = iteration_time(stages, seconds, devices, sync_s, wl.mode, wl.staleness,
                                   self.params.eta)
        tasks = {t: seconds.get(t, 0.0) for t in REPORTED_TASKS}
        tasks[WEIGHT_SYNC] = sync_s
        parts = {t: r.parts for t, r in results.items()}
        parts[WEIGHT_SYNC] = {**dict.fromkeys(PARTS, 0.0), "data": sync_s}
        if not np.isfinite(it) or it <= 0:
            raise ValueError(f"cost model produced a non-finite iteration time {it!r}")
        return Estimate(
            iteration_s=float(it), tasks=tasks, parts=parts, peak_memory_gb=peak,
            feasible=not violations, violations=tuple(violations),
            samples_per_iteration=wl.samples, tokens_per_iteration=wl.samples * self.L.seq_mean,
            chain_s=float(chain), generation_concurrency=concurrency,
        )


@lru_cache(maxsize=32)
def cost_model(workload: WorkloadSpec, cluster: ClusterSpec,
               params: CostParams = DEFAULT_PARAMS) -> CostModel:
    """A shared, memoised CostModel per (workload, cluster, params)."""
    return CostModel(workload, cluster, params)


def estimate(plan: Plan, workload: WorkloadSpec, cluster: ClusterSpec,
             params: CostParams = DEFAULT_PARAMS, check: bool = True) -> Estimate:
    """Estimate ``plan`` (see :class:`CostModel`)."""
    return cost_model(workload, cluster, params).estimate(plan, check=check)
