"""ClusterSpec: devices, nodes, zones, regions and a networkx topology with latency/bandwidth.

The topology graph has four kinds of vertex: ``("gpu", id)``, ``("host", node)``,
``("zone", region, zone)`` and ``("region", region)``. Edges carry ``latency_s`` (one-way,
seconds) and ``bandwidth_Bps`` (bytes per second, one direction, one flow):

- gpu -- host: the intra-node link (NVLink/PCIe) of the GPU type; two hops join two GPUs of a node;
- host -- zone: the node's NIC; half the intra-zone node-to-node latency per hop;
- zone -- region: the region's fabric between availability zones (free with one zone);
- host -- region for *edge* nodes: a slow uplink straight to the region's gateway, so an edge
  node reaches other regions only relayed through its own region;
- region -- region: the measured inter-region one-way delay (RTT/2) and per-flow bandwidth.

The route between two devices takes the fewest region-to-region hops (direct inter-region links,
as clouds route), then the lowest latency; its latency is the sum over the route and its bandwidth
the narrowest edge on it (one flow). Both are precomputed into device x device matrices.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np

from hetrl.errors import (
    SpecError,
    boolean,
    did_you_mean,
    finite_number,
    is_int,
    is_number,
    positive,
    positive_int,
    require,
    string,
    why_not_number,
)
from hetrl.limits import MAX_GPUS, MAX_GPUS_PER_NODE, MAX_NODES, MAX_REGION_LINKS, MAX_REGIONS
from hetrl.spec.hardware import GPUType, gpu_catalog, gpu_type
from hetrl.spec.prices import PriceOverrides, Prices

SCHEMA_VERSION = 1
MAX_ONE_WAY_LATENCY_MS = 1000.0
MAX_BANDWIDTH_GBPS = 1e5


@dataclass(frozen=True)
class NodeSpec:
    """A machine: ``count`` GPUs of type ``gpu`` in ``region``/``zone``.

    ``nic_gbps`` is its network in Gbit/s (None: the GPU type's typical instance NIC).
    An ``edge`` node connects only to its own region's gateway, at the network's edge bandwidth.
    """

    name: str
    gpu: str
    count: int
    region: str
    zone: str = "a"
    nic_gbps: float | None = None
    edge: bool = False


@dataclass(frozen=True)
class RegionLink:
    """Between two regions: one-way delay in ms and per-flow bandwidth in Gbit/s.

    ``aggregate_gbps`` (Gbit/s, None: no cap of the pair) is the capacity all flows between the
    two regions share, in each direction (full duplex, as node uplinks): the per-flow limit
    bounds one flow, this bounds their sum. At least ``bandwidth_gbps``."""

    a: str
    b: str
    latency_ms: float
    bandwidth_gbps: float
    aggregate_gbps: float | None = None


@dataclass(frozen=True)
class NetworkParams:
    """Network constants inside a region (documented defaults; override in a cluster file).

    ``gpu_link_latency_us``: one GPU<->host hop inside a node, microseconds.
    ``intra_zone_latency_ms``: one-way node-to-node delay inside a zone (AWS same-zone RTT ~0.1 ms).
    ``inter_zone_latency_ms``: one-way delay between zones of a region (AWS: RTT 0.25-3.4 ms).
    ``inter_zone_bandwidth_gbps``: per-flow bandwidth between zones of a region.
    ``edge_latency_ms`` / ``edge_bandwidth_gbps``: an edge node's uplink (HetRL paper: 1 Gbps).
    """

    gpu_link_latency_us: float = 1.0
    intra_zone_latency_ms: float = 0.05
    inter_zone_latency_ms: float = 0.5
    inter_zone_bandwidth_gbps: float = 25.0
    edge_latency_ms: float = 1.0
    edge_bandwidth_gbps: float = 1.0


@dataclass(frozen=True)
class Device:
    """One GPU: a dense integer id, its type, and where it sits."""

    id: int
    gpu: GPUType
    node: str
    zone: str
    region: str
    edge: bool


@dataclass(frozen=True)
class ClusterSpec:
    """A set of nodes, the links between their regions and the GPU types they use."""

    name: str
    nodes: tuple[NodeSpec, ...]
    region_links: tuple[RegionLink, ...] = ()
    network: NetworkParams = field(default_factory=NetworkParams)
    gpu_types: tuple[GPUType, ...] = ()
    schema_version: int = SCHEMA_VERSION
    #: the cluster file's ``prices:`` overrides of the shipped price table (docs/money.md)
    prices: PriceOverrides = field(default_factory=PriceOverrides)

    def __post_init__(self) -> None:
        string("name", self.name)
        require(len(self.nodes) >= 1, "nodes", len(self.nodes), "need at least one node")
        require(len(self.nodes) <= MAX_NODES, "nodes", len(self.nodes),
                f"at most {MAX_NODES} nodes (after repeat)")
        seen: set[str] = set()
        for i, node in enumerate(self.nodes):
            string(f"nodes[{i}].name", node.name)
            require(node.name not in seen, "nodes.name", node.name, "node names must be unique")
            seen.add(node.name)
            string(f"nodes[{i}].gpu", node.gpu)
            gpu_type(node.gpu, self.gpu_types, field=f"nodes[{i}].gpu")
            positive_int(f"nodes[{i}].count", node.count, MAX_GPUS_PER_NODE)
            string(f"nodes[{i}].region", node.region)
            string(f"nodes[{i}].zone", node.zone)
            boolean(f"nodes[{i}].edge", node.edge)
            if node.nic_gbps is not None:
                _bandwidth(f"nodes[{i}].nic_gbps", node.nic_gbps)
        regions = {node.region for node in self.nodes}
        require(len(regions) <= MAX_REGIONS, "nodes", f"{len(regions)} regions",
                f"at most {MAX_REGIONS} regions in a cluster")
        require(len(self.region_links) <= MAX_REGION_LINKS, "region_links",
                f"{len(self.region_links)} links", f"at most {MAX_REGION_LINKS} (one per pair of "
                f"{MAX_REGIONS} regions)")
        total = sum(node.count for node in self.nodes)
        require(total <= MAX_GPUS, "nodes", f"{total} GPUs", f"at most {MAX_GPUS} GPUs in all")
        names = [g.name for g in self.gpu_types]
        require(len(set(names)) == len(names), "gpu_types", names, "each type name at most once")
        pairs: dict[frozenset[str], int] = {}
        for i, link in enumerate(self.region_links):
            string(f"region_links[{i}].a", link.a)
            string(f"region_links[{i}].b", link.b)
            require(link.a != link.b, f"region_links[{i}].b", link.b, "must differ from a")
            pair = frozenset((link.a, link.b))
            require(pair not in pairs, f"region_links[{i}]", [link.a, link.b],
                    f"this pair of regions (either order) is already linked by "
                    f"region_links[{pairs.get(pair)}]: list each pair once")
            pairs[pair] = i
            _latency(f"region_links[{i}].latency_ms", link.latency_ms)
            _bandwidth(f"region_links[{i}].bandwidth_gbps", link.bandwidth_gbps)
            if link.aggregate_gbps is not None:
                _aggregate(f"region_links[{i}].aggregate_gbps", link.aggregate_gbps,
                           link.bandwidth_gbps)
        net = self.network
        require(0 < net.gpu_link_latency_us <= 1000, "network.gpu_link_latency_us",
                net.gpu_link_latency_us, "must be in (0, 1000] microseconds")
        for key in ("intra_zone_latency_ms", "inter_zone_latency_ms", "edge_latency_ms"):
            _latency(f"network.{key}", getattr(net, key))
        for key in ("inter_zone_bandwidth_gbps", "edge_bandwidth_gbps"):
            _bandwidth(f"network.{key}", getattr(net, key))
        require(is_int(self.schema_version) and self.schema_version == SCHEMA_VERSION,
                "schema_version", self.schema_version,
                f"this hetrl reads version {SCHEMA_VERSION}")
        self.topology  # noqa: B018  -- builds the graph now so a disconnected one fails fast

    # --- devices ---
    @cached_property
    def devices(self) -> tuple[Device, ...]:
        out = []
        for node in self.nodes:
            gpu = gpu_type(node.gpu, self.gpu_types)
            for _ in range(node.count):
                out.append(Device(len(out), gpu, node.name, node.zone, node.region, node.edge))
        return tuple(out)

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    def device(self, device_id: int) -> Device:
        require(isinstance(device_id, int) and 0 <= device_id < self.num_devices, "device",
                device_id, f"no such device; ids are 0..{self.num_devices - 1}")
        return self.devices[device_id]

    @property
    def regions(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for node in self.nodes:
            seen.setdefault(node.region, None)
        return tuple(seen)

    def gpu_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for d in self.devices:
            counts[d.gpu.name] = counts.get(d.gpu.name, 0) + 1
        return counts

    def node_nic_gbps(self, node: NodeSpec) -> float:
        return node.nic_gbps if node.nic_gbps is not None else gpu_type(
            node.gpu, self.gpu_types).node_nic_gbps

    @property
    def price_list(self) -> Prices:
        """The prices of this cluster: the shipped table with its ``prices:`` overrides."""
        return Prices(self.prices)

    # --- topology ---
    @cached_property
    def topology(self) -> Topology:
        return Topology.build(self)

    def latency_s(self, a: int, b: int) -> float:
        """Effective one-way latency between devices ``a`` and ``b`` (seconds, path-aware)."""
        self.device(a), self.device(b)
        return float(self.topology.latency_s[a, b])

    def bandwidth_Bps(self, a: int, b: int) -> float:
        """Effective one-flow bandwidth between devices ``a`` and ``b`` (bytes/s, path-aware)."""
        self.device(a), self.device(b)
        return float(self.topology.bandwidth_Bps[a, b])

    # --- serialisation ---
    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "name": self.name,
            "gpu_types": [g.to_dict() for g in self.gpu_types],
            "nodes": [
                {k: v for k, v in asdict(n).items() if not (k == "nic_gbps" and v is None)}
                for n in self.nodes
            ],
            "region_links": [
                {k: v for k, v in asdict(link).items() if not (k == "aggregate_gbps" and v is None)}
                for link in self.region_links
            ],
            "network": asdict(self.network),
            **({"prices": self.prices.to_dict()} if self.prices else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], base_dir: Path | None = None) -> ClusterSpec:
        """Build from a mapping (see docs/specs.md). Nodes may carry ``repeat: N``; ``regions: aws``
        fills ``region_links`` for every pair of used regions from the shipped AWS measurements."""
        require(isinstance(data, Mapping), "cluster", type(data).__name__, "must be a mapping")
        known = {"schema_version", "name", "gpu_types", "nodes", "region_links", "network",
                 "regions", "prices"}
        for key in data:
            require(key in known, str(key), data[key], f"unknown key; known keys: {sorted(known)}")
        require("nodes" in data, "nodes", None, "is required")
        for key in ("gpu_types", "region_links"):
            require(data.get(key) is None or isinstance(data[key], list), key, data.get(key),
                    "must be a list")
        types = tuple(GPUType.from_dict(g, f"gpu_types[{i}]")
                      for i, g in enumerate(data.get("gpu_types") or []))
        nodes = _nodes_from(data["nodes"], types)
        require(len(data.get("region_links") or []) <= MAX_REGION_LINKS, "region_links",
                f"{len(data.get('region_links') or [])} links",
                f"at most {MAX_REGION_LINKS} (one per pair of {MAX_REGIONS} regions)")
        links = [_link_from(raw, f"region_links[{i}]")
                 for i, raw in enumerate(data.get("region_links") or [])]
        used = list(dict.fromkeys(n.region for n in nodes))
        _links_name_used_regions(links, used)
        if "regions" in data:
            require(data["regions"] == "aws", "regions", data["regions"],
                    "the only built-in region matrix is 'aws'")
            from hetrl.spec.regions import aws_region_links, aws_regions

            known = aws_regions()
            linked = {r for link in links for r in (link.a, link.b)}
            for i, entry in enumerate(data["nodes"]):
                region = entry.get("region", "local")
                # a region outside the matrix is fine where region_links give its links
                require(region in known or region in linked, f"nodes[{i}].region", region,
                        "not an AWS region code that `regions: aws` knows"
                        f"{did_you_mean(region, known)} (known: {', '.join(known)}; a region "
                        "outside the matrix needs its links under region_links)")
            given = {frozenset((link.a, link.b)) for link in links}
            links += [lk for lk in aws_region_links([r for r in used if r in known])
                      if frozenset((lk.a, lk.b)) not in given]
        net_raw = {} if data.get("network") is None else data["network"]
        require(isinstance(net_raw, Mapping), "network", net_raw, "must be a mapping")
        net_known = set(NetworkParams.__dataclass_fields__)
        for key in net_raw:
            require(key in net_known, f"network.{key}", net_raw[key],
                    f"unknown key; known keys: {sorted(net_known)}")
        network = NetworkParams(**{k: positive(f"network.{k}", v) for k, v in net_raw.items()})
        prices = PriceOverrides() if data.get("prices") is None else PriceOverrides.from_dict(
            data["prices"], set(gpu_catalog()) | {g.name for g in types})
        return cls(
            name=string("name", data.get("name", "custom")),
            nodes=nodes,
            region_links=tuple(links),
            network=network,
            gpu_types=types,
            schema_version=data.get("schema_version", SCHEMA_VERSION),
            prices=prices,
        )


def _latency(field_name: str, value: Any) -> float:
    require(is_number(value), field_name, value,
            f"must be a number of milliseconds{why_not_number(value)}")
    v = finite_number(field_name, value, unit="milliseconds")
    require(0 <= v <= MAX_ONE_WAY_LATENCY_MS, field_name, value,
            f"one-way latency must be in [0, {MAX_ONE_WAY_LATENCY_MS:g}] ms (units: milliseconds)")
    return v


def _bandwidth(field_name: str, value: Any) -> float:
    v = positive(field_name, value)
    require(v <= MAX_BANDWIDTH_GBPS, field_name, value,
            f"must be <= {MAX_BANDWIDTH_GBPS:g} Gbit/s (units: Gbit/s)")
    return v


def _aggregate(field_name: str, value: Any, per_flow_gbps: float) -> float:
    """A region pair's aggregate Gbit/s: a bandwidth at least the pair's per-flow one (a cap
    below what one flow may reach is a typo, e.g. the two fields swapped)."""
    v = _bandwidth(field_name, value)
    require(v >= per_flow_gbps, field_name, value,
            f"must be >= the link's bandwidth_gbps ({per_flow_gbps:g} Gbit/s): the aggregate "
            "caps all flows of the pair together, one flow is already capped by bandwidth_gbps "
            "(units: Gbit/s)")
    return v


def _nodes_from(raw: Any, types: tuple[GPUType, ...]) -> tuple[NodeSpec, ...]:
    require(isinstance(raw, list) and raw, "nodes", raw, "must be a non-empty list")
    known = {"name", "gpu", "count", "region", "zone", "nic_gbps", "edge", "repeat"}
    entries = []
    nodes = gpus = 0
    # every entry is checked, and the totals capped, before any node is built: a huge
    # ``repeat`` costs nothing
    for i, entry in enumerate(raw):
        f = f"nodes[{i}]"
        require(isinstance(entry, Mapping), f, entry, "must be a mapping")
        for key in entry:
            require(key in known, f"{f}.{key}", entry[key], f"unknown key; known keys: {sorted(known)}")
        require("gpu" in entry, f"{f}.gpu", None, "is required")
        gpu = gpu_type(string(f"{f}.gpu", entry["gpu"]), types, field=f"{f}.gpu").name
        repeat = positive_int(f"{f}.repeat", entry.get("repeat", 1), MAX_NODES)
        # checked here too, so that the error names the entry in the file, not its repeats
        count = positive_int(f"{f}.count", entry.get("count", 8), MAX_GPUS_PER_NODE)
        nodes, gpus = nodes + repeat, gpus + repeat * count
        require(nodes <= MAX_NODES, f"{f}.repeat", repeat,
                f"makes {nodes} nodes; at most {MAX_NODES} nodes in a cluster")
        require(gpus <= MAX_GPUS, f"{f}.repeat" if repeat > 1 else f"{f}.count",
                repeat if repeat > 1 else count,
                f"makes {gpus} GPUs; at most {MAX_GPUS} GPUs in a cluster")
        edge = boolean(f"{f}.edge", entry.get("edge", False))
        nic = entry.get("nic_gbps")
        nic = None if nic is None else _bandwidth(f"{f}.nic_gbps", nic)
        name = string(f"{f}.name", entry["name"]) if "name" in entry else None
        region = string(f"{f}.region", entry.get("region", "local"))
        zone = string(f"{f}.zone", entry.get("zone", "a"))
        entries.append((name, gpu, count, region, zone, nic, edge, repeat))
    out: list[NodeSpec] = []
    for name, gpu, count, region, zone, nic, edge, repeat in entries:
        for r in range(repeat):
            node = (name if repeat == 1 else f"{name}.{r}") if name else f"n{len(out)}-{gpu}"
            out.append(NodeSpec(name=node, gpu=gpu, count=count, region=region, zone=zone,
                                nic_gbps=nic, edge=edge))
    return tuple(out)


def _links_name_used_regions(links: list[RegionLink], used: list[str]) -> None:
    """Every end of a region link is a region some node is in: a link to a region no node
    uses would be ignored, so a typo there (or in a node's region) must fail here, naming the
    link, instead of surfacing as a disconnected topology."""
    for i, link in enumerate(links):
        for end in ("a", "b"):
            region = getattr(link, end)
            require(region in used, f"region_links[{i}].{end}", region,
                    f"no node is in this region{did_you_mean(region, used)} (the nodes' "
                    f"regions: {', '.join(used)}): check the spelling here and in "
                    "nodes[].region, or drop the link")


def _link_from(raw: Any, f: str) -> RegionLink:
    require(isinstance(raw, Mapping), f, raw,
            "must be a mapping {a, b, latency_ms, bandwidth_gbps[, aggregate_gbps]}")
    for key in ("a", "b", "latency_ms", "bandwidth_gbps"):
        require(key in raw, f"{f}.{key}", None, "is required")
    extra = set(raw) - {"a", "b", "latency_ms", "bandwidth_gbps", "aggregate_gbps"}
    require(not extra, f"{f}.{sorted(extra)[0] if extra else ''}", None, "unknown key")
    per_flow = _bandwidth(f"{f}.bandwidth_gbps", raw["bandwidth_gbps"])
    aggregate = raw.get("aggregate_gbps")
    return RegionLink(string(f"{f}.a", raw["a"]), string(f"{f}.b", raw["b"]),
                      _latency(f"{f}.latency_ms", raw["latency_ms"]), per_flow,
                      None if aggregate is None else _aggregate(f"{f}.aggregate_gbps", aggregate,
                                                                per_flow))


@dataclass(frozen=True, eq=False)
class Topology:
    """Derived network facts of a cluster: the graph and device x device matrices.

    ``latency_s[i, j]`` one-way seconds, ``bandwidth_Bps[i, j]`` bytes/s (inf on the diagonal);
    ``node_of[i]`` the node index of device i; per-device peak arrays ``flops`` (FLOP/s),
    ``hbm_Bps`` (bytes/s) and ``memory_bytes``.
    """

    graph: nx.Graph
    latency_s: np.ndarray
    bandwidth_Bps: np.ndarray
    node_of: np.ndarray
    flops: np.ndarray
    hbm_Bps: np.ndarray
    memory_bytes: np.ndarray
    nic_Bps: np.ndarray  # per node: its NIC, bytes/s
    uplink_Bps: np.ndarray  # per node: its link out of the node (the NIC; an edge node's uplink)
    #: per device: the index of its region in ``ClusterSpec.regions``
    region_of: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    #: per directed capped region pair (a region link with ``aggregate_gbps``, each direction
    #: once: 2i from ``a`` to ``b``, 2i + 1 back): its aggregate, bytes/s; empty when no link of
    #: the cluster has a cap (then nothing below is used)
    pair_cap_Bps: np.ndarray = field(default_factory=lambda: np.zeros(0))
    #: per directed capped pair: (region index from, region index to), of the link's endpoints
    pair_regions: tuple[tuple[int, int], ...] = ()
    #: (regions, regions, hops): the directed capped pairs a flow from one region to another
    #: crosses on its route (fewest region hops, then lowest latency, as device routes), -1
    #: padded; shape (0, 0, 1) when no link has a cap
    pair_route: np.ndarray = field(default_factory=lambda: np.full((0, 0, 1), -1,
                                                                   dtype=np.int64))

    @property
    def has_aggregate(self) -> bool:
        """Whether some region pair of the cluster has an aggregate cap."""
        return self.pair_cap_Bps.size > 0

    def pairs_between(self, a: int, b: int) -> list[int]:
        """The directed capped pairs a flow from device ``a`` to device ``b`` crosses."""
        if not self.has_aggregate:
            return []
        row = self.pair_route[self.region_of[a], self.region_of[b]]
        return [int(r) for r in row if r >= 0]

    @cached_property
    def latency_rows(self) -> list[list[float]]:
        """``latency_s`` as nested lists: fast scalar look-ups in hot loops."""
        return self.latency_s.tolist()

    @cached_property
    def bandwidth_rows(self) -> list[list[float]]:
        return self.bandwidth_Bps.tolist()

    @cached_property
    def lists(self) -> dict[str, list[float]]:
        """Per-device ``flops``, ``hbm_Bps``, ``memory_bytes`` and ``node_of``, and per node
        ``uplink_Bps``, as lists (fast look-ups)."""
        return {"flops": self.flops.tolist(), "hbm_Bps": self.hbm_Bps.tolist(),
                "memory_bytes": self.memory_bytes.tolist(), "node_of": self.node_of.tolist(),
                "uplink_Bps": self.uplink_Bps.tolist()}

    @classmethod
    def build(cls, cluster: ClusterSpec) -> Topology:
        net = cluster.network
        g = nx.Graph()
        used_regions = set(cluster.regions)
        zones = {(n.region, n.zone) for n in cluster.nodes if not n.edge}
        for region in used_regions:
            g.add_node(("region", region))
        for region, zone in zones:
            # In a region with several zones each zone sits half the extra inter-zone delay from
            # the region's gateway; with one zone, the gateway is the zone itself.
            multi = sum(1 for r, _ in zones if r == region) > 1
            extra_ms = max(net.inter_zone_latency_ms - net.intra_zone_latency_ms, 0) / 2
            g.add_edge(("zone", region, zone), ("region", region),
                       latency_s=extra_ms / 1e3 if multi else 0.0,
                       bandwidth_Bps=net.inter_zone_bandwidth_gbps * 1e9 / 8 if multi else np.inf)
        nic = np.zeros(len(cluster.nodes))
        uplink = np.zeros(len(cluster.nodes))
        for k, node in enumerate(cluster.nodes):
            nic[k] = cluster.node_nic_gbps(node) * 1e9 / 8
            host = ("host", node.name)
            if node.edge:
                uplink[k] = min(net.edge_bandwidth_gbps * 1e9 / 8, nic[k])
                g.add_edge(host, ("region", node.region), latency_s=net.edge_latency_ms / 1e3,
                           bandwidth_Bps=uplink[k])
            else:
                uplink[k] = nic[k]
                g.add_edge(host, ("zone", node.region, node.zone),
                           latency_s=net.intra_zone_latency_ms / 2e3, bandwidth_Bps=nic[k])
        for link in cluster.region_links:
            if link.a in used_regions and link.b in used_regions:
                g.add_edge(("region", link.a), ("region", link.b), latency_s=link.latency_ms / 1e3,
                           bandwidth_Bps=link.bandwidth_gbps * 1e9 / 8)
        devices = cluster.devices
        node_index = {n.name: k for k, n in enumerate(cluster.nodes)}
        node_of = np.array([node_index[d.node] for d in devices], dtype=np.int64)
        up_lat = np.full(len(devices), net.gpu_link_latency_us / 1e6)
        up_bw = np.array([d.gpu.intra_link_gbps * 1e9 for d in devices])
        for d in devices:
            g.add_edge(("gpu", d.id), ("host", d.node), latency_s=float(up_lat[d.id]),
                       bandwidth_Bps=float(up_bw[d.id]))
        if not nx.is_connected(g):
            parts = sorted((sorted({v[1] for v in comp if v[0] == "region"}) for comp in
                            nx.connected_components(g)), key=len)
            raise SpecError("region_links", [p for p in parts if p],
                            "topology is disconnected: add links between these groups of regions")
        host_lat, host_bw = _host_matrices(g, cluster)
        n = node_of[:, None], node_of[None, :]
        lat = up_lat[:, None] + host_lat[n] + up_lat[None, :]
        bw = np.minimum(np.minimum(up_bw[:, None], up_bw[None, :]), host_bw[n])
        np.fill_diagonal(lat, 0.0)
        np.fill_diagonal(bw, np.inf)
        for arr in (lat, bw):
            arr.setflags(write=False)
        region_index = {r: i for i, r in enumerate(cluster.regions)}
        region_of = np.array([region_index[d.region] for d in devices], dtype=np.int64)
        caps, pair_regions, route = _aggregate_pairs(g, cluster, region_index)
        for arr in (region_of, caps, route):
            arr.setflags(write=False)
        return cls(
            graph=g, latency_s=lat, bandwidth_Bps=bw, node_of=node_of,
            flops=np.array([d.gpu.flops for d in devices]),
            hbm_Bps=np.array([d.gpu.hbm_bytes_per_s for d in devices]),
            memory_bytes=np.array([d.gpu.memory_bytes for d in devices]),
            nic_Bps=nic,
            uplink_Bps=uplink,
            region_of=region_of,
            pair_cap_Bps=caps,
            pair_regions=pair_regions,
            pair_route=route,
        )


def _route_cost(u: Any, v: Any, data: Mapping[str, Any]) -> float:
    """Fewest inter-region hops first, then lowest latency: clouds carry region-to-region
    traffic on their direct paths, even where measured RTTs break the triangle inequality; only
    a region without a direct link is reached through a relay."""
    return data["latency_s"] + (1e4 if u[0] == v[0] == "region" else 0.0)


def _aggregate_pairs(g: nx.Graph, cluster: ClusterSpec, region_index: dict[str, int]
                     ) -> tuple[np.ndarray, tuple[tuple[int, int], ...], np.ndarray]:
    """The directed capped region pairs (links with ``aggregate_gbps`` between used regions):
    their capacities (bytes/s), endpoints, and per (region, region) the capped pairs on the
    route between them (see :class:`Topology`). Empty arrays when no link has a cap."""
    capped = [link for link in cluster.region_links if link.aggregate_gbps is not None
              and link.a in region_index and link.b in region_index]
    if not capped:
        return np.zeros(0), (), np.full((0, 0, 1), -1, dtype=np.int64)
    caps, ends, rid = [], [], {}
    for link in capped:
        a, b = region_index[link.a], region_index[link.b]
        for x, y in ((a, b), (b, a)):
            rid[(x, y)] = len(caps)
            caps.append(link.aggregate_gbps * 1e9 / 8)
            ends.append((x, y))
    regions = g.subgraph(v for v in g if v[0] == "region")
    n = len(region_index)
    hops: dict[tuple[int, int], list[int]] = {}
    for name, i in region_index.items():
        paths = nx.single_source_dijkstra_path(regions, ("region", name), weight=_route_cost)
        for other, j in region_index.items():
            path = [region_index[v[1]] for v in paths[("region", other)]]
            hops[(i, j)] = [rid[e] for e in zip(path, path[1:], strict=False) if e in rid]
    width = max(1, max(len(h) for h in hops.values()))
    route = np.full((n, n, width), -1, dtype=np.int64)
    for (i, j), h in hops.items():
        route[i, j, :len(h)] = h
    return np.array(caps), tuple(ends), route


def _host_matrices(g: nx.Graph, cluster: ClusterSpec) -> tuple[np.ndarray, np.ndarray]:
    """Host x host latency (lowest-latency path) and that path's bottleneck bandwidth."""
    names = [n.name for n in cluster.nodes]
    k = len(names)
    lat = np.zeros((k, k))
    bw = np.full((k, k), np.inf)
    # Routing never passes through a GPU vertex (degree 1), so search the graph without them.
    core = g.subgraph(v for v in g if v[0] != "gpu")

    for i, name in enumerate(names):
        paths = nx.single_source_dijkstra_path(core, ("host", name), weight=_route_cost)
        for j, other in enumerate(names):
            if i == j:
                continue
            path = paths[("host", other)]
            edges = [core.edges[u, v] for u, v in zip(path, path[1:], strict=False)]
            lat[i, j] = sum(e["latency_s"] for e in edges)
            bw[i, j] = min(e["bandwidth_Bps"] for e in edges)
    return lat, bw


def homogeneous(gpu: str, nodes: int, gpus_per_node: int = 8, region: str = "local",
                name: str | None = None) -> ClusterSpec:
    """``nodes`` identical nodes in one region and zone."""
    return ClusterSpec(
        name=name or f"{nodes}x{gpus_per_node}-{gpu}",
        nodes=tuple(NodeSpec(f"n{i}-{gpu}", gpu_type(gpu).name, gpus_per_node, region)
                    for i in range(nodes)),
    )
