"""The inference and training tasks of :class:`~hetrl.cost.model.CostModel`: each replica
priced by its forward engine (:func:`hetrl.cost.tasks.forward_engine`) at its straggler load,
then, per optimizer step, Megatron's DP sync (overlapped or not) and sharded Adam step, or
FSDP's per-micro-batch collectives and offload (docs/cost-model.md, "Inference", "Training",
"FSDP placements"). A mixin."""

from __future__ import annotations

import numpy as np

from hetrl.cost.batching import micro_count
from hetrl.cost.flops import StageShape
from hetrl.cost.fsdp import fsdp_step_seconds, megatron_offload_seconds, offload_seconds
from hetrl.cost.kernels import dp_optimizer_seconds
from hetrl.cost.memo import STAGE_PARAMS, topology_memoised
from hetrl.cost.params import CostParams
from hetrl.cost.primitives import device_efficiency
from hetrl.cost.result import TaskResult
from hetrl.cost.stragglers import straggler_load
from hetrl.cost.tasks import ReplicaCost, exposed_grad_sync
from hetrl.plan import TaskPlacement
from hetrl.spec.cluster import ClusterSpec


class ForwardTerms:
    """Inference and training tasks (mixed into CostModel)."""

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
            # (shapes are interned and never dropped (``self._shapes``), so their id is theirs)
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
        (seconds, with its parts). Not memoised here (:meth:`_forward_task` is)."""
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
        parts = {k: v * steps for k, v in worst.parts.items()}
        seconds = worst.seconds * steps
        if p.backend == "fsdp":
            micro = self._slowest_micro_batches(p, kind, steps)
            comm_s, opt_s = self._fsdp_comm_and_optimizer(p, shapes)
            if kind != "training":
                comm_s, opt_s = comm_s[1], 0.0  # one all-gather of the weights per micro-batch
            else:
                comm_s = comm_s[0] + comm_s[1]
            # verl onloads the shards once before a task's call and offloads them after it,
            # not around every optimizer step of the call
            off_s = offload_seconds(kind, shapes[0], p.dp, self.params) if p.offload else 0.0
            step_s, exposed = fsdp_step_seconds(worst.seconds, micro, comm_s, opt_s)
            parts["dp"] += exposed * steps
            parts["hbm"] += opt_s * steps
            parts["offload"] += off_s
            seconds = step_s * steps + off_s
        elif kind == "training":
            dp_s, opt_s = self._dp_and_optimizer(p, shapes)
            if self.workload.overlap_grad_reduce and dp_s > 0:
                micro = self._slowest_micro_batches(p, kind, steps)
                work = (worst.parts["compute"] + worst.parts["hbm"]) / micro
                dp_s = exposed_grad_sync(dp_s, work, 4.0 if self.workload.recompute else 3.0)
            parts["dp"] += dp_s * steps
            parts["hbm"] += opt_s * steps
            seconds += (dp_s + opt_s) * steps
        if p.offload and p.backend != "fsdp":  # Megatron's offload, once per call
            off_s = megatron_offload_seconds(kind, shapes, p.dp, self.params)
            parts["offload"] += off_s
            seconds += off_s
        fw = self._framework[kind]
        parts["framework"] = fw
        return TaskResult(seconds + fw, parts, ())

    def _slowest_micro_batches(self, p: TaskPlacement, kind: str, steps: int) -> int:
        """Micro-batches per optimizer step of ``p``'s largest-share replica at its straggler
        load (what FSDP's lockstep and Megatron's overlapped DP sync are timed against)."""
        n = self.workload.samples * max(p.data_shares) / steps
        load = straggler_load(n, p.dp, self.L, self.workload.responses_per_prompt)
        return micro_count(n, self._batching[p.task], self.L.seq_mean, load)[0]

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
    stage_params = STAGE_PARAMS.get(shapes)
    if stage_params is None:
        stage_params = np.array([sh.params for sh in shapes], dtype=float)
        stage_params.setflags(write=False)
        STAGE_PARAMS.put(shapes, stage_params)
    dp_s, opt_s = dp_optimizer_seconds(
        _grid_array(p), stage_params,
        float(params.grad_bytes if grad_bytes is None else grad_bytes), float(bytes_per_value),
        float(params.optimizer_step_hbm_bytes), topo.hbm_Bps, hbm_eff, link_eff, topo.latency_s,
        topo.bandwidth_Bps, topo.node_of, topo.uplink_Bps)
    return float(dp_s), float(opt_s)


def _grid_array(p: TaskPlacement) -> np.ndarray:
    """``p``'s device ids as a (dp, pp, tp) array."""
    return p.device_array.reshape(p.dp, p.pp, p.tp)
