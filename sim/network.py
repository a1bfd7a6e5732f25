"""A fluid network model on SimPy: flows share link capacities max-min fairly.

A transfer from device a to device b first waits the path's one-way latency, then drains its
bytes at a rate that is recomputed whenever a flow starts or ends (progressive filling: every
flow gets an equal share of its most contended resource, capped by its own per-flow bandwidth --
the cluster topology's path bandwidth). Resources: each node's uplink out and in (the NIC, or an
edge node's slow uplink) for flows between nodes, each device's intra-node link out and in for
flows inside a node, and each direction of a region pair with an aggregate cap
(``RegionLink.aggregate_gbps``) for every flow routed over that pair. All capacities are scaled
by the link efficiency of the cost model (one source of truth for hardware speed; a region pair
by the smallest among its two regions' devices). Link faults scale a region pair's per-flow
bandwidth (and its aggregate, on a direct link) and add latency from the moment they happen.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import simpy

from hetrl.spec.cluster import ClusterSpec
from sim.guards import HORIZON_S, below_resolution, check_horizon

EPS_BYTES = 1e-3


@dataclass(eq=False)
class Flow:
    src: int
    dst: int
    remaining: float
    base_cap: float  # bytes/s: the path's per-flow bandwidth x link efficiency
    resources: tuple
    done: simpy.Event
    weight: int = 1  # identical parallel flows it stands for (each moves ``remaining`` bytes)
    cap: float = 0.0
    rate: float = 0.0


@dataclass
class LinkFault:
    """From now on: flows between regions ``a`` and ``b`` (either direction) run at
    ``bandwidth_factor`` x their bandwidth and wait ``extra_latency_s`` more."""

    a: str
    b: str
    bandwidth_factor: float = 1.0
    extra_latency_s: float = 0.0


@dataclass
class NetworkStats:
    bytes_between_nodes: dict[tuple[str, str], float] = field(default_factory=dict)
    bytes_total: float = 0.0
    transfers: int = 0


class Network:
    def __init__(self, env: simpy.Environment, cluster: ClusterSpec,
                 link_efficiency: Callable[[int], float]):
        self.env = env
        self.cluster = cluster
        topo = cluster.topology
        self.lat = topo.latency_rows
        self.bw = topo.bandwidth_rows
        self.node_of = topo.node_of.tolist()
        self.eff = [link_efficiency(d) for d in range(cluster.num_devices)]
        self.capacity: dict[tuple, float] = {}
        first = {}
        for d in cluster.devices:
            first.setdefault(self.node_of[d.id], d.id)
        for k in range(len(cluster.nodes)):
            up = float(topo.uplink_Bps[k]) * self.eff[first[k]]
            self.capacity[("out", k)] = up
            self.capacity[("in", k)] = up
        for d in cluster.devices:
            self.capacity[("dout", d.id)] = d.gpu.intra_link_gbps * 1e9 * self.eff[d.id]
            self.capacity[("din", d.id)] = d.gpu.intra_link_gbps * 1e9 * self.eff[d.id]
        self.region_of = [d.region for d in cluster.devices]
        # each direction of a capped region pair: its aggregate x the smallest link efficiency
        # of the devices of its two regions (as the cost model's term)
        regions = cluster.regions
        self.pair_names = [(regions[a], regions[b]) for a, b in topo.pair_regions]
        low: dict[str, float] = {}
        for d in cluster.devices:
            low[d.region] = min(low.get(d.region, 1.0), self.eff[d.id])
        for r, (cap, (a, b)) in enumerate(zip(topo.pair_cap_Bps.tolist(), self.pair_names,
                                              strict=True)):
            self.capacity[("pair", r)] = cap * min(low[a], low[b])
        self.faults: list[LinkFault] = []
        self.flows: list[Flow] = []
        self.last = env.now
        self.wake = env.event()
        self.stats = NetworkStats()
        env.process(self._run())

    # --- public ---
    def transfer(self, src: int, dst: int, nbytes: float, weight: int = 1):
        """A SimPy process that moves ``nbytes`` from device ``src`` to ``dst``; ``weight`` > 1
        stands for that many identical parallel flows between the same nodes (each moving
        ``nbytes``), which share the resources as separate flows would."""
        return self.env.process(self._transfer(src, dst, nbytes, weight))

    def add_fault(self, fault: LinkFault) -> None:
        """Apply a link fault now: running flows between the regions slow down at once."""
        self._advance()
        self.faults.append(fault)
        self._recompute()

    def path_latency(self, src: int, dst: int) -> float:
        extra = sum(f.extra_latency_s for f in self._faults_between(src, dst))
        return self.lat[src][dst] + extra

    # --- internals ---
    def _faults_between(self, src: int, dst: int) -> list[LinkFault]:
        ra, rb = self.region_of[src], self.region_of[dst]
        return [f for f in self.faults if {ra, rb} == {f.a, f.b}]

    def _transfer(self, src: int, dst: int, nbytes: float, weight: int = 1):
        if src == dst or nbytes <= 0:
            return
        yield self.env.timeout(self.path_latency(src, dst))
        na, nb = self.node_of[src], self.node_of[dst]
        if na == nb:
            resources = (("dout", src), ("din", dst))
        else:
            resources = (("out", na), ("in", nb)) + tuple(
                ("pair", r) for r in self.cluster.topology.pairs_between(src, dst))
            key = (self.cluster.nodes[na].name, self.cluster.nodes[nb].name)
            self.stats.bytes_between_nodes[key] = (self.stats.bytes_between_nodes.get(key, 0.0)
                                                   + nbytes * weight)
        self.stats.bytes_total += nbytes * weight
        self.stats.transfers += weight
        flow = Flow(src, dst, float(nbytes), self.bw[src][dst] * self.eff[dst], resources,
                    self.env.event(), weight)
        self._advance()
        self.flows.append(flow)
        self._recompute()
        yield flow.done

    def _advance(self) -> None:
        dt = self.env.now - self.last
        if dt > 0:
            for f in self.flows:
                f.remaining -= f.rate * dt
        self.last = self.env.now

    def _recompute(self, notify: bool = True) -> None:
        """Max-min fair rates by progressive filling; wake the scheduler if asked."""
        users: dict[tuple, int] = {}
        for f in self.flows:
            f.cap = f.base_cap
            for fault in self._faults_between(f.src, f.dst):
                f.cap *= fault.bandwidth_factor
            for r in f.resources:
                users[r] = users.get(r, 0) + f.weight
        left = {r: self.capacity[r] * self._pair_factor(r) if r[0] == "pair" else self.capacity[r]
                for r in users}
        active = list(self.flows)
        while active:
            share = {r: left[r] / n for r, n in users.items() if n > 0}
            bottleneck = [min([f.cap] + [share[r] for r in f.resources]) for f in active]
            v = min(bottleneck)
            rest = []
            for f, b in zip(active, bottleneck, strict=True):
                if b <= v * (1 + 1e-12):
                    f.rate = v
                    for r in f.resources:
                        left[r] = max(left[r] - v * f.weight, 0.0)
                        users[r] -= f.weight
                else:
                    rest.append(f)
            active = rest
        if notify and not self.wake.triggered:
            self.wake.succeed()

    def _pair_factor(self, resource: tuple) -> float:
        """The faults' bandwidth factors on a capped region pair (a direct link's)."""
        a, b = self.pair_names[resource[1]]
        factor = 1.0
        for fault in self.faults:
            if {a, b} == {fault.a, fault.b}:
                factor *= fault.bandwidth_factor
        return factor

    def describe(self, f: Flow) -> str:
        """A flow's link in words: devices, nodes, regions, and the faults on it."""
        nodes = self.cluster.nodes
        a, b = nodes[self.node_of[f.src]], nodes[self.node_of[f.dst]]
        faults = "; ".join(f"link_degraded {x.a}/{x.b} bandwidth_factor {x.bandwidth_factor:g}"
                           for x in self._faults_between(f.src, f.dst))
        return (f"the transfer of {f.remaining:.3g} bytes from device {f.src} ({a.name}, "
                f"{a.region}) to device {f.dst} ({b.name}, {b.region}) at {f.rate:.3g} B/s"
                + (f" (fault: {faults})" if faults else ""))

    def _run(self):
        while True:
            self.wake = self.env.event()
            if self.flows:
                first = min(self.flows, key=lambda f: f.remaining / f.rate)
                nxt = first.remaining / first.rate
                # wait no further than the horizon: a stop before it (a device lost) still ends
                # the run normally; at the horizon, the flow that cannot finish is named
                wait = min(nxt, max(HORIZON_S - self.env.now, 0.0))
                yield self.env.timeout(max(wait, 0.0)) | self.wake
                if wait < nxt and self.env.now >= HORIZON_S and first in self.flows:
                    self._advance()
                    check_horizon(self.env.now, first.remaining / first.rate,
                                  self.describe(first))
            else:
                yield self.wake
            self._advance()
            now = self.env.now
            # done: drained, or what is left is shorter than the clock can resolve at ``now``
            # (waiting for it would not move the clock: the loop would spin)
            finished = [f for f in self.flows if f.remaining <= EPS_BYTES
                        or f.remaining <= f.rate * 1e-9
                        or below_resolution(now, f.remaining / f.rate)]
            if finished:
                for f in finished:
                    self.flows.remove(f)
                    f.done.succeed()
                self._recompute(notify=False)
