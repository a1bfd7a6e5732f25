"""Dollars of one iteration of a plan: GPU-hours at on-demand prices plus egress (docs/money.md).

    gpu_hours      = charged GPUs x iteration_s / 3600
    gpu_dollars    = sum over charged GPUs of price(type, region) x iteration_s / 3600
    egress_dollars = sum over flows that leave a region of bytes / 1e9 x price(src, dst)
                   + bytes into an edge node from another node / 1e9 x internet price
    dollars_per_iteration = gpu_dollars + egress_dollars
    dollars_per_1k_samples = dollars_per_iteration / samples x 1000
    dollars_per_hour      = dollars_per_iteration x 3600 / iteration_s

Charged GPUs: every GPU of the cluster (idle ones too: they are rented), or with
``charge_used_only`` only the GPUs the plan places a tasklet on.

The bytes of one iteration, from the cost model's transfer terms (each flow from the device
that sends to the device that receives):

- rollout data: each replica r of an inference or training task receives
  ``samples x share_r x seq_mean x DATA_BYTES_PER_TOKEN[kind]``, from the generation replicas in
  proportion to their shares (first device of each replica, as the cost model's fan-in);
- weight sync: the pulls of :func:`hetrl.cost.sync.weight_sync_pulls` (source, destination,
  bytes), once per iteration;
- DP rings: per (stage, tp rank) of a replicated training task, a ring over its dp replicas in
  replica order; a ring all-reduce of S bytes sends ``2 (dp-1)/dp x S`` over each ring edge,
  S = the stage's gradient bytes per tp rank (the weight bytes, bf16), once per optimizer step;
  FSDP instead all-gathers the weights for forward and backward and reduce-scatters the
  gradients per micro-batch: ``3 (dp-1)/dp x S`` per edge per micro-batch (inference: one
  all-gather, ``(dp-1)/dp x S``);
- pipeline boundaries: per replica and stage boundary, the activations of every token it
  processes, ``tokens x hidden x bytes_per_value``, forward (and in training backward too: x 2,
  per optimizer pass over the data); generation sends each prompt and response token once.

Not counted: tensor-parallel all-reduces (a TP group inside a node in every plan the searches
build; one split over regions would be priced as if free) and the small control messages.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from hetrl.cost.model_transfers import DATA_BYTES_PER_TOKEN
from hetrl.cost.sync import weight_sync_pulls
from hetrl.plan import Plan, TaskPlacement
from hetrl.spec.cluster import ClusterSpec

#: Byte kinds reported by :class:`Money` (``bytes_by_kind``).
KINDS = ("rollout", "weight_sync", "dp", "pipeline")


@dataclass(frozen=True)
class Money:
    """What one iteration costs. ``dollars_*`` are None when a charged GPU's type has no price
    (``unpriced`` names those types)."""

    iteration_s: float
    samples: int
    gpus_charged: int
    gpu_hours_per_iteration: float
    gpu_dollars: float | None
    egress_dollars: float
    cross_region_bytes: float
    internet_bytes: float
    bytes_by_kind: dict[str, float] = field(default_factory=dict)
    charge_used_only: bool = False
    unpriced: tuple[str, ...] = ()

    @property
    def dollars_per_iteration(self) -> float | None:
        return None if self.gpu_dollars is None else self.gpu_dollars + self.egress_dollars

    @property
    def dollars_per_1k_samples(self) -> float | None:
        d = self.dollars_per_iteration
        return None if d is None else d / self.samples * 1000.0

    @property
    def dollars_per_hour(self) -> float | None:
        d = self.dollars_per_iteration
        return None if d is None or not self.iteration_s > 0 else d * 3600.0 / self.iteration_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "dollars_per_iteration": self.dollars_per_iteration,
            "dollars_per_1k_samples": self.dollars_per_1k_samples,
            "dollars_per_hour": self.dollars_per_hour,
            "gpu_hours_per_iteration": self.gpu_hours_per_iteration,
            "gpu_dollars": self.gpu_dollars,
            "egress_dollars": self.egress_dollars,
            "cross_region_bytes": self.cross_region_bytes,
            "internet_bytes": self.internet_bytes,
            "bytes_by_kind": dict(self.bytes_by_kind),
            "gpus_charged": self.gpus_charged,
            "charge_used_only": self.charge_used_only,
            **({"unpriced_gpu_types": list(self.unpriced)} if self.unpriced else {}),
        }


def used_devices(plan: Plan) -> set[int]:
    """The devices the plan places at least one tasklet on."""
    return {d for p in plan.placements for d in p.device_ids}


def hourly_gpu_dollars(cluster: ClusterSpec, devices: set[int] | None = None
                       ) -> tuple[float, tuple[str, ...]]:
    """$/hour of renting ``devices`` (all the cluster's by default), and the GPU types among
    them with no price."""
    prices = cluster.price_list
    total, missing = 0.0, set()
    for d in cluster.devices:
        if devices is not None and d.id not in devices:
            continue
        p = prices.gpu_hour(d.gpu.name, d.region)
        if p is None:
            missing.add(d.gpu.name)
        else:
            total += p
    return total, tuple(sorted(missing))


def flows(model: Any, plan: Plan) -> list[tuple[str, int, int, float]]:
    """Every (kind, source device, destination device, bytes) flow of one iteration between two
    different devices (see the module docstring). ``model``: the plan's CostModel (its
    workload, cluster, parameters, stage shapes and length statistics)."""
    wl, cluster = model.workload, model.cluster
    by_task = {p.task: p for p in plan.placements}
    gen = by_task["actor_generation"]
    out: list[tuple[str, int, int, float]] = []
    seq_mean = model.L.seq_mean
    gen_firsts = [r[0][0] for r in gen.devices]
    for p in plan.placements:
        kind = wl.task(p.task).kind
        if kind == "generation":
            continue
        per_token = DATA_BYTES_PER_TOKEN[kind]
        for share, replica in zip(p.data_shares, p.devices, strict=True):
            total = wl.samples * share * seq_mean * per_token
            for gshare, src in zip(gen.data_shares, gen_firsts, strict=True):
                out.append(("rollout", src, replica[0][0], total * gshare))
    train = by_task.get("actor_training")
    if train is not None:
        shapes = model.shapes(gen.task, gen)
        shared = wl.mode == "sync" and train.backend != "fsdp"
        pulls, _ = weight_sync_pulls(gen, shapes, train, cluster, model.params, shared)
        out += [("weight_sync", s, d, b) for s, d, b in pulls]
    for p in plan.placements:
        out += _dp_flows(model, p) + _pipeline_flows(model, p)
    return [f for f in out if f[1] != f[2] and f[3] > 0]


def _dp_flows(model: Any, p: TaskPlacement) -> list[tuple[str, int, int, float]]:
    wl = model.workload
    kind = wl.task(p.task).kind
    if p.dp < 2 or kind == "generation":
        return []
    if p.backend == "fsdp":
        mb = wl.micro_batch_size if kind == "training" else wl.inference_micro_batch_size
        per_replica = math.ceil(wl.samples / p.dp / mb)
        factor = (3.0 if kind == "training" else 1.0) * per_replica
    elif kind == "training":
        factor = 2.0 * wl.optimizer_steps
    else:
        return []  # Megatron inference keeps whole weights per replica: no DP traffic
    shapes = model.shapes(p.task, p)
    out = []
    n = p.dp
    for s, shape in enumerate(shapes):
        per_edge = factor * (n - 1) / n * shape.weight_bytes
        for t in range(p.tp):
            ring = [p.devices[r][s][t] for r in range(n)]
            out += [("dp", a, b, per_edge) for a, b in zip(ring, ring[1:] + ring[:1], strict=True)]
    return out


def _pipeline_flows(model: Any, p: TaskPlacement) -> list[tuple[str, int, int, float]]:
    if p.pp < 2:
        return []
    wl = model.workload
    kind = wl.task(p.task).kind
    hidden = model.shapes(p.task, p)[0].model.hidden
    directions = 2.0 if kind == "training" else 1.0
    out = []
    for share, replica in zip(p.data_shares, p.devices, strict=True):
        tokens = wl.samples * share * model.L.seq_mean
        nbytes = tokens * hidden * wl.bytes_per_value
        for s in range(p.pp - 1):
            a, b = replica[s][0], replica[s + 1][0]
            out.append(("pipeline", a, b, nbytes))
            if directions == 2.0:
                out.append(("pipeline", b, a, nbytes))
    return out


def money(model: Any, plan: Plan, iteration_s: float, charge_used_only: bool = False) -> Money:
    """The dollars of one iteration of ``plan`` taking ``iteration_s`` seconds."""
    cluster = model.cluster
    devices = cluster.devices
    charged = used_devices(plan) if charge_used_only else None
    hourly, missing = hourly_gpu_dollars(cluster, charged)
    count = len(devices) if charged is None else len(charged)
    prices = cluster.price_list
    egress = cross = internet = 0.0
    by_kind: dict[str, float] = defaultdict(float)
    internet_rate = prices.internet_per_gb()
    for kind, a, b, nbytes in flows(model, plan):
        da, db = devices[a], devices[b]
        if da.region != db.region:
            cross += nbytes
            by_kind[kind] += nbytes
            egress += nbytes / 1e9 * prices.egress_per_gb(da.region, db.region)
        elif db.edge and da.node != db.node:
            internet += nbytes
            egress += nbytes / 1e9 * internet_rate
    hours = iteration_s / 3600.0
    return Money(
        iteration_s=iteration_s, samples=model.workload.samples, gpus_charged=count,
        gpu_hours_per_iteration=count * hours,
        gpu_dollars=None if missing else hourly * hours, egress_dollars=egress,
        cross_region_bytes=cross, internet_bytes=internet,
        bytes_by_kind={k: by_kind.get(k, 0.0) for k in KINDS},
        charge_used_only=charge_used_only, unpriced=missing)
