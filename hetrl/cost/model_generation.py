"""The generation task of :class:`~hetrl.cost.model.CostModel`: the memo tables around the
formulas of :mod:`hetrl.cost.generation` (each rollout replica priced by its engine,
:func:`hetrl.cost.tasks.generation_engine`, under the KV budget its devices leave, the slowest
replica counting; docs/cost-model.md, "Generation tasks"). A mixin: :class:`GenerationHost`
lists what it reads of its host."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

from hetrl.cost.expert_parallel import expert_parallel_seconds
from hetrl.cost.flops import StageShape
from hetrl.cost.generation import slowest_generation, stage_kv_budgets
from hetrl.cost.lengths import LengthStats
from hetrl.cost.memo import STAGE_STARTS
from hetrl.cost.params import CostParams
from hetrl.cost.replica import ReplicaHW
from hetrl.cost.result import TaskResult
from hetrl.plan import TaskPlacement
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.workload import WorkloadSpec


@runtime_checkable
class GenerationHost(Protocol):
    """What :class:`GenerationTerms` reads of the CostModel it is mixed into."""

    workload: WorkloadSpec
    #: per task kind the framework's seconds per call
    _framework: dict[str, float]
    #: memo: (placement, KV budgets) -> TaskResult
    _tasks: dict
    cluster: ClusterSpec
    params: CostParams
    L: LengthStats

    def shapes(self, task: str, p: TaskPlacement) -> tuple[StageShape, ...]: ...

    def replica_hws(self, p: TaskPlacement) -> tuple[ReplicaHW, ...]: ...

    def _engine(self, kind: str, shapes: tuple[StageShape, ...], hw: ReplicaHW,
                task: str = ...) -> Any: ...

    def fp8_violations(self, p: TaskPlacement) -> tuple[str, ...]: ...


class GenerationTerms:
    """The generation task (mixed into CostModel; host: :class:`GenerationHost`)."""

    def generation_cost(self, p: TaskPlacement, kv_budget: np.ndarray) -> TaskResult:
        """The generation task on ``p`` when each device gives its engine's KV cache
        ``kv_budget`` bytes (an array over all devices of the cluster; a stage's budget is the
        smallest of its devices', rounded to 1e6 bytes): the slowest replica's seconds and parts
        plus the framework's per-call seconds, every replica's violations, and the slowest's
        concurrency and phases (:func:`~hetrl.cost.generation.slowest_generation`). Memoised
        per (placement, rounded budgets)."""
        budgets = stage_kv_budgets(kv_budget, p.device_array, _stage_starts(p), p.dp, p.pp)
        key = (p, budgets)
        out = self._tasks.get(key)
        if out is not None:
            return out
        shapes = self.shapes(p.task, p)
        engine_of = self._engine
        engines = [engine_of("generation", shapes, hw) for hw in self.replica_hws(p)]
        wl = self.workload
        out = slowest_generation(
            engines, p.data_shares, budgets, p.devices, wl.samples, wl.gen_max_concurrency,
            self._framework["generation"])
        if p.ep > 1 or wl.gen_fp8:
            out = self._with_experts_and_fp8(p, shapes, out)
        self._tasks[key] = out
        return out

    def _with_experts_and_fp8(self, p: TaskPlacement, shapes: tuple[StageShape, ...],
                              out: TaskResult) -> TaskResult:
        """``out`` with expert parallelism's all-to-alls (every decode step and prefill chunk
        of the slowest replica, over its stages in turn: :func:`~hetrl.cost.expert_parallel.
        expert_parallel_seconds`) and FP8 on a GPU type without FP8 units as violations."""
        seconds, parts = out.seconds, out.parts
        if p.ep > 1:
            L, wl = self.L, self.workload
            n = wl.samples * max(p.data_shares)
            chunks = max(1.0, n * L.prompt_mean / self.params.prefill_chunk_tokens)
            ep_s = expert_parallel_seconds(
                self.cluster, p, shapes, self.params, "generation", out.phases[2] + chunks,
                n * (L.prompt_mean + L.response_mean), False, stages_in_series=True)
            parts = {**parts, "ep": ep_s}
            seconds += ep_s
        return TaskResult(seconds, parts, out.violations + self.fp8_violations(p),
                          out.concurrency, out.phases)


def _stage_starts(p: TaskPlacement) -> np.ndarray:
    """The index of each (replica, stage)'s first device in ``p``'s flattened device ids
    (memoised per device count and tp, read-only)."""
    key = (len(p.device_ids), p.tp)
    starts = STAGE_STARTS.get(key)
    if starts is None:
        starts = STAGE_STARTS.put(key, np.arange(0, key[0], key[1]))
        starts.setflags(write=False)
    return starts
