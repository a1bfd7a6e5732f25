"""The physical limit of a workload on a cluster: every FLOP at peak on all GPUs at once and
every unavoidable byte streamed at the cluster's full HBM bandwidth (efficiency 1, no network).

FLOPs: generation (prefill, whose output head runs for one position per sequence, + one forward
per generated token, attention over the growing context), a forward over every sequence for
each inference task, and 3 forwards (forward + backward) for each training task. Bytes: decode
must read the actor's weights once per decode step -- at least E[longest response] steps -- and
every KV entry of the context at every step.
The bound is max(FLOPs / sum of peak FLOP/s, bytes / sum of HBM bandwidth) seconds.
"""

from __future__ import annotations

from hetrl.cost.flops import LM_HEAD_ROLES, stage_shapes
from hetrl.cost.lengths import length_stats
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.workload import WorkloadSpec


def lower_bound(workload: WorkloadSpec, cluster: ClusterSpec) -> dict[str, float]:
    """{iteration_s_lower_bound, flops, hbm_bytes, compute_bound_s, memory_bound_s}."""
    L = length_stats(workload)
    n = workload.samples
    flops = 0.0
    for t in workload.tasks:
        (shape,) = stage_shapes(workload.model(t.role), (workload.model(t.role).layers,), 1,
                                t.role in LM_HEAD_ROLES, workload.bytes_per_value)
        if t.kind == "generation":
            ctx_sum = n * (L.prompt_mean * L.response_mean + L.mean_age * L.response_mean)
            # the prefill computes the head once per sequence, each decode step once per token
            flops += (n * L.seq_mean * shape.matmul_flops_per_token
                      - n * max(L.prompt_mean - 1.0, 0.0) * shape.head_flops_per_token
                      + shape.attn_flops_per_token_ctx * (n * L.prompt_mean ** 2 / 2 + ctx_sum))
            actor = shape
        else:
            mult = 3.0 if t.kind == "training" else 1.0
            flops += mult * (n * L.seq_mean * shape.matmul_flops_per_token
                             + shape.attn_flops_per_token_ctx * n * L.seq_sq_mean / 2)
    longest = workload.response_length.expected_max(n)
    kv_reads = n * (L.prompt_mean * L.response_mean + L.mean_age * L.response_mean)
    hbm_bytes = longest * actor.weight_bytes + kv_reads * actor.kv_bytes_per_token
    topo = cluster.topology
    compute_s = flops / float(topo.flops.sum())
    memory_s = hbm_bytes / float(topo.hbm_Bps.sum())
    return {
        "iteration_s_lower_bound": max(compute_s, memory_s),
        "compute_bound_s": compute_s,
        "memory_bound_s": memory_s,
        "flops": flops,
        "hbm_bytes": hbm_bytes,
    }
