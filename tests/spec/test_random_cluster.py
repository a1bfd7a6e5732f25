"""Random clusters: topology invariants and exact round trip, for any seed and size."""

from __future__ import annotations

import json

import numpy as np
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.random_cluster import nested_random_cluster, random_cluster

clusters = st.builds(
    random_cluster,
    seed=st.integers(0, 2**32 - 1),
    num_nodes=st.integers(1, 8),
    num_regions=st.integers(1, 4),
    edge_probability=st.sampled_from([0.0, 0.3, 1.0]),
)


@given(clusters)
def test_topology_invariants(c):
    lat, bw = c.topology.latency_s, c.topology.bandwidth_Bps
    n = c.num_devices
    assert lat.shape == bw.shape == (n, n)
    np.testing.assert_allclose(lat, lat.T, rtol=1e-12, atol=0)
    assert np.array_equal(bw, bw.T)
    assert (lat >= 0).all() and (np.diag(lat) == 0).all()
    assert (bw > 0).all() and np.isinf(np.diag(bw)).all()
    off = ~np.eye(n, dtype=bool)
    assert (lat[off] > 0).all() and np.isfinite(bw[off]).all()


@given(clusters)
def test_same_node_pairs_are_faster_than_cross_region_pairs(c):
    node = c.topology.node_of
    region = np.array([d.region for d in c.devices])
    same_node = (node[:, None] == node[None, :]) & ~np.eye(c.num_devices, dtype=bool)
    cross_region = region[:, None] != region[None, :]
    lat, bw = c.topology.latency_s, c.topology.bandwidth_Bps
    if same_node.any() and cross_region.any():
        assert lat[same_node].max() < lat[cross_region].min()
        assert bw[same_node].min() > bw[cross_region].max()
    if cross_region.any():
        # Region links are drawn in [1, 60] ms one way and [0.5, 10] Gbit/s.
        assert lat[cross_region].min() >= 1e-3
        assert bw[cross_region].max() <= 10e9 / 8


@given(clusters)
def test_round_trip_exact(c):
    d = c.to_dict()
    for back in (ClusterSpec.from_dict(d), ClusterSpec.from_dict(json.loads(json.dumps(d))),
                 ClusterSpec.from_dict(yaml.safe_load(yaml.safe_dump(d)))):
        assert back == c
        assert back.to_dict() == d
        assert np.array_equal(back.topology.latency_s, c.topology.latency_s)
        assert np.array_equal(back.topology.bandwidth_Bps, c.topology.bandwidth_Bps)


@given(st.integers(0, 2**32 - 1), st.integers(1, 8), st.integers(1, 4))
def test_deterministic_by_seed(seed, nodes, regions):
    a = random_cluster(seed, num_nodes=nodes, num_regions=regions, edge_probability=0.5)
    b = random_cluster(seed, num_nodes=nodes, num_regions=regions, edge_probability=0.5)
    assert a == b
    assert np.array_equal(a.topology.latency_s, b.topology.latency_s)


def test_different_seeds_give_different_clusters():
    shapes = {json.dumps(random_cluster(s, num_nodes=6, num_regions=3).to_dict()) for s in range(10)}
    assert len(shapes) == 10


def test_first_node_of_each_region_is_never_edge():
    c = random_cluster(3, num_nodes=8, num_regions=4, edge_probability=1.0)
    assert [n.edge for n in c.nodes] == [False] * 4 + [True] * 4
    assert {n.region for n in c.nodes[:4]} == {"r0", "r1", "r2", "r3"}


# --- nested random clusters ---------------------------------------------------------------------

@settings(max_examples=40)
@given(st.integers(0, 2**32 - 1), st.integers(1, 12), st.integers(0, 12), st.integers(1, 5),
       st.integers(1, 3), st.sampled_from([0.0, 0.5]))
def test_nested_cluster_extends_the_smaller_one(seed, nodes, more, regions, block, edge):
    """The larger cluster keeps the smaller one's nodes (names, GPU types and counts, regions,
    edge flags), its region links and every latency and bandwidth between its devices."""
    small = nested_random_cluster(seed, nodes, num_regions=regions, nodes_per_region=block,
                                  edge_probability=edge)
    big = nested_random_cluster(seed, nodes + more, num_regions=regions, nodes_per_region=block,
                                edge_probability=edge)
    assert big.nodes[:nodes] == small.nodes
    assert set(small.region_links) <= set(big.region_links)
    n = small.num_devices
    assert big.devices[:n] == small.devices
    for name in ("latency_s", "bandwidth_Bps"):
        assert np.array_equal(getattr(big.topology, name)[:n, :n], getattr(small.topology, name))
    assert np.array_equal(big.topology.uplink_Bps[:nodes], small.topology.uplink_Bps)
    assert [nd.region for nd in big.nodes] == [f"r{i // block % regions}"
                                               for i in range(nodes + more)]
    firsts = big.nodes[:regions * block:block]  # each region's first node
    assert not any(nd.edge for nd in firsts)
    assert [nd.region for nd in firsts] == [f"r{k}" for k in range(len(firsts))]


def test_nested_cluster_runs_the_smaller_clusters_plans_unchanged():
    """A plan of the 16-GPU cluster is a valid plan of the 64-GPU one with the same estimate."""
    from hetrl.cost import CostModel
    from hetrl.plan import colocated_plan, validate
    from hetrl.spec.presets import workload_preset

    wl = workload_preset("qwen3-4b-grpo-sync").with_(batch_prompts=8)
    gpus = ("A100-80GB", "H100", "L40S", "L4")
    small = nested_random_cluster(7, 2, num_regions=4, nodes_per_region=2, gpus=gpus,
                                  gpus_per_node=(8,))
    big = nested_random_cluster(7, 8, num_regions=4, nodes_per_region=2, gpus=gpus,
                                gpus_per_node=(8,))
    assert [nd.region for nd in big.nodes] == ["r0", "r0", "r1", "r1", "r2", "r2", "r3", "r3"]
    assert (small.num_devices, big.num_devices) == (16, 64)
    for tp in (1, 4):
        plan = colocated_plan(wl, small, tp=tp)
        validate(plan, wl, big)
        assert CostModel(wl, big).estimate(plan).to_dict() == \
            CostModel(wl, small).estimate(plan).to_dict()


def test_nested_cluster_is_deterministic_and_seeded():
    a = nested_random_cluster(11, 6, num_regions=3)
    assert a == nested_random_cluster(11, 6, num_regions=3)
    assert a.name == "nested-11-6"
    shapes = {json.dumps(nested_random_cluster(s, 6, num_regions=3).to_dict()["nodes"])
              for s in range(10)}
    assert len(shapes) == 10
    assert {nd.zone for nd in nested_random_cluster(3, 20, num_regions=4).nodes} == {"a"}
