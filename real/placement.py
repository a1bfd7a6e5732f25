"""From a Plan to workers: which tasklets each device runs, and Ray placement groups that pin
every device's worker to a bundle of its GPU type.

A tasklet is one device's part of a task: a (replica, stage, tp rank). The torch engines run
tp = 1 only, and pipeline stages across workers for training tasks; generation and inference
run a whole replica on one device (pp = 1). Training tasks on the megatron engine run any
(dp, pp, tp) grid (:func:`megatron_grids`). Tasks of one task group share their devices'
workers, as in verl.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hetrl.cost.model import cost_model
from hetrl.cost.params import DEFAULT_PARAMS, CostParams
from hetrl.cost.sync import weight_sync_pulls
from hetrl.errors import SpecError
from hetrl.plan import Plan, TaskPlacement
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.workload import WorkloadSpec
from real.engines import DEFAULT_ENGINE
from real.engines.megatron_parallel import MegatronGrid
from real.ray_env import accelerator_resource


@dataclass(frozen=True)
class Tasklet:
    """One device's part of a task: replica, stage and tensor rank ``tp_rank`` (of ``tp``);
    ``layers`` = [first, last) of the model."""

    task: str
    role: str
    kind: str
    replica: int
    stage: int
    stages: int
    device: int
    layers: tuple[int, int]
    boundaries: tuple[int, ...]  # stage boundaries over the model's layers, len stages + 1
    tp_rank: int = 0
    tp: int = 1
    ep: int = 1  # the placement's expert parallelism: replicas [k ep, (k + 1) ep) share experts


def megatron_trained(plan: Plan, workload: WorkloadSpec,
                     engines: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The training tasks of ``plan`` that run on the megatron engine (``engines``: task kind ->
    engine name)."""
    if (engines or {}).get("training", DEFAULT_ENGINE) != "megatron":
        return ()
    return tuple(p.task for p in plan.placements if workload.task(p.task).kind == "training")


def megatron_grids(plan: Plan, workload: WorkloadSpec,
                   engines: Mapping[str, str] | None = None) -> dict[str, MegatronGrid]:
    """Task -> its (dp, pp, tp) device grid, for the training tasks on the megatron engine."""
    return {task: _grid(plan.placement(task),
                        workload.model(workload.task(task).role).moe is not None)
            for task in megatron_trained(plan, workload, engines)}


def _grid(p: TaskPlacement, moe: bool = False) -> MegatronGrid:
    return MegatronGrid(p.task, p.devices, p.layer_bounds, p.ep, moe)


def check_supported(plan: Plan, workload: WorkloadSpec,
                    engines: Mapping[str, str] | None = None) -> None:
    """Raise a SpecError naming the placement if the backend cannot run it with ``engines``
    (task kind -> engine name; default torch)."""
    megatron = megatron_trained(plan, workload, engines)
    for p in plan.placements:
        kind = workload.task(p.task).kind
        _check_moe(p, workload, kind, p.task in megatron)
        if p.task in megatron:
            _check_megatron(p, workload)
            continue
        if p.backend != "megatron":
            raise SpecError(f"placements[{p.task}].backend", p.backend,
                            "the torch backend runs full model replicas with a gradient "
                            "all-reduce (backend: megatron); fsdp placements are estimated and "
                            "simulated, not run")
        if p.tp != 1:
            raise SpecError(f"placements[{p.task}].tp", p.tp,
                            "the torch engines run tp = 1 only (tensor parallelism is the "
                            "megatron engine's, for training tasks: --engines training=megatron); "
                            "use dp or pp for this task")
        if p.pp != 1 and kind != "training":
            raise SpecError(f"placements[{p.task}].pp", p.pp,
                            f"the torch backend pipelines training tasks only; {p.task} is a "
                            f"{kind} task: use pp = 1")


def _check_moe(p: TaskPlacement, workload: WorkloadSpec, kind: str, megatron: bool) -> None:
    """What the real backend needs of a mixture-of-experts task: a Qwen3-MoE shape (every layer
    MoE, a softmax router, no shared experts); expert parallelism only in training (generation
    and inference replicas hold every expert), on the torch trainer with pp = 1, on the
    megatron engine with tp = 1."""
    moe = workload.model(workload.task(p.task).role).moe
    if moe is not None and (moe.shared_experts or moe.dense_layers or moe.layer_freq != 1
                            or moe.router != "softmax"):
        raise SpecError(f"placements[{p.task}]", workload.model(workload.task(p.task).role).name,
                        "the real backend builds Qwen3-MoE models: every layer MoE, a softmax "
                        "router, no shared experts")
    if moe is not None and megatron and p.tp > 1:
        raise SpecError(f"placements[{p.task}].tp", p.tp,
                        "megatron-core trains a mixture of experts with tp > 1 only under "
                        "sequence parallelism, which the megatron engine does not run: use tp = 1")
    if p.ep == 1:
        return
    if kind != "training":
        raise SpecError(f"placements[{p.task}].ep", p.ep,
                        "the real backend runs expert parallelism in training tasks only "
                        f"({p.task} is a {kind} task; its replicas hold every expert): use ep = 1")
    if p.pp != 1 and not megatron:
        raise SpecError(f"placements[{p.task}].ep", p.ep,
                        "the torch trainer runs expert parallelism with pp = 1 only (the "
                        "megatron engine, --engines training=megatron, pipelines it)")


def _check_megatron(p: TaskPlacement, workload: WorkloadSpec) -> None:
    """What megatron-core needs of a training placement: the megatron backend (the cost model
    estimated an fsdp one as FSDP), a layer split it can build, heads, query groups and the
    MLP's width that tp divides."""
    if p.backend != "megatron":
        raise SpecError(f"placements[{p.task}].backend", p.backend,
                        "the megatron engine runs backend: megatron placements; fsdp placements "
                        "are estimated and simulated, not run")
    shape = workload.model(workload.task(p.task).role)
    for field, n in (("heads", shape.heads), ("kv_heads", shape.kv_heads), ("ffn", shape.ffn)):
        if n % p.tp:
            raise SpecError(f"placements[{p.task}].tp", p.tp, f"must divide the model's {field} "
                            f"({n}) on the megatron engine")
    _grid(p, shape.moe is not None).layer_split()


def tasklets(plan: Plan, workload: WorkloadSpec) -> tuple[Tasklet, ...]:
    """Every tasklet of ``plan``, task by task, replica-major, then stage, then tp rank."""
    out = []
    for p in plan.placements:
        info = workload.task(p.task)
        bounds = p.layer_bounds
        for r, replica in enumerate(p.devices):
            for s, stage in enumerate(replica):
                for t, device in enumerate(stage):
                    out.append(Tasklet(p.task, info.role, info.kind, r, s, p.pp, device,
                                       (bounds[s], bounds[s + 1]), bounds, t, len(stage), p.ep))
    return tuple(out)


def expert_group_name(task: str, replica: int, ep: int) -> str:
    """The process group of replica ``replica``'s expert-parallel group (replicas
    [k ep, (k + 1) ep), as :func:`hetrl.cost.expert_parallel.expert_group_links`): its
    all-to-alls and its experts' gather before a weight sync."""
    return f"{task}/stage0/ep{replica // ep}"


def expert_dp_group_name(task: str, replica: int, ep: int) -> str:
    """The process group over which replica ``replica``'s experts' gradients are summed: the
    replicas holding the same experts (i, i + ep, ...; :func:`hetrl.cost.expert_parallel.
    gradient_groups`)."""
    return f"{task}/stage0/expert-dp{replica % ep}"


def expert_groups(p: TaskPlacement) -> dict[str, tuple[int, ...]]:
    """The process groups of a torch trainer with expert parallelism (pp = tp = 1): its
    expert-parallel groups, and its expert-data-parallel groups where dp / ep > 1."""
    if p.ep == 1:
        return {}
    devs = [r[0][0] for r in p.devices]
    out = {expert_group_name(p.task, k, p.ep): tuple(devs[k:k + p.ep])
           for k in range(0, p.dp, p.ep)}
    if p.dp > p.ep:
        out.update({expert_dp_group_name(p.task, b, p.ep): tuple(devs[b::p.ep])
                    for b in range(p.ep)})
    return out


def sync_sources(plan: Plan, src_task: str, dst_task: str, workload: WorkloadSpec,
                 cluster: ClusterSpec, params: CostParams = DEFAULT_PARAMS) -> dict[int, list[int]]:
    """Per device of ``dst_task`` (one per replica: the torch backend runs it with pp = tp = 1),
    the device of each stage of ``src_task`` that it pulls that stage's weights from: the
    sources the cost model's weight sync picks (:func:`hetrl.cost.sync.weight_sync_pulls`), so a
    measured sync replays the estimated one. A destination that trains a stage itself copies it
    locally (its own id)."""
    src, dst = plan.placement(src_task), plan.placement(dst_task)
    shapes = cost_model(workload, cluster, params).shapes(dst_task, dst)
    pulls, local = weight_sync_pulls(dst, shapes, src, cluster, params, shared_in_place=False)
    stage_of = {d: s for replica in src.devices for s, stage in enumerate(replica) for d in stage}
    out: dict[int, list[int | None]] = {r[0][0]: [None] * src.pp for r in dst.devices}
    for source, d, _ in pulls:
        out[d][stage_of[source]] = source
    for d, _ in local:
        out[d][stage_of[d]] = d
    for d, chosen in out.items():
        missing = [s for s, c in enumerate(chosen) if c is None]
        if missing:
            raise SpecError(f"weight sync {src_task} -> {dst_task}: device {d} has no source for "
                            f"stage(s) {missing} of {src_task}")
    return {d: [int(c) for c in chosen] for d, chosen in out.items()}  # type: ignore[arg-type]


def by_device(items: tuple[Tasklet, ...]) -> dict[int, tuple[Tasklet, ...]]:
    """Tasklets per device, in plan order."""
    out: dict[int, list[Tasklet]] = {}
    for t in items:
        out.setdefault(t.device, []).append(t)
    return {d: tuple(ts) for d, ts in sorted(out.items())}


def device_bundles(devices: tuple[int, ...], cluster: ClusterSpec,
                   gpu: bool = False) -> list[dict[str, float]]:
    """One Ray bundle per device pinning its GPU type. On CPU the emulated resource counts one unit
    per device; on GPUs a bundle takes one real GPU and a sliver of the node's type marker."""
    bundles = []
    for d in devices:
        res = accelerator_resource(cluster.device(d).gpu.name)
        bundles.append({"GPU": 1.0, res: 0.001} if gpu else {res: 1.0})
    return bundles


def emulated_resources(devices: tuple[int, ...], cluster: ClusterSpec) -> dict[str, float]:
    """Custom resources a local Ray needs to host ``devices``: one unit per device of each type."""
    out: dict[str, float] = {}
    for d in devices:
        res = accelerator_resource(cluster.device(d).gpu.name)
        out[res] = out.get(res, 0.0) + 1.0
    return out


def missing_resources(need: Mapping[str, float], have: Mapping[str, float]) -> dict[str, float]:
    """Resources of ``need`` that ``have`` lacks (name -> amount short)."""
    return {k: v - have.get(k, 0.0) for k, v in need.items() if have.get(k, 0.0) + 1e-9 < v}
