"""The bytes one iteration of a plan moves between devices, by kind of flow, and their totals
between regions: what the money model charges as egress (:mod:`hetrl.cost.money`) and the plan
picture draws as arrows (``hetrl show``), one accounting for both.

The flows are those the simulator replays (sim/engine.py), at the batch's expected lengths:

- ``rollout data``: samples are dealt to generation replicas and to each consumer's replicas in
  contiguous runs by data share, so generation replica g sends consumer replica r the overlap of
  their runs (a fraction of the batch) times ``samples x E[prompt + response] x`` bytes per
  token (:data:`~hetrl.cost.transfers.DATA_BYTES_PER_TOKEN`), to the replica's first device;
- ``weight sync``: the transfers of :func:`~hetrl.cost.sync.weight_sync_transfers` (source,
  destination, bytes) from actor training to generation: every generation GPU's pulls, or with
  the plan's ``sync_relay`` one copy per remote region (its slices pulled by that region's
  generation GPUs) plus the fan-out inside the region;
- ``DP ring``: a Megatron training task's gradient reduce-scatter and parameter all-gather, one
  ring per (stage, tp rank) over the replicas in node order, each ring edge carrying
  (n - 1) / n of the stage's gradient and parameter bytes, once per optimizer step; an FSDP task's ring gathers weights and
  reduce-scatters gradients once per micro-batch (count-based micro-batches at the batch's mean);
- ``pipeline``: activations forward (and gradients back in training) across each stage boundary,
  per tp rank ``tokens x hidden x bytes per value / tp``.

Bytes are per iteration; only flows between two devices (not a device to itself) count.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from itertools import chain

from hetrl.cost.expert_parallel import gradient_groups
from hetrl.cost.model import CostModel
from hetrl.cost.params import DEFAULT_PARAMS, CostParams
from hetrl.cost.sync import weight_sync_transfers, weights_shared_in_place
from hetrl.cost.transfers import DATA_BYTES_PER_TOKEN
from hetrl.plan import Plan, TaskPlacement
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.workload import WorkloadSpec

FLOW_KINDS = ("rollout data", "weight sync", "DP ring", "pipeline")


@dataclass(frozen=True)
class Flow:
    """``nbytes`` moved from device ``src`` to device ``dst`` in one iteration."""

    kind: str
    task: str
    src: int
    dst: int
    nbytes: float


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def _runs(shares: tuple[float, ...]) -> list[tuple[float, float]]:
    out, lo = [], 0.0
    for s in shares:
        out.append((lo, lo + s))
        lo += s
    return out


def rollout_flows(gen: TaskPlacement, p: TaskPlacement, kind: str, samples: int,
                  seq_mean: float) -> list[Flow]:
    """Rollout data from each generation replica to each replica of ``p`` (see the module)."""
    out = []
    for (g0, g1), grep in zip(_runs(gen.data_shares), gen.devices, strict=True):
        for (r0, r1), rep in zip(_runs(p.data_shares), p.devices, strict=True):
            frac = _overlap(g0, g1, r0, r1)
            src, dst = grep[0][0], rep[0][0]
            if frac > 0 and src != dst:
                out.append(Flow("rollout data", p.task, src, dst,
                                frac * samples * seq_mean * DATA_BYTES_PER_TOKEN[kind]))
    return out


def _ring_flows(members: list[int], nbytes: float, task: str) -> list[Flow]:
    n = len(members)
    if n < 2:
        return []
    per_edge = nbytes * (n - 1) / n
    return [Flow("DP ring", task, a, b, per_edge)
            for a, b in zip(members, members[1:] + members[:1], strict=True) if a != b]


def iteration_flows(plan: Plan, workload: WorkloadSpec, cluster: ClusterSpec,
                    params: CostParams = DEFAULT_PARAMS, model: CostModel | None = None
                    ) -> list[Flow]:
    """Every device-to-device flow of one iteration of ``plan`` (see the module). ``model``: a
    CostModel of this workload, cluster and params to reuse (its stage shapes and lengths)."""
    if model is None:
        model = CostModel(workload, cluster, params)
    params = model.params  # (as the workload's framework and optimizer pay them)
    node = cluster.topology.node_of
    samples, seq_mean = workload.samples, model.L.seq_mean
    bpv = workload.bytes_per_value
    gen = plan.placement("actor_generation")
    flows: list[Flow] = []
    for p in plan.placements:
        kind = workload.task(p.task).kind
        if kind == "generation":
            continue
        flows += rollout_flows(gen, p, kind, samples, seq_mean)
        shapes = model.shapes(p.task, p)
        tokens = [samples * share * seq_mean for share in p.data_shares]
        h = workload.model(workload.task(p.task).role).hidden
        # pipeline boundaries: activations forward, and gradients back in training
        per_token = h * bpv / p.tp * (2 if kind == "training" else 1)
        for r, replica in enumerate(p.devices):
            for j in range(p.pp - 1):
                for a, b in zip(replica[j], replica[j + 1], strict=True):
                    if a != b:
                        flows.append(Flow("pipeline", p.task, a, b, tokens[r] * per_token))
        if p.dp < 2:
            continue
        if p.backend == "fsdp":
            ring_bytes = shapes[0].params * ((2 * bpv + params.grad_bytes) if kind == "training"
                                             else bpv)
            micro = max(1, math.ceil(samples / p.dp / max(workload.micro_batch_size, 1)))
            members = sorted((r[0][0] for r in p.devices), key=lambda d: (int(node[d]), d))
            flows += _ring_flows(members, ring_bytes * micro, p.task)
        elif kind == "training":  # (experts over their own groups: gradient_groups)
            for replicas, stage_bytes in chain.from_iterable(
                    gradient_groups(p, shapes, params.grad_bytes + bpv)):
                for j, nbytes in enumerate(stage_bytes):
                    for k in range(p.tp):
                        members = sorted((p.devices[r][j][k] for r in replicas),
                                         key=lambda d: (int(node[d]), d))
                        flows += _ring_flows(members, nbytes * workload.optimizer_steps, p.task)
    train = plan.placement("actor_training")
    pulls, fan_out, _ = weight_sync_transfers(gen, model.shapes(gen.task, gen), train, cluster,
                                              params, weights_shared_in_place(workload, train),
                                              plan.sync_relay)
    flows += [Flow("weight sync", "weight_sync", s, d, b) for s, d, b in pulls + fan_out]
    return flows


def region_flows(flows: list[Flow], cluster: ClusterSpec
                 ) -> dict[tuple[str, str], dict[str, float]]:
    """Bytes per (source region, destination region) pair and flow kind, for the pairs of two
    different regions."""
    out: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for f in flows:
        a, b = cluster.devices[f.src].region, cluster.devices[f.dst].region
        if a != b:
            out[(a, b)][f.kind] += f.nbytes
    return {k: dict(v) for k, v in out.items()}


def human_bytes(n: float) -> str:
    """``n`` bytes in B, KB, MB, GB or TB (powers of 1000), three significant digits."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.3g} {unit}"
        n /= 1000
    return f"{n:.3g} TB"
