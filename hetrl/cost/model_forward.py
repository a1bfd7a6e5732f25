"""The inference and training tasks of :class:`~hetrl.cost.model.CostModel`: the memo tables
around the formulas of :mod:`hetrl.cost.forward` (each replica priced by its forward engine,
:func:`hetrl.cost.tasks.forward_engine`, at its straggler load, then, per optimizer step,
Megatron's DP sync, overlapped or not, and sharded Adam step, or FSDP's per-micro-batch
collectives and offload; docs/cost-model.md, "Inference", "Training", "FSDP placements").
A mixin: :class:`ForwardHost` lists what it reads of its host."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from hetrl.cost.batching import Batching
from hetrl.cost.expert_parallel import expert_parallel_seconds
from hetrl.cost.flops import StageShape, training_flops_mult
from hetrl.cost.forward import (
    dp_optimizer_step_seconds,
    fsdp_task_seconds,
    megatron_task_seconds,
    slowest_micro_batches,
)
from hetrl.cost.fsdp import megatron_offload_seconds, offload_seconds
from hetrl.cost.lengths import LengthStats
from hetrl.cost.memo import topology_memoised
from hetrl.cost.params import CostParams
from hetrl.cost.replica import ReplicaHW
from hetrl.cost.result import TaskResult
from hetrl.cost.stragglers import straggler_load
from hetrl.cost.tasks import ReplicaCost
from hetrl.plan import TaskPlacement
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.workload import WorkloadSpec


@runtime_checkable
class ForwardHost(Protocol):
    """What :class:`ForwardTerms` reads of the CostModel it is mixed into."""

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
    #: per task kind the framework's seconds per call
    _framework: dict[str, float]
    #: memo: task results per (placement, generation placement), placement, compute key
    _tasks: dict
    #: memo: a replica's cost per (engine, sequences, dp)
    _replica: dict
    #: memo: task-level terms (DP and FSDP collectives per grid and shapes)
    _tasklevel: dict

    def shapes(self, task: str, p: TaskPlacement) -> tuple[StageShape, ...]: ...

    def replica_hws(self, p: TaskPlacement) -> tuple[ReplicaHW, ...]: ...

    def _engine(self, kind: str, shapes: tuple[StageShape, ...], hw: ReplicaHW,
                task: str = ...) -> Any: ...

    def _data_transfer(self, gen: TaskPlacement, p: TaskPlacement, kind: str) -> float: ...

    def memoised(self, key: Any, compute: Any) -> Any: ...

    def fp8_violations(self, p: TaskPlacement) -> tuple[str, ...]: ...


class ForwardTerms:
    """Inference and training tasks (mixed into CostModel; host: :class:`ForwardHost`)."""

    def _forward_task(self, p: TaskPlacement, gen: TaskPlacement) -> TaskResult:
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
            # (shapes are interned and never dropped (CostModel.shapes), so their id is theirs)
            compute_key = ("compute", kind, id(self.shapes(p.task, p)), p.devices, p.data_shares,
                           p.backend, p.offload, self._batching[p.task])
            out = self._tasks.get(compute_key)
            if out is None:
                out = self._tasks[compute_key] = self.forward_task_cost(p)
            self._tasks[p] = out
        data_s = self._data_transfer(gen, p, kind)
        if data_s != 0.0:
            parts = dict(out.parts)
            parts["data"] += data_s
            out = TaskResult(out.seconds + data_s, parts, out.violations)
        self._tasks[key] = out
        return out

    def forward_task_cost(self, p: TaskPlacement) -> TaskResult:
        """An inference or training task on ``p`` without its input transfer: the slowest
        replica at its straggler load, times the optimizer steps, plus Megatron's DP sync and
        optimizer step or FSDP's collectives, the offload and the framework's per-call seconds
        (seconds, with its parts; :func:`~hetrl.cost.forward.megatron_task_seconds`,
        :func:`~hetrl.cost.forward.fsdp_task_seconds`). Not memoised here
        (:meth:`_forward_task` is)."""
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
            key = (engine_of(kind, shapes, hw, p.task), n, p.dp)
            rc = priced.get(key)
            if rc is None:
                rc = priced[key] = key[0].replica(n, straggler_load(n, p.dp, self.L, group))
            if worst is None or rc.seconds > worst.seconds:
                worst = rc
        assert worst is not None
        if p.backend == "fsdp":
            comm_s, opt_s = self._fsdp_comm_and_optimizer(p, shapes)
            # verl onloads the shards once before a task's call and offloads them after it,
            # not around every optimizer step of the call
            off_s = offload_seconds(kind, shapes[0], p.dp, self.params) if p.offload else 0.0
            seconds, parts = fsdp_task_seconds(kind, worst, steps,
                                               self._slowest_micro_batches(p, steps), comm_s,
                                               opt_s, off_s)
        else:
            dp_s = opt_s = 0.0
            micro = 0
            if kind == "training":
                dp_s, opt_s = self._dp_and_optimizer(p, shapes)
                if wl.overlap_grad_reduce and dp_s > 0:
                    micro = self._slowest_micro_batches(p, steps)
            # Megatron's offload, once per call
            off_s = megatron_offload_seconds(kind, shapes, p.dp, self.params) \
                if p.offload else None
            seconds, parts = megatron_task_seconds(kind, worst, steps, dp_s, opt_s, micro,
                                                   training_flops_mult(shapes[0].model,
                                                                       self._recompute[p.task]),
                                                   off_s)
        if p.ep > 1:  # the slowest replica's micro-batch slots of the 1F1B pipeline
            micro = self._slowest_micro_batches(p, steps)
            slots = steps * (micro + p.pp - 1)
            tokens = samples * max(p.data_shares) / steps * self.L.seq_mean / micro * slots
            recompute = self._recompute[p.task]
            ep_s = self.memoised(("ep", p.devices, p.ep, id(shapes), kind, slots, tokens,
                                  recompute),
                                 lambda: expert_parallel_seconds(
                                     self.cluster, p, shapes, self.params, kind, slots, tokens,
                                     recompute, stages_in_series=False))
            parts["ep"] = ep_s
            seconds += ep_s
        fw = self._framework[kind]
        parts["framework"] = fw
        return TaskResult(seconds + fw, parts, self.fp8_violations(p))

    def _slowest_micro_batches(self, p: TaskPlacement, steps: int) -> int:
        """:func:`~hetrl.cost.forward.slowest_micro_batches` of ``p``'s largest-share replica."""
        wl = self.workload
        return slowest_micro_batches(wl.samples * max(p.data_shares) / steps, p.dp, self.L,
                                     wl.responses_per_prompt, self._batching[p.task])

    def _dp_and_optimizer(self, p: TaskPlacement, shapes: tuple[StageShape, ...]) -> tuple[float, float]:
        """:func:`~hetrl.cost.forward.dp_optimizer_step_seconds` of ``p``'s grid (seconds per
        optimizer step), memoised per cluster and in this cost model."""
        key = ("dp", p.devices, id(shapes))  # (shapes are interned: their id is theirs)
        out = self._tasklevel.get(key)
        if out is None:
            out = topology_memoised(
                self.cluster, "dp_optimizer", (p.devices, shapes, self.params),
                lambda: dp_optimizer_step_seconds(self.cluster, p, shapes, self.params,
                                                  self.workload.bytes_per_value))
            self._tasklevel[key] = out
        return out

    def _fsdp_comm_and_optimizer(self, p: TaskPlacement, shapes: tuple[StageShape, ...]
                                 ) -> tuple[tuple[float, float], float]:
        """((reduce-scatter of the gradients + one all-gather of the weights, one all-gather of
        the weights), the sharded optimizer step) seconds over an FSDP placement's group: a
        training micro-batch costs both collectives (weights gathered for forward and again for
        backward), an inference micro-batch the second. Memoised per cluster and in this cost
        model."""
        key = ("fsdp", p.devices, id(shapes))
        out = self._tasklevel.get(key)
        if out is None:
            once, opt_s = self._dp_and_optimizer(p, shapes)  # reduce-scatter + one all-gather
            gather, _ = topology_memoised(
                self.cluster, "fsdp_gather", (p.devices, shapes, self.params),
                lambda: dp_optimizer_step_seconds(self.cluster, p, shapes, self.params,
                                                  self.workload.bytes_per_value, grad_bytes=0.0))
            out = self._tasklevel[key] = ((once, gather), opt_s)
        return out
