"""A quick check that a job can fit on a cluster at all, before any search."""

from __future__ import annotations

from hetrl.cost.fsdp import trained_shard_bytes
from hetrl.cost.params import DEFAULT_PARAMS, CostParams, optimizer_params
from hetrl.errors import InfeasibleError
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.workload import WorkloadSpec


def minimum_memory_bytes(workload: WorkloadSpec, params: CostParams = DEFAULT_PARAMS) -> float:
    """Bytes that must be resident somewhere: every model's weights once (the reference and
    reward models, the actor once -- twice in async mode -- and the critic), plus gradients and
    optimizer states of the trained models, each once (sharded over all devices at best); a
    trained model's weights are its master copy where the optimizer keeps one (FSDP keeps no
    other shard: :func:`~hetrl.cost.fsdp.trained_shard_bytes`), with its gradients."""
    params = optimizer_params(params, workload.optimizer_precision)
    total = 0.0
    bpv = workload.bytes_per_value
    trained = sum(trained_shard_bytes(bpv, params)) + params.grad_bytes
    for role, model in workload.models:
        if role in ("actor", "critic"):
            total += model.params * trained
        else:
            total += model.params * bpv
    if workload.mode == "async":
        total += workload.model("actor").params * bpv
    return total


def check_fits(workload: WorkloadSpec, cluster: ClusterSpec,
               params: CostParams = DEFAULT_PARAMS) -> None:
    """Raise :class:`InfeasibleError` saying by how much the models exceed the cluster's memory."""
    need = minimum_memory_bytes(workload, params)
    have = float(cluster.topology.memory_bytes.sum()) * params.usable_memory_fraction
    if need > have:
        raise InfeasibleError(
            f"{workload.name} cannot fit on {cluster.name}: its models need at least "
            f"{need / 1e9:.1f} GB resident (weights, gradients and optimizer states) but the "
            f"cluster has {have / 1e9:.1f} GB usable ({need / have:.2f}x, "
            f"{(need - have) / 1e9:.1f} GB short)")


def require_plan_fits(plan, workload: WorkloadSpec, cluster: ClusterSpec,
                      params: CostParams = DEFAULT_PARAMS) -> None:
    """Raise :class:`InfeasibleError` naming the first device over its usable memory (its GB
    needed and usable) unless the cost model finds ``plan`` fits: what ``hetrl simulate`` and
    ``hetrl run`` check before they start (``hetrl estimate`` answers the same question with
    exit code 3 and every violation)."""
    from hetrl.cost.model import CostModel

    est = CostModel(workload, cluster, params).estimate(plan)
    if est.feasible:
        return
    violations = est.violations
    first = violations[0] if violations else "does not fit"
    more = f" (and {len(violations) - 1} more)" if len(violations) > 1 else ""
    raise InfeasibleError(f"the plan does not fit {cluster.name}: {first}{more}; "
                          "`hetrl estimate` lists every violation")
