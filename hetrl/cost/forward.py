"""The inference and training tasks' formulas over explicit inputs (docs/cost-model.md,
"Inference", "Training", "FSDP placements"): the micro-batches the slowest replica runs, the
DP sync and sharded optimizer step over a device grid, and a task's seconds and parts from its
slowest replica's under Megatron or FSDP. No memo tables of a cost model here:
:class:`~hetrl.cost.model_forward.ForwardTerms` looks them up and stores what these return."""

from __future__ import annotations

import numpy as np

from hetrl.cost.batching import Batching, micro_count
from hetrl.cost.flops import StageShape
from hetrl.cost.fsdp import fsdp_step_seconds
from hetrl.cost.kernels import dp_optimizer_seconds
from hetrl.cost.lengths import LengthStats
from hetrl.cost.memo import STAGE_PARAMS, topology_memoised
from hetrl.cost.params import CostParams
from hetrl.cost.primitives import device_efficiency
from hetrl.cost.stragglers import straggler_load
from hetrl.cost.tasks import ReplicaCost, exposed_grad_sync
from hetrl.plan import TaskPlacement
from hetrl.spec.cluster import ClusterSpec


def slowest_micro_batches(n: float, dp: int, lengths: LengthStats, responses_per_prompt: int,
                          batching: int | Batching) -> int:
    """Micro-batches per optimizer step of a replica holding ``n`` sequences (the largest
    share's) at its straggler load among ``dp`` replicas (what FSDP's lockstep and Megatron's
    overlapped DP sync are timed against)."""
    load = straggler_load(n, dp, lengths, responses_per_prompt)
    return micro_count(n, batching, lengths.seq_mean, load)[0]


def dp_optimizer_step_seconds(cluster: ClusterSpec, p: TaskPlacement,
                              shapes: tuple[StageShape, ...], params: CostParams,
                              bytes_per_value: int, grad_bytes: float | None = None
                              ) -> tuple[float, float]:
    """(DP gradient sync, sharded optimizer step) seconds per optimizer step of a training task
    on ``p``'s (dp, pp, tp) grid with stages ``shapes``: the gradients' reduce-scatter and the
    parameters' all-gather over each DP group (ZeRO-1), and the Adam step streaming each rank's
    shard (:func:`hetrl.cost.kernels.dp_optimizer_seconds`). ``grad_bytes`` per parameter
    reduced (default ``params.grad_bytes``; 0: the weights' all-gather alone, as FSDP's second
    one). With expert parallelism (ep > 1) the routed experts' gradients go over the expert
    data-parallel groups (dp / ep replicas each) and their optimizer shards over those. The
    cluster's device efficiencies and the shapes' parameter counts are memoised per cluster and
    per shapes (pure functions of them)."""
    topo = cluster.topology
    hbm_eff, link_eff = topology_memoised(
        cluster, "dp_efficiency", params, lambda: (device_efficiency(cluster, params, "hbm"),
                                                   device_efficiency(cluster, params, "link")))
    stage_params = STAGE_PARAMS.get(shapes)
    if stage_params is None:
        stage_params = np.array([sh.params for sh in shapes], dtype=float)
        stage_params.setflags(write=False)
        STAGE_PARAMS.put(shapes, stage_params)
    grid = p.device_array.reshape(p.dp, p.pp, p.tp)
    grads = float(params.grad_bytes if grad_bytes is None else grad_bytes)
    ep = shapes[0].ep
    if ep == 1:  # (expert parameters, if any, are reduced with the rest over the DP group)
        dp_s, opt_s = dp_optimizer_seconds(
            grid, stage_params, grads, float(bytes_per_value),
            float(params.optimizer_step_hbm_bytes), topo.hbm_Bps, hbm_eff, link_eff,
            topo.latency_s, topo.bandwidth_Bps, topo.node_of, topo.uplink_Bps)
        return float(dp_s), float(opt_s)
    # expert parallelism: the non-expert parameters over the dp replicas, each rank's experts
    # over the dp / ep replicas that hold the same ones (replicas i, i + ep, i + 2 ep, ...),
    # one after the other
    experts = np.array([sh.expert_params for sh in shapes], dtype=float)
    out = [0.0, 0.0]
    expert_grid = np.ascontiguousarray(grid.reshape(p.dp // ep, ep, p.pp, p.tp).transpose(
        0, 2, 3, 1).reshape(p.dp // ep, p.pp, p.tp * ep))
    for g, per_stage in ((grid, stage_params - experts), (expert_grid, experts)):
        dp_s, opt_s = dp_optimizer_seconds(
            g, per_stage, grads, float(bytes_per_value), float(params.optimizer_step_hbm_bytes),
            topo.hbm_Bps, hbm_eff, link_eff, topo.latency_s, topo.bandwidth_Bps, topo.node_of,
            topo.uplink_Bps)
        out[0] += float(dp_s)
        out[1] += float(opt_s)
    return out[0], out[1]


def fsdp_task_seconds(kind: str, worst: ReplicaCost, steps: int, micro_batches: int,
                      comm_s: tuple[float, float], optimizer_s: float, offload_s: float
                      ) -> tuple[float, dict[str, float]]:
    """(seconds, parts) of an FSDP task of ``kind`` over ``steps`` optimizer steps, its slowest
    replica taking ``worst`` per step in ``micro_batches`` micro-batches that move in lockstep
    with the group's collectives (:func:`hetrl.cost.fsdp.fsdp_step_seconds`). ``comm_s``: per
    micro-batch (the gradients' reduce-scatter + one weight all-gather, one weight all-gather)
    seconds: training pays both, inference the second and no ``optimizer_s``; ``offload_s``:
    the shards' trip to host memory and back, once per call (0 without offload)."""
    parts = {k: v * steps for k, v in worst.parts.items()}
    if kind != "training":
        comm, optimizer_s = comm_s[1], 0.0  # one all-gather of the weights per micro-batch
    else:
        comm = comm_s[0] + comm_s[1]
    step_s, exposed = fsdp_step_seconds(worst.seconds, micro_batches, comm, optimizer_s)
    parts["dp"] += exposed * steps
    parts["hbm"] += optimizer_s * steps
    parts["offload"] += offload_s
    return step_s * steps + offload_s, parts


def megatron_task_seconds(kind: str, worst: ReplicaCost, steps: int, dp_s: float,
                          optimizer_s: float, overlap_micro_batches: int, flops_mult: float,
                          offload_s: float | None) -> tuple[float, dict[str, float]]:
    """(seconds, parts) of a Megatron task of ``kind`` over ``steps`` optimizer steps, its
    slowest replica taking ``worst`` per step. Training adds per step its DP sync ``dp_s`` and
    sharded optimizer step ``optimizer_s`` (seconds, :func:`dp_optimizer_step_seconds`); with
    ``--overlap-grad-reduce`` (``overlap_micro_batches`` > 0: the slowest replica's
    micro-batches per step) only the sync's part not hidden behind the last micro-batch's
    backward (:func:`hetrl.cost.tasks.exposed_grad_sync`; ``flops_mult``: the training pass's
    FLOPs over the forward's, :func:`hetrl.cost.flops.training_flops_mult`). ``offload_s``: the
    weights' and states' trip to host memory and back, once per call (None: no offload)."""
    parts = {k: v * steps for k, v in worst.parts.items()}
    seconds = worst.seconds * steps
    if kind == "training":
        if overlap_micro_batches:
            work = (worst.parts["compute"] + worst.parts["hbm"]) / overlap_micro_batches
            dp_s = exposed_grad_sync(dp_s, work, flops_mult)
        parts["dp"] += dp_s * steps
        parts["hbm"] += optimizer_s * steps
        seconds += (dp_s + optimizer_s) * steps
    if offload_s is not None:
        parts["offload"] += offload_s
        seconds += offload_s
    return seconds, parts
