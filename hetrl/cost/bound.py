"""Lower bounds on one iteration of a workload on a cluster, over every plan.

Two bounds, both computed from the workload and the cluster alone (no plan):

**The physical bound** (``iteration_s_lower_bound``): every FLOP at peak on all GPUs at once and
every unavoidable byte streamed at the cluster's full HBM bandwidth (efficiency 1, no network).
FLOPs: generation (prefill, whose output head runs for one position per sequence, + one forward
per generated token, attention over the growing context), a forward over every sequence for
each inference task, and 3 forwards (forward + backward) for each training task. Bytes: decode
must read the actor's weights once per decode step -- at least E[longest response] steps -- and
every KV entry of the context at every step. The bound is max(FLOPs / sum of peak FLOP/s,
bytes / sum of HBM bandwidth) seconds.

**The model bound** (``iteration_s_model_bound``): a lower bound on what the cost model
(``hetrl.cost.model``, under ``params``) charges any plan in the search space -- any subset of
GPUs, any grouping and co-location, any (dp, pp, tp), layer split and data weights. It adds
what the physical bound leaves out and every plan pays: the efficiency factors (the largest of
the cluster's GPU types per kernel kind), the workflow's stages in sequence in sync mode, and
the serial generation tail -- the replica with the most sequences decodes at least as many
steps as its longest response, each step paying the per-step overhead, a read of its weights
and, with tp > 1, the latency of its TP all-reduces. docs/cost-model.md derives each term and
why no plan beats it (a cross-region term is not in it: no bytes are forced across a region
cut, see there).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hetrl.cost.flops import LM_HEAD_ROLES, StageShape, stage_shapes
from hetrl.cost.lengths import LengthStats, length_stats
from hetrl.cost.params import DEFAULT_PARAMS, CostParams
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.workload import WorkloadSpec


def lower_bound(workload: WorkloadSpec, cluster: ClusterSpec,
                params: CostParams = DEFAULT_PARAMS) -> dict[str, float]:
    """The physical bound {iteration_s_lower_bound, compute_bound_s, memory_bound_s, flops,
    hbm_bytes} and the model bound {iteration_s_model_bound, model_generation_s,
    model_inference_s, model_training_s, model_work_s, generation_tail_s, generation_tail_tp,
    decode_steps, decode_step_s} (seconds; see the module docstring)."""
    L = length_stats(workload)
    n = workload.samples
    # (3 forwards per training task, with or without recomputation)
    flops = sum(w.flops * (0.75 if w.kind == "training" and workload.task_recompute(w.name)
                           else 1.0)
                for w in task_work(workload))
    actor = _full_shape(workload, "actor", generation=True)
    longest = workload.response_length.expected_max(n)
    kv_reads = n * (L.prompt_mean * L.response_mean + L.mean_age * L.response_mean)
    # (a mixture of experts reads, per step, at least the experts one token uses)
    hbm_bytes = longest * float(actor.decode_weight_bytes(1)) \
        + kv_reads * actor.kv_bytes_per_token
    topo = cluster.topology
    fp8 = workload.gen_fp8 or workload.train_fp8  # (every FLOP at the fastest peak it may use)
    peak = sum(max(d.gpu.fp8_flops, float(topo.flops[d.id])) if fp8 else float(topo.flops[d.id])
               for d in cluster.devices)
    compute_s = flops / peak
    memory_s = hbm_bytes / float(topo.hbm_Bps.sum())
    return {
        "iteration_s_lower_bound": max(compute_s, memory_s),
        "compute_bound_s": compute_s,
        "memory_bound_s": memory_s,
        "flops": flops,
        "hbm_bytes": hbm_bytes,
        **model_bound(workload, cluster, params),
    }


@dataclass(frozen=True)
class TaskWork:
    """One task's FLOPs over the whole batch (full model, tp = pp = 1), split by the kernel
    kind whose efficiency the cost model prices them at."""

    name: str
    kind: str  # generation, inference, training
    stage: int
    by_kind: tuple[tuple[str, float], ...]  # (efficiency kind, FLOPs)
    hidden: int  # the model's hidden size (the efficiency of sized kinds depends on it)

    @property
    def flops(self) -> float:
        return sum(f for _, f in self.by_kind)


def task_work(workload: WorkloadSpec) -> list[TaskWork]:
    """The FLOPs of every task of ``workload`` (what every plan computes, whatever its layout:
    per-rank FLOPs times tp summed over stages give these, and data shares sum to the batch)."""
    L = length_stats(workload)
    n = workload.samples
    out = []
    for t in workload.tasks:
        shape = _full_shape(workload, t.role)
        if t.kind == "generation":
            # the prefill computes the head once per sequence, each decode step once per token
            prefill = (n * L.prompt_mean * shape.matmul_flops_per_token
                       - n * max(L.prompt_mean - 1.0, 0.0) * shape.head_flops_per_token
                       + shape.attn_flops_per_token_ctx * n * L.prompt_mean ** 2 / 2)
            ctx_sum = n * (L.prompt_mean * L.response_mean + L.mean_age * L.response_mean)
            decode = (n * L.response_mean * shape.matmul_flops_per_token
                      + shape.attn_flops_per_token_ctx * ctx_sum)
            by_kind = (("infer_flops", prefill), ("decode_flops", decode))
        else:
            forward = (n * L.seq_mean * shape.matmul_flops_per_token
                       + shape.attn_flops_per_token_ctx * n * L.seq_sq_mean / 2)
            if t.kind == "training":
                by_kind = (("train_flops", (4.0 if workload.task_recompute(t.name) else 3.0)
                            * forward),)
            else:
                by_kind = (("infer_flops", forward),)
        out.append(TaskWork(t.name, t.kind, t.stage, by_kind, shape.model.hidden))
    return out


def model_bound(workload: WorkloadSpec, cluster: ClusterSpec,
                params: CostParams = DEFAULT_PARAMS) -> dict[str, float]:
    """The model bound and its terms (see the module docstring and docs/cost-model.md):

    - ``model_work_s``: every task's FLOPs at the best efficiency of its kernel kind on the
      cluster's summed peak FLOP/s;
    - ``model_generation_s``: the generation task, the largest of its FLOPs so priced, its HBM
      reads (weights once per decode step of a replica, every KV entry at every step) on the
      summed HBM bandwidth, and the serial tail ``generation_tail_s``;
    - ``model_inference_s`` / ``model_training_s``: the inference / training stage's FLOPs so
      priced (with ``params.eta`` set, eta x the largest task + (1 - eta) x their sum);
    - sync: the three in sequence; async with staleness k: the largest of that sum / (k + 1),
      ``model_work_s`` (the busiest device), the training stage and the generation task.
    """
    L = length_stats(workload)
    topo = cluster.topology
    types = {d.gpu.name for d in cluster.devices}

    def best(kind: str, hidden: int = 0) -> float:
        return max(params.flops_efficiency(g, kind, hidden) for g in types)

    peak = float(topo.flops.sum())
    work = task_work(workload)
    # per task: its FLOPs at the best efficiency of each kind, on all GPUs at once
    seconds = {w.name: sum(f / best(k, w.hidden) for k, f in w.by_kind) / peak for w in work}
    stages: list[list[TaskWork]] = [[w for w in work if w.stage == s] for s in (0, 1, 2)]

    def stage_s(tasks: list[TaskWork]) -> float:
        times = [seconds[w.name] for w in tasks]
        if not times:
            return 0.0
        if params.eta is not None:
            return params.eta * max(times) + (1 - params.eta) * sum(times)
        return sum(times)  # overlapping tasks run in turn, disjoint ones share the GPUs

    tail = generation_tail(workload, cluster, params)
    actor = _full_shape(workload, "actor", generation=True)
    kv_reads = workload.samples * (L.prompt_mean * L.response_mean + L.mean_age * L.response_mean)
    # every replica decodes at least E[R] steps (one sequence's), reading at least the weights
    # one token uses each step (a mixture of experts: all but the routed experts, and top_k)
    gen_hbm = (L.response_mean * float(actor.decode_weight_bytes(1))
               + kv_reads * actor.kv_bytes_per_token) / (float(topo.hbm_Bps.sum())
                                                         * best("decode_hbm"))
    generation = max(stage_s(stages[0]), gen_hbm, tail["generation_tail_s"])
    inference, training = stage_s(stages[1]), stage_s(stages[2])
    work_s = sum(seconds.values())
    chain = generation + inference + training
    if workload.mode == "sync":
        total = chain
    else:
        total = max(chain / (workload.staleness + 1), work_s, training, generation)
    return {
        "iteration_s_model_bound": total,
        "model_generation_s": generation,
        "model_inference_s": inference,
        "model_training_s": training,
        "model_work_s": work_s,
        **tail,
    }


def generation_tail(workload: WorkloadSpec, cluster: ClusterSpec,
                    params: CostParams = DEFAULT_PARAMS) -> dict[str, float]:
    """The serial decode of the busiest generation replica, minimised over its tp:

    with tp ranks per stage, at most N / tp replicas (N GPUs), so some replica holds at least
    n tp / N sequences and decodes at least ``decode_steps_lower_bound`` steps; each step
    costs at least the per-step overhead + the weights of one rank (W / tp) at the fastest HBM
    and best ``decode_hbm`` efficiency + (tp > 1) 2 x layers TP all-reduces, each at least
    2 ceil(log2 tp) x the smallest latency between two devices (2 x the smallest latency
    between nodes where tp exceeds every node's GPU count). Pipeline stages add per-step
    sends and never shorten a step, so pp = 1 is the minimum.

    {generation_tail_s, generation_tail_tp, decode_steps, decode_step_s} at the minimising tp.
    """
    L = length_stats(workload)
    topo = cluster.topology
    model = workload.model("actor")
    hbm = max(float(topo.hbm_Bps[d.id]) * params.efficiency(d.gpu.name, "decode_hbm")
              for d in cluster.devices)
    n_dev = cluster.num_devices
    lat_any, lat_cross = _min_latencies(cluster)
    per_node = max(node.count for node in cluster.nodes)
    best: dict[str, float] | None = None
    for tp in range(1, min(model.heads, n_dev) + 1):
        if model.heads % tp or (model.kv_heads % tp and tp % model.kv_heads):
            continue  # not a valid tp (plan.validate_layout)
        seqs = workload.samples / (n_dev // tp)
        steps = decode_steps_lower_bound(L, seqs, workload.gen_max_concurrency)
        tp_lat = 0.0
        if tp > 1:
            latency = 2 * _ceil_log2(tp) * lat_any
            if tp > per_node:
                latency = max(latency, 2 * lat_cross)
            tp_lat = 2 * model.layers * latency
        step = params.decode_step_overhead_s \
            + _step_weight_bytes(workload, n_dev // tp) / tp / hbm + tp_lat
        if best is None or steps * step < best["generation_tail_s"]:
            best = {"generation_tail_s": steps * step, "generation_tail_tp": float(tp),
                    "decode_steps": steps, "decode_step_s": step}
    assert best is not None  # tp = 1 is always valid
    return best


def _step_weight_bytes(workload: WorkloadSpec, replicas: int) -> float:
    """The fewest weight bytes one tp group reads per decode step (x tp: one rank's x tp): the
    cost model's decode read of one sequence (StageShape.decode_weight_bytes, which a mixture
    of experts lowers to all but the routed experts and those its tokens use), at the expert
    parallelism, dividing the experts and at most ``replicas``, that reads fewest."""
    moe = workload.model("actor").moe
    eps = [1] if moe is None else [e for e in range(1, min(moe.experts, max(replicas, 1)) + 1)
                                   if moe.experts % e == 0]
    return min(float(_full_shape(workload, "actor", generation=True, ep=e).decode_weight_bytes(1))
               for e in eps)


def decode_steps_lower_bound(L: LengthStats, seqs: float, max_concurrency: int) -> float:
    """The fewest decode steps the cost model charges a generation replica of ``seqs``
    sequences at any concurrency B in 1..``max_concurrency``: (seqs - B)+ E[R] / B saturated
    steps plus the drain of min(seqs, B) sequences, sum over s of P(any alive at s) (a drain
    counts at least one sequence: at least E[R] steps). Where the KV cache holds fewer
    sequences started together than B, the model drains m < B: (seqs - m) E[R] / B + drain(m),
    concave in m (the drain is), so at least its value at m = 1 or at m = B."""
    if seqs <= 0:
        return 0.0
    # B >= seqs all give the drain of every sequence: B beyond ceil(seqs) adds nothing
    top = max(1, min(max_concurrency, math.ceil(seqs)))
    with np.errstate(divide="ignore"):
        log_below = np.log(1.0 - L.survival)
    best = math.inf
    for lo in range(1, top + 1, 64):  # 64 concurrencies at a time: bounded memory
        B = np.arange(lo, min(lo + 64, top + 1), dtype=float)
        m = np.maximum(np.minimum(seqs, B), 1.0)
        drain = (1.0 - np.exp(np.outer(m, log_below))).sum(axis=1)
        saturated = np.maximum(seqs - B, 0.0) * L.response_mean / B
        best = min(best, float((saturated + drain).min()))
    # m = 1 at the largest B: (seqs - 1) E[R] / top + E[R]
    return min(best, max(seqs - 1, 0.0) * L.response_mean / top + float(L.survival.sum()))


def _min_latencies(cluster: ClusterSpec) -> tuple[float, float]:
    """The smallest one-way latency between two distinct devices, and between two devices on
    different nodes (inf where there is only one node)."""
    topo = cluster.topology
    lat = np.array(topo.latency_s)
    node = topo.node_of
    off = ~np.eye(len(node), dtype=bool)
    cross = node[:, None] != node[None, :]
    lat_any = float(lat[off].min()) if off.any() else math.inf
    lat_cross = float(lat[cross].min()) if cross.any() else math.inf
    return lat_any, lat_cross


def _ceil_log2(n: int) -> int:
    return max(1, math.ceil(math.log2(n)))


def _full_shape(workload: WorkloadSpec, role: str, generation: bool = False,
                ep: int = 1) -> StageShape:
    """``role``'s whole model on one rank (its experts over ``ep`` ranks); ``generation``: as
    the rollout holds it (FP8 weights and KV cache with ``gen_precision: fp8``)."""
    model = workload.model(role)
    (shape,) = stage_shapes(model, (model.layers,), 1, role in LM_HEAD_ROLES,
                            workload.bytes_per_value, ep=ep,
                            fp8_weights=generation and workload.gen_fp8)
    return shape
