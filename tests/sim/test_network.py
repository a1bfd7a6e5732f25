"""The fluid network on hand-computed cases: latency + bytes / (bandwidth x efficiency), max-min
fair sharing of node uplinks, per-flow caps, link faults mid-transfer, weighted flows.

Cluster (one zone per region; NICs 8 Gbit/s = 1e9 B/s; A100 NVLink 300e9 B/s per direction):
  node a (region r0): devices 0, 1     node b (region r0): devices 2, 3
  node c (region r1): device 4         r0 <-> r1: 10 ms one way, 0.8 Gbit/s = 1e8 B/s per flow
Latencies: a -> b = 1 us (GPU -> host) + 0.025 ms (host -> zone) + 0.025 ms (zone -> host) + 1 us
= 52 us; a -> c = 1 us + 0.025 ms + 10 ms + 0.025 ms + 1 us = 10.052 ms; inside a node 2 us.
"""

from __future__ import annotations

import pytest
import simpy

from hetrl.spec.cluster import ClusterSpec, NodeSpec, RegionLink
from sim.network import LinkFault, Network

LAT_AB = 52e-6
LAT_AC = 10.052e-3
LAT_IN = 2e-6
NIC = 1e9
REGION = 1e8


@pytest.fixture(scope="module")
def cluster() -> ClusterSpec:
    c = ClusterSpec("net", (NodeSpec("a", "A100-80GB", 2, "r0", nic_gbps=8),
                            NodeSpec("b", "A100-80GB", 2, "r0", nic_gbps=8),
                            NodeSpec("c", "A100-80GB", 1, "r1", nic_gbps=8)),
                    (RegionLink("r0", "r1", 10.0, 0.8),))
    # the topology agrees with the hand-computed path facts
    assert c.latency_s(0, 2) == pytest.approx(LAT_AB, rel=1e-12)
    assert c.latency_s(0, 4) == pytest.approx(LAT_AC, rel=1e-12)
    assert c.latency_s(0, 1) == pytest.approx(LAT_IN, rel=1e-12)
    assert c.bandwidth_Bps(0, 2) == NIC and c.bandwidth_Bps(0, 4) == REGION
    assert c.bandwidth_Bps(0, 1) == 300e9
    return c


def run_flows(cluster, flows, efficiency=1.0, faults=()):
    """Run ``flows`` = [(name, start_s, src, dst, bytes, weight)] and ``faults`` = [(at_s,
    LinkFault)]; return each flow's finish time and the network."""
    env = simpy.Environment()
    net = Network(env, cluster, lambda d: efficiency)
    ends: dict[str, float] = {}

    def flow(name, start, src, dst, nbytes, weight):
        yield env.timeout(start)
        yield net.transfer(src, dst, nbytes, weight)
        ends[name] = env.now

    def fault(at, f):
        yield env.timeout(at)
        net.add_fault(f)

    for spec in flows:
        env.process(flow(*spec))
    for at, f in faults:
        env.process(fault(at, f))
    env.run()
    assert not net.flows  # every flow drained
    return ends, net


def test_one_flow_is_latency_plus_bytes_over_bandwidth_times_efficiency(cluster):
    # between nodes: 52 us + 1e9 B / (1e9 B/s x 0.8) = 1.250052 s
    ends, net = run_flows(cluster, [("x", 0.0, 0, 2, 1e9, 1)], efficiency=0.8)
    assert ends["x"] == pytest.approx(LAT_AB + 1.25, rel=1e-12)
    assert net.stats.bytes_total == 1e9 and net.stats.transfers == 1
    assert net.stats.bytes_between_nodes == {("a", "b"): 1e9}
    # inside a node (NVLink): 2 us + 3e9 B / (300e9 B/s x 0.8) = 0.012502 s
    ends, net = run_flows(cluster, [("y", 0.0, 0, 1, 3e9, 1)], efficiency=0.8)
    assert ends["y"] == pytest.approx(LAT_IN + 0.0125, rel=1e-12)
    assert net.stats.bytes_between_nodes == {}  # not between nodes
    # nothing to move: no time at all
    ends, _ = run_flows(cluster, [("z", 0.0, 0, 2, 0.0, 1), ("w", 0.0, 3, 3, 1e9, 1)])
    assert ends == {"z": 0.0, "w": 0.0}


def test_two_flows_share_an_uplink_max_min_fairly(cluster):
    # 0 -> 2 (0.5e9 B) and 1 -> 3 (1e9 B) both leave node a: 0.5e9 B/s each until the first ends
    # at 52 us + 1 s; the second then has 0.5e9 B left at the full 1e9 B/s: 0.5 s more.
    ends, _ = run_flows(cluster, [("small", 0.0, 0, 2, 0.5e9, 1), ("big", 0.0, 1, 3, 1e9, 1)])
    assert ends["small"] == pytest.approx(LAT_AB + 1.0, rel=1e-12)
    assert ends["big"] == pytest.approx(LAT_AB + 1.5, rel=1e-12)


def test_two_flows_into_one_node_share_its_downlink(cluster):
    # 0 -> 2 and 1 -> 2: node a's uplink out and node b's in both carry the two flows:
    # 0.5e9 B/s each, 1e9 B each: both end at 52 us + 2 s.
    ends, _ = run_flows(cluster, [("x", 0.0, 0, 2, 1e9, 1), ("y", 0.0, 1, 2, 1e9, 1)])
    assert ends["x"] == pytest.approx(LAT_AB + 2.0, rel=1e-12)
    assert ends["y"] == pytest.approx(LAT_AB + 2.0, rel=1e-12)


def test_a_capped_flow_leaves_the_rest_of_the_uplink_to_another(cluster):
    # Both start draining at t0 = 10.052 ms (the a -> b flow starts 10 ms later to line up).
    # 0 -> 4 crosses regions: capped at 1e8 B/s; 1 -> 2 gets 1e9 - 1e8 = 0.9e9 B/s.
    # 0 -> 4 moves 1e8 B: ends at t0 + 1 s. 1 -> 2 moves 1.8e9 B: 0.9e9 in that first second,
    # then the whole 1e9 B/s for the remaining 0.9e9 B: ends at t0 + 1.9 s.
    t0 = LAT_AC
    ends, _ = run_flows(cluster, [("far", 0.0, 0, 4, 1e8, 1),
                                  ("near", LAT_AC - LAT_AB, 1, 2, 1.8e9, 1)])
    assert ends["far"] == pytest.approx(t0 + 1.0, rel=1e-9)
    assert ends["near"] == pytest.approx(t0 + 1.9, rel=1e-9)


def test_link_fault_mid_transfer_slows_the_rest(cluster):
    # 0 -> 4: 1e8 B at 1e8 B/s from t0 = 10.052 ms. At t0 + 0.5 s (half done) the r0-r1 link
    # drops to 0.5x: the other 0.5e8 B take 0.5e8 / 0.5e8 = 1 s -> ends at t0 + 1.5 s.
    t0 = LAT_AC
    fault = LinkFault("r1", "r0", bandwidth_factor=0.5, extra_latency_s=0.02)
    ends, net = run_flows(cluster, [("far", 0.0, 0, 4, 1e8, 1),
                                    # started after the fault: 20 ms more latency, half the rate
                                    ("late", 2.0, 1, 4, 1e7, 1),
                                    # inside region r0: untouched by the fault
                                    ("near", 0.6, 1, 2, 1e8, 1)],
                          faults=[(t0 + 0.5, fault)])
    assert ends["far"] == pytest.approx(t0 + 1.5, rel=1e-9)
    # 2 s + (10.052 + 20) ms + 1e7 B / 0.5e8 B/s = 2.230052 s
    assert ends["late"] == pytest.approx(2.0 + LAT_AC + 0.02 + 0.2, rel=1e-9)
    # 0.6 s + 52 us, then 1e8 B at 0.95e9 B/s: the degraded far flow holds 0.5e8 B/s of a's
    # uplink (until t0 + 1.5 s, after this flow ends) and leaves it the rest.
    assert ends["near"] == pytest.approx(0.6 + LAT_AB + 1e8 / 0.95e9, rel=1e-9)
    assert net.path_latency(0, 4) == pytest.approx(LAT_AC + 0.02, rel=1e-12)
    assert net.path_latency(0, 2) == pytest.approx(LAT_AB, rel=1e-12)


@pytest.mark.parametrize("bundled", [True, False])
def test_a_weighted_flow_behaves_like_that_many_flows(cluster, bundled):
    # Three flows 0 -> 4 (1e8 B each, capped at 1e8 B/s each: 3e8 B/s of a's uplink) and one
    # 1 -> 2 flow of 0.7e9 B that gets the remaining 0.7e9 B/s: all four end at t0 + 1 s,
    # whether the three are one flow of weight 3 or three flows.
    far = [("far", 0.0, 0, 4, 1e8, 3)] if bundled else [
        (f"far{k}", 0.0, 0, 4, 1e8, 1) for k in range(3)]
    ends, net = run_flows(cluster, far + [("near", LAT_AC - LAT_AB, 1, 2, 0.7e9, 1)])
    t0 = LAT_AC
    for name, t in ends.items():
        assert t == pytest.approx(t0 + 1.0, rel=1e-9), name
    assert net.stats.bytes_total == pytest.approx(3e8 + 0.7e9)
    assert net.stats.transfers == 4
    assert net.stats.bytes_between_nodes[("a", "c")] == pytest.approx(3e8)


def test_weighted_flows_share_with_uncapped_flows_per_flow(cluster):
    # weight 3 flow 0 -> 2 and one flow 1 -> 3 leave node a: 4 flows, 0.25e9 B/s each;
    # 1e8 B each: all end at 52 us + 0.4 s.
    ends, _ = run_flows(cluster, [("w3", 0.0, 0, 2, 1e8, 3), ("one", 0.0, 1, 3, 1e8, 1)])
    assert ends["w3"] == pytest.approx(LAT_AB + 0.4, rel=1e-12)
    assert ends["one"] == pytest.approx(LAT_AB + 0.4, rel=1e-12)
