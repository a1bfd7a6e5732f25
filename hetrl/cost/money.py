"""Dollars of one iteration of a plan: GPU-hours at on-demand prices plus egress (docs/money.md).

    gpu_hours      = charged GPUs x iteration_s / 3600
    gpu_dollars    = sum over charged GPUs of price(type, region) x iteration_s / 3600
    egress_dollars = sum over flows that leave a region of bytes / 1e9 x price(src, dst)
                   + bytes into an edge node from another node / 1e9 x internet price
    dollars_per_iteration = gpu_dollars + egress_dollars
    dollars_per_1k_samples = dollars_per_iteration / samples x 1000
    dollars_per_hour      = dollars_per_iteration x 3600 / iteration_s

Charged GPUs: every GPU of the cluster (idle ones too: they are rented), or with
``charge_used_only`` every GPU of the nodes the plan places a tasklet on: clouds rent whole
instances (a p5.48xlarge is 8 H100s), so a plan that touches one GPU of a node pays for the
node. ``instances_charged`` lists the charged nodes with their instance type and GPUs.

The bytes of one iteration are :func:`hetrl.cost.flows.iteration_flows` (rollout data, the
weight sync's pulls, DP rings and pipeline boundaries, as the simulator moves them), the same
accounting ``hetrl show`` draws; ``bytes_by_kind`` names its kinds rollout, weight_sync, dp and
pipeline.

Not counted: tensor-parallel all-reduces (a TP group inside a node in every plan the searches
build; one split over regions would be priced as if free) and the small control messages.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from hetrl.cost.flows import FLOW_KINDS, iteration_flows
from hetrl.plan import Plan
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.hardware import gpu_type

#: Byte kinds reported by :class:`Money` (``bytes_by_kind``).
KINDS = ("rollout", "weight_sync", "dp", "pipeline")
#: The flow kinds of :mod:`hetrl.cost.flows` under their names here.
_KIND_OF = dict(zip(FLOW_KINDS, KINDS, strict=True))


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
    #: per charged node: node, gpu, region, gpus, instance, gpus_per_instance, dollars_per_hour
    #: (None: no price) and price_note (empty: the table's listed price)
    instances: tuple[dict[str, Any], ...] = ()

    @property
    def unpriced_where(self) -> tuple[str, ...]:
        """``L40S in ap-east-1`` for each (type, region) of a charged node with no price."""
        return tuple(dict.fromkeys(f"{n['gpu']} in {n['region']}" for n in self.instances
                                   if n["dollars_per_hour"] is None))

    @property
    def price_notes(self) -> tuple[str, ...]:
        """What stands in for a listed price, once per (type, region): ``A100-80GB in
        eu-west-1: not listed here; stand-in: eu-central-1 ...``."""
        return tuple(dict.fromkeys(f"{n['gpu']} in {n['region']}: {n['price_note']}"
                                   for n in self.instances if n["price_note"]))

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
            "instances_charged": [dict(n) for n in self.instances],
            "charge_used_only": self.charge_used_only,
            **({"unpriced_gpu_types": list(self.unpriced)} if self.unpriced else {}),
            **({"unpriced": list(self.unpriced_where)} if self.unpriced else {}),
            "price_notes": list(self.price_notes),
        }


def used_devices(plan: Plan) -> set[int]:
    """The devices the plan places at least one tasklet on."""
    return {d for p in plan.placements for d in p.device_ids}


def touched_nodes(cluster: ClusterSpec, devices: set[int] | None = None) -> list[str]:
    """The names of the nodes holding at least one of ``devices`` (every node by default), in
    node order."""
    if devices is None:
        return [n.name for n in cluster.nodes]
    names = {cluster.devices[d].node for d in devices}
    return [n.name for n in cluster.nodes if n.name in names]


def node_charges(cluster: ClusterSpec, nodes: list[str]) -> tuple[dict[str, Any], ...]:
    """Per node of ``nodes``: its GPU type, region, GPUs, the instance its price comes from
    (with that instance's GPUs), $/hour of the node (None: no price) and the price's note."""
    prices = cluster.price_list
    by_name = {n.name: n for n in cluster.nodes}
    out = []
    for name in nodes:
        node = by_name[name]
        gpu = gpu_type(node.gpu, cluster.gpu_types)
        q = prices.quote(gpu.name, node.region)
        out.append({"node": name, "gpu": gpu.name, "region": node.region, "gpus": node.count,
                    "instance": None if q is None else q.instance,
                    "gpus_per_instance": None if q is None or not q.gpus_per_instance
                    else q.gpus_per_instance,
                    "dollars_per_hour": None if q is None else q.dollars * node.count,
                    "price_note": "no price in the table for this GPU type in this region"
                    if q is None else q.note})
    return tuple(out)


def hourly_gpu_dollars(cluster: ClusterSpec, devices: set[int] | None = None
                       ) -> tuple[float, tuple[str, ...]]:
    """$/hour of renting the nodes holding ``devices`` (the whole cluster by default), whole
    nodes, and the GPU types among them with no price."""
    return _hourly(cluster, set(touched_nodes(cluster, devices)))


def _hourly(cluster: ClusterSpec, nodes: set[str]) -> tuple[float, tuple[str, ...]]:
    """$/hour of every GPU of ``nodes``, added GPU by GPU in device order (as before whole
    nodes were charged: the same sum to the last bit), and the types with no price."""
    prices = cluster.price_list
    total, missing = 0.0, set()
    for d in cluster.devices:
        if d.node not in nodes:
            continue
        p = prices.gpu_hour(d.gpu.name, d.region)
        if p is None:
            missing.add(d.gpu.name)
        else:
            total += p
    return total, tuple(sorted(missing))


def money(model: Any, plan: Plan, iteration_s: float, charge_used_only: bool = False) -> Money:
    """The dollars of one iteration of ``plan`` taking ``iteration_s`` seconds."""
    cluster = model.cluster
    devices = cluster.devices
    charged = used_devices(plan) if charge_used_only else None
    nodes = touched_nodes(cluster, charged)
    instances = node_charges(cluster, nodes)
    hourly, missing = _hourly(cluster, set(nodes))
    count = sum(c["gpus"] for c in instances)
    prices = cluster.price_list
    egress = cross = internet = 0.0
    by_kind: dict[str, float] = defaultdict(float)
    internet_rate = prices.internet_per_gb()
    for flow in iteration_flows(plan, model.workload, cluster, model.params, model):
        kind, a, b, nbytes = _KIND_OF[flow.kind], flow.src, flow.dst, flow.nbytes
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
        charge_used_only=charge_used_only, unpriced=missing, instances=instances)
