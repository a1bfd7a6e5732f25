"""Expert parallelism's all-to-all: the tokens an MoE layer sends to its experts and back.

An expert-parallel group is ``ep`` consecutive replicas of a placement (``TaskPlacement.ep``);
at each stage its ``ep x tp`` ranks exchange tokens twice per MoE layer and forward pass
(dispatch to the experts, combine back), twice more in the backward pass, and once more each
with full recomputation (Megatron's ``alltoall`` token dispatcher; vLLM's expert parallelism
alike for generation). Formulas and sources: docs/cost-model.md, "Mixture of experts".
"""

from __future__ import annotations

from hetrl.cost.flops import StageShape, collectives_per_layer
from hetrl.cost.params import CostParams
from hetrl.cost.primitives import GroupLinks, all_gather_time, group_links
from hetrl.plan import TaskPlacement
from hetrl.spec.cluster import ClusterSpec


def dispatch_bytes(shape: StageShape, tokens: float) -> float:
    """Bytes one rank of ``shape``'s stage sends in one all-to-all for ``tokens`` tokens of its
    replica: each token's hidden state (``bytes_per_value`` per value) to each of its top_k
    experts, of which (ep - 1) / ep are held by the group's other replicas, spread over the tp
    ranks (sequence parallel), at the busiest rank's load (``expert_load``)."""
    m = shape.model
    assert m.moe is not None
    return (tokens * m.moe.top_k * m.hidden * shape.bytes_per_value * shape.expert_load
            * (shape.ep - 1) / shape.ep / shape.tp)


def alltoall_pieces(g: GroupLinks, efficiency: float) -> tuple[float, float]:
    """An all-to-all over the group's devices as (a, b): ``a + b * nbytes`` seconds when each
    device sends ``nbytes`` in all, spread evenly over the others, every device at once. All
    pairs exchange at once (NCCL's grouped send/receive): one latency, the slowest link's, and
    the slower of the in-node share (over the in-node links) and the cross-node share (each
    device's flow over the slowest link between nodes, at most its share of its node's
    uplink). Nodes holding unequal numbers of the devices: every byte at the ring's narrowest
    link, at most the uplink share."""
    n = g.n
    if n <= 1:
        return 0.0, 0.0
    if g.nodes <= 1:
        return g.ring_latency_s, 1.0 / (g.ring_Bps * efficiency)
    if g.per_node < 1:
        return g.ring_latency_s, 1.0 / (min(g.ring_Bps, g.cross_Bps) * efficiency)
    m = g.per_node
    cross = (n - m) / (n - 1) / (min(g.inter_Bps, g.cross_Bps) * efficiency)
    inside = (m - 1) / (n - 1) / (g.intra_Bps * efficiency) if m > 1 else 0.0
    return max(g.ring_latency_s, g.inter_latency_s), max(cross, inside)


def expert_group_links(cluster: ClusterSpec, p: TaskPlacement) -> list[list[GroupLinks]]:
    """Per expert-parallel group of ``p`` (replicas [k ep, (k + 1) ep)), per stage, the link
    facts of its ep x tp devices there (:func:`~hetrl.cost.primitives.group_links`)."""
    out = []
    for k in range(0, p.dp, p.ep):
        members = p.devices[k:k + p.ep]
        out.append([group_links(cluster, tuple(d for r in members for d in r[j]))
                    for j in range(p.pp)])
    return out


def expert_parallel_seconds(cluster: ClusterSpec, p: TaskPlacement,
                            shapes: tuple[StageShape, ...], params: CostParams, kind: str,
                            calls: float, tokens: float, recompute: bool | str,
                            stages_in_series: bool) -> float:
    """Seconds of ``p``'s all-to-alls in one task call: ``calls`` passes (decode steps and
    prefill chunks, or micro-batch slots of the pipeline) moving ``tokens`` tokens of the
    slowest replica in all; per pass each MoE layer runs :func:`~hetrl.cost.flops.collectives_per_layer`
    all-to-alls, each a latency plus its bytes (:func:`dispatch_bytes`) over the group's links
    (:func:`alltoall_pieces`). ``stages_in_series``: a pass crosses every stage in turn
    (generation's decode step), so the stages' times add up; otherwise (1F1B) each slot of the
    pipeline takes the slowest stage's. The slowest expert-parallel group counts. 0 without
    expert parallelism."""
    if p.ep <= 1 or calls <= 0:
        return 0.0
    count = collectives_per_layer(kind, recompute)
    worst = 0.0
    for links in expert_group_links(cluster, p):
        per_stage = []
        for s, g in zip(shapes, links, strict=True):
            if s.moe_layers == 0:
                per_stage.append(0.0)
                continue
            eff = params.efficiency(cluster.devices[p.devices[0][0][0]].gpu.name, "link")
            a, b = alltoall_pieces(g, eff)
            per_stage.append(count * s.moe_layers * (calls * a + b * dispatch_bytes(s, tokens)))
        worst = max(worst, sum(per_stage) if stages_in_series else max(per_stage))
    return worst


def gradient_groups(p: TaskPlacement, shapes: tuple[StageShape, ...], bytes_per_param: float
                    ) -> list[list[tuple[range, list[float]]]]:
    """The data-parallel gradient syncs of a training placement, in the order they run: per
    phase, (the replicas of one group, each stage's bytes per rank). One phase over all dp
    replicas without expert parallelism; with it, the non-expert parameters over all dp
    replicas, then each rank's experts over the dp / ep replicas that hold the same ones
    (i, i + ep, ...), as :func:`hetrl.cost.forward.dp_optimizer_step_seconds` prices them."""
    if p.ep == 1:
        return [[(range(p.dp), [s.params * bytes_per_param for s in shapes])]]
    return [[(range(p.dp), [(s.params - s.expert_params) * bytes_per_param for s in shapes])],
            [(range(b, p.dp, p.ep), [s.expert_params * bytes_per_param for s in shapes])
             for b in range(p.ep)]]


def expert_gather_work(shape: StageShape) -> tuple[float, int]:
    """What one tp rank of ``shape``'s stage all-gathers over its expert-parallel group before a
    weight sync: (bytes each rank ends with -- the stage's experts, its tp slice -- and the
    calls, one per local expert's fc1 and fc2 in each MoE layer)."""
    moe = shape.model.moe
    assert moe is not None
    return (shape.expert_weight_bytes * shape.ep,
            shape.moe_layers * 2 * moe.experts // shape.ep)


def expert_gather_seconds(cluster: ClusterSpec, train: TaskPlacement,
                          shapes: tuple[StageShape, ...], params: CostParams) -> float:
    """Seconds a Megatron trainer with expert parallelism spends gathering its experts before
    a weight sync: an engine (vLLM) loads whole Hugging Face tensors, so every routed expert of
    a stage is all-gathered over the ranks that split them (verl's per-tensor weight export
    gathers each local expert's fc1 and fc2 over the expert-parallel group): per stage and tp
    rank, a ring all-gather over the group's ``ep`` devices (:func:`expert_gather_work`), each
    call paying the ring's ``ep - 1`` latencies; the slowest group and stage, the tp ranks'
    gathers priced each on its own links. 0 without expert parallelism."""
    if train.ep <= 1:
        return 0.0
    worst = 0.0
    eff = params.efficiency(cluster.devices[train.devices[0][0][0]].gpu.name, "link")
    for k in range(0, train.dp, train.ep):
        members = train.devices[k:k + train.ep]
        for j, s in enumerate(shapes):
            if s.moe_layers == 0:
                continue
            whole, calls = expert_gather_work(s)
            for r in range(train.tp):
                g = group_links(cluster, tuple(m[j][r] for m in members))
                t = all_gather_time(whole, g, eff) + (calls - 1) * (g.n - 1) * g.ring_latency_s
                worst = max(worst, t)
    return worst
