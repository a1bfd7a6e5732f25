"""Per-task figures engineers compare: where each task runs, tokens per second per GPU, MFU of
training and inference, HBM-bandwidth utilisation of generation (docs/cost-model.md, "Per-task
figures").

Computed from a finished :class:`~hetrl.cost.result.Estimate` and its plan, once per printed
estimate (never inside a search), so the estimate itself and every number it holds are unchanged.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from hetrl.cost.flops import LM_HEAD_ROLES, stage_shapes
from hetrl.cost.lengths import length_stats
from hetrl.plan import Plan
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.workload import WorkloadSpec

#: forward + backward FLOPs over forward FLOPs (backward = 2 x forward; recomputation is not
#: model FLOPs and is not counted, as MFU is defined by Chowdhery et al. 2022)
TRAINING_FLOPS_FACTOR = 3.0


def where_task_runs(placement: Any, cluster: ClusterSpec) -> dict[str, Any]:
    """A placement's GPUs by type and region: ``gpus`` (count), ``by_type_region`` (list of
    {gpu, region, count}, in device order), ``nodes`` (names, in device order), dp/pp/tp and
    the device ids."""
    ids = sorted({d for replica in placement.devices for stage in replica for d in stage})
    devices = [cluster.device(i) for i in ids]
    groups = Counter((d.gpu.name, d.region) for d in devices)
    return {
        "gpus": len(ids),
        "by_type_region": [{"gpu": g, "region": r, "count": n} for (g, r), n in groups.items()],
        "nodes": list(dict.fromkeys(d.node for d in devices)),
        "dp": placement.dp, "pp": placement.pp, "tp": placement.tp,
        **({"ep": placement.ep} if placement.ep > 1 else {}),
        "devices": ids,
    }


def where_text(info: dict[str, Any]) -> str:
    """``16 x H100 (us-east-1), 8 x L40S (us-west-2)``."""
    return ", ".join(f"{g['count']} x {g['gpu']} ({g['region']})" for g in info["by_type_region"])


def forward_flops_per_sample(workload: WorkloadSpec, role: str) -> float:
    """Model FLOPs of one forward pass over one sample (prompt + response) of ``role``'s model:
    2 x (matmul parameters) per token, the output head (vocabulary or scalar) included, plus the
    causal attention scores, 4 x layers x heads x head_dim per token per earlier token, summed
    over the sequence: E[L^2] / 2 per sample."""
    model = workload.model(role)
    shape = stage_shapes(model, (model.layers,), 1, role in LM_HEAD_ROLES,
                         workload.bytes_per_value)[0]
    L = length_stats(workload)
    return shape.matmul_flops_per_token * L.seq_mean + shape.attn_flops_per_token_ctx \
        * L.seq_sq_mean / 2


def generation_bytes_read(workload: WorkloadSpec, dp: int, decode_steps: float,
                          ep: int = 1) -> float:
    """HBM bytes the rollout reads in one iteration: every replica reads its whole model's
    weights (its 1 / ``ep`` share of the routed experts, all of them: an upper bound where a
    step's batch uses only some) once per decode step (``decode_steps``: the slowest replica's,
    applied to all ``dp`` replicas), and each generated token reads the KV cache of its context
    (prompt plus the tokens before it): E[P x R + R^2 / 2] tokens of KV per sample."""
    model = workload.model("actor")
    shape = stage_shapes(model, (model.layers,), 1, True, workload.bytes_per_value, ep,
                         fp8_weights=workload.gen_fp8)[0]
    L = length_stats(workload)
    er2 = L.response_var + L.response_mean ** 2
    kv_tokens = L.prompt_mean * L.response_mean + er2 / 2
    return dp * decode_steps * shape.weight_bytes \
        + workload.samples * kv_tokens * shape.kv_bytes_per_token


def tasks_detail(est: Any, plan: Plan, workload: WorkloadSpec,
                 cluster: ClusterSpec) -> dict[str, dict[str, Any]]:
    """Per task of the workload (in its order): where it runs, its seconds, ``tokens`` per
    iteration (generation: generated tokens; inference and training: prompt + response tokens
    processed), ``tokens_per_s_per_gpu`` = tokens / (seconds x GPUs), ``mfu`` (training and
    inference: model FLOPs / (seconds x the sum of the GPUs' peak bf16 FLOP/s); null for
    generation) and ``hbm_utilisation`` (generation: HBM bytes read / (seconds x the sum of the
    GPUs' memory bandwidth); null otherwise). Seconds are the task's own (not the iteration's)."""
    placements = {p.task: p for p in plan.placements}
    L = length_stats(workload)
    topo = cluster.topology
    out: dict[str, dict[str, Any]] = {}
    for task in workload.tasks:
        p = placements.get(task.name)
        if p is None:
            continue
        info = where_task_runs(p, cluster)
        seconds = float(est.tasks.get(task.name, 0.0))
        ids = info["devices"]
        gpus = len(ids)
        peak = float(sum(topo.flops[i] for i in ids))
        hbm = float(sum(topo.hbm_Bps[i] for i in ids))
        row: dict[str, Any] = {"kind": task.kind, **info, "seconds": seconds}
        if task.kind == "generation":
            tokens = workload.samples * L.response_mean
            read = generation_bytes_read(workload, p.dp, est.generation_phases[2], p.ep)
            row["mfu"] = None
            row["hbm_utilisation"] = read / (seconds * hbm) if seconds > 0 else None
        else:
            tokens = workload.samples * L.seq_mean
            flops = workload.samples * forward_flops_per_sample(workload, task.role)
            if task.kind == "training":
                flops *= TRAINING_FLOPS_FACTOR
            row["mfu"] = flops / (seconds * peak) if seconds > 0 else None
            row["hbm_utilisation"] = None
        row["tokens"] = tokens
        row["tokens_per_s_per_gpu"] = tokens / (seconds * gpus) if seconds > 0 else None
        out[task.name] = row
    return out
