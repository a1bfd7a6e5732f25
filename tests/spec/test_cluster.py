"""Clusters: the paper's four scenarios, path-aware topology, YAML, round trip, errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from hetrl.describe import describe_cluster
from hetrl.errors import SpecError
from hetrl.io import load_cluster
from hetrl.spec.cluster import ClusterSpec, NodeSpec, RegionLink, homogeneous
from hetrl.spec.presets import CLUSTER_PRESETS, SCENARIOS, cluster_preset

A100_NVLINK_BPS = 300e9   # 600 GB/s bidirectional -> 300 GB/s each way
PCIE4_BPS = 32e9
MS = 1e-3


# --- the paper's 64-GPU testbed ------------------------------------------------------------------

@pytest.mark.parametrize("scenario", SCENARIOS)
def test_paper64_has_24_a100_24_l40s_16_l4(paper_clusters, scenario):
    c = paper_clusters[scenario]
    assert c.name == f"paper64-{scenario}"
    assert c.num_devices == 64 and len(c.nodes) == 8
    assert c.gpu_counts() == {"A100-80GB": 24, "L40S": 24, "L4": 16}
    assert [d.id for d in c.devices] == list(range(64))
    # Nodes in order: devices 0-23 A100, 24-47 L40S, 48-63 L4.
    assert {d.gpu.name for d in c.devices[:24]} == {"A100-80GB"}
    assert {d.gpu.name for d in c.devices[48:]} == {"L4"}
    info = describe_cluster(c)
    assert info["aggregate_bf16_tflops"] == pytest.approx(24 * 312 + 24 * 362 + 16 * 121)
    # the memory the driver reports: 81,920, 46,068 and 23,034 MiB
    assert info["aggregate_memory_gb"] == pytest.approx(
        (24 * 81920 + 24 * 46068 + 16 * 23034) * 2**20 / 1e9)


def test_multi_continent_ranges(paper_clusters):
    info = describe_cluster(paper_clusters["multi-continent"])
    assert len(info["regions"]) == 8
    assert {"us-east-1", "us-east-2"} <= set(info["regions"])
    assert not {"eu-south-2", "eu-central-2"} & set(info["regions"])
    lat, bw = info["one_way_latency_s"], info["bandwidth_gbps"]
    assert 4.5 * MS <= lat["min"] <= 5.0 * MS       # paper: 5-60 ms
    assert 60.0 * MS <= lat["max"] <= 61.0 * MS     # Ohio <-> Stockholm, RTT 121 ms
    assert bw["min"] == pytest.approx(0.83)         # paper: 0.9-5.0 Gbps
    assert bw["max"] == pytest.approx(5.0)


def test_multi_country_ranges(paper_clusters):
    info = describe_cluster(paper_clusters["multi-country"])
    assert len(info["regions"]) == 8
    assert all(r.startswith("eu-") for r in info["regions"])
    lat, bw = info["one_way_latency_s"], info["bandwidth_gbps"]
    assert 4.5 * MS <= lat["min"] <= 5.0 * MS       # paper: 5-30 ms
    assert 25.0 * MS <= lat["max"] <= 26.0 * MS
    assert bw["min"] == pytest.approx(1.99)         # paper: 1.9-5.0 Gbps
    assert bw["max"] == pytest.approx(5.0)


def test_multi_continent_pair_uses_the_measured_rtt(paper_clusters):
    c = paper_clusters["multi-continent"]
    # Device 0 in us-east-1, device 63 in eu-south-1 (Milan): RTT 101.5 ms -> 50.75 ms one way,
    # plus two NIC half-hops of 0.025 ms and two GPU<->host hops of 1 us.
    assert c.latency_s(0, 63) == pytest.approx(50.75 * MS + 0.05 * MS + 2e-6)
    assert c.bandwidth_Bps(0, 63) == pytest.approx(0.99e9 / 8)


def test_hybrid_has_two_regions_and_relayed_edge_nodes(paper_clusters):
    c = paper_clusters["multi-region-hybrid"]
    info = describe_cluster(c)
    assert info["regions"] == ["us-east-1", "us-east-2"]
    assert info["edge_nodes"] == ["n6-L4", "n7-L4"]
    edge, ohio, virginia = 48, 8, 0                # an L4 (edge, Virginia), an A100 in Ohio, one in VA
    assert (c.device(edge).edge, c.device(edge).region) == (True, "us-east-1")
    assert c.device(ohio).region == "us-east-2"
    # Edge -> Ohio: 1 Gbps uplink to Virginia, then the 10 ms / 5 Gbps link.
    assert c.bandwidth_Bps(edge, ohio) == pytest.approx(1.25e8)
    assert c.latency_s(edge, ohio) > 10 * MS
    assert c.latency_s(edge, ohio) == pytest.approx(1 * MS + 10 * MS + 0.025 * MS + 2e-6)
    # Relayed: the route passes through the Virginia gateway.
    graph = c.topology.graph  # the edge host's only neighbours are its GPUs and its region
    assert {v for v in graph.neighbors(("host", "n6-L4")) if v[0] != "gpu"} == {
        ("region", "us-east-1")}
    # Virginia <-> Ohio between ordinary nodes: 10 ms, 5 Gbps.
    assert c.bandwidth_Bps(virginia, ohio) == pytest.approx(5e9 / 8)
    assert c.latency_s(virginia, ohio) == pytest.approx(10.05 * MS + 2e-6)
    # Edge -> Virginia node: only the 1 Gbps uplink.
    assert c.bandwidth_Bps(edge, virginia) == pytest.approx(1.25e8)


def test_single_region_latency_and_nic_bandwidth(paper_clusters):
    c = paper_clusters["single-region"]
    info = describe_cluster(c)
    assert info["regions"] == ["us-east-1"]
    assert info["one_way_latency_s"]["min"] == pytest.approx(0.05 * MS, rel=0.1)
    assert info["one_way_latency_s"]["max"] == pytest.approx(0.05 * MS, rel=0.1)
    # A100 node (400 Gbps) to L4 node (100 Gbps): the slower NIC.
    assert c.bandwidth_Bps(0, 48) == pytest.approx(100e9 / 8)
    assert c.bandwidth_Bps(0, 8) == pytest.approx(400e9 / 8)


def test_same_node_pairs_use_the_intra_node_link(paper_clusters):
    for c in paper_clusters.values():
        assert c.bandwidth_Bps(0, 7) == A100_NVLINK_BPS      # A100 NVLink
        assert c.bandwidth_Bps(24, 31) == PCIE4_BPS          # L40S over PCIe
        assert c.latency_s(0, 7) == pytest.approx(2e-6)      # two 1 us GPU<->host hops
        assert c.latency_s(0, 7) < c.latency_s(0, 8)
        assert c.bandwidth_Bps(0, 7) > c.bandwidth_Bps(0, 8)


def test_matrices_are_symmetric_with_zero_diagonal(paper_clusters):
    for c in paper_clusters.values():
        lat, bw = c.topology.latency_s, c.topology.bandwidth_Bps
        np.testing.assert_allclose(lat, lat.T, rtol=1e-12)
        assert np.array_equal(bw, bw.T)
        assert (np.diag(lat) == 0).all() and np.isinf(np.diag(bw)).all()


def test_device_lookup_rejects_unknown_ids(paper_clusters):
    c = paper_clusters["single-region"]
    with pytest.raises(SpecError) as err:
        c.device(64)
    assert err.value.field == "device" and "0..63" in str(err.value)
    with pytest.raises(SpecError):
        c.latency_s(0, -1)


def test_all_presets_build():
    for name in CLUSTER_PRESETS:
        c = cluster_preset(name)
        assert c.name == name and c.num_devices >= (4 if name.startswith("tiny4") else 8)
    with pytest.raises(SpecError, match="unknown preset"):
        cluster_preset("paper128")


# --- round trip and YAML -------------------------------------------------------------------------

@pytest.mark.parametrize("scenario", SCENARIOS)
def test_round_trip_exact(paper_clusters, scenario):
    c = paper_clusters[scenario]
    d = c.to_dict()
    for back in (ClusterSpec.from_dict(d), ClusterSpec.from_dict(json.loads(json.dumps(d))),
                 ClusterSpec.from_dict(yaml.safe_load(yaml.safe_dump(d)))):
        assert back == c
        assert back.to_dict() == d
        assert np.array_equal(back.topology.latency_s, c.topology.latency_s)


MIXED_YAML = """
name: mixed
regions: aws
gpu_types:
  - {name: RTX-A6000, bf16_tflops: 154.8, memory_gb: 48, hbm_gbps: 768}
nodes:
  - {name: va, gpu: A100, count: 8, region: us-east-1, repeat: 2}
  - {gpu: L40S, count: 4, region: us-east-1, zone: b}
  - {gpu: RTX-A6000, count: 2, region: us-east-2, nic_gbps: 50}
  - {gpu: L4, count: 4, region: us-east-1, edge: true}
  - {gpu: H100, count: 8, region: eu-west-1}
region_links:
  - {a: us-east-1, b: us-east-2, latency_ms: 10, bandwidth_gbps: 5}
network: {inter_zone_latency_ms: 1.0, edge_bandwidth_gbps: 2}
"""


@pytest.fixture()
def mixed(tmp_path) -> ClusterSpec:
    path = tmp_path / "mixed.yaml"
    path.write_text(MIXED_YAML)
    return load_cluster(path)


def test_yaml_repeat_regions_aws_and_user_gpu_types(mixed):
    assert [n.name for n in mixed.nodes] == ["va.0", "va.1", "n2-L40S", "n3-RTX-A6000", "n4-L4",
                                             "n5-H100"]
    assert mixed.nodes[0].gpu == "A100-80GB"              # the alias resolved
    assert mixed.num_devices == 8 + 8 + 4 + 2 + 4 + 8
    assert mixed.gpu_counts()["RTX-A6000"] == 2
    assert mixed.device(20).gpu.hbm_gbps == 768           # the user type
    assert mixed.regions == ("us-east-1", "us-east-2", "eu-west-1")
    links = {frozenset((lk.a, lk.b)): lk for lk in mixed.region_links}
    assert len(links) == 3                                # every pair of used regions
    assert links[frozenset(("us-east-1", "us-east-2"))].latency_ms == 10   # explicit link wins
    assert links[frozenset(("us-east-1", "eu-west-1"))].latency_ms == 69.5 / 2  # AWS RTT / 2
    assert mixed.network.inter_zone_latency_ms == 1.0
    assert mixed.nodes[4].edge and mixed.nodes[3].nic_gbps == 50


def test_yaml_cluster_paths(mixed):
    # va.0 (zone a) -> L40S node (zone b) in one region: 1 ms between zones, 25 Gbps.
    assert mixed.latency_s(0, 16) == pytest.approx(1.0 * MS + 2e-6)
    assert mixed.bandwidth_Bps(0, 16) == pytest.approx(25e9 / 8)
    # va.0 -> the A6000 node in Ohio: the 5 Gbps region link is narrower than its 50 Gbps NIC.
    assert mixed.bandwidth_Bps(0, 20) == pytest.approx(5e9 / 8)
    # Edge node uplink is 2 Gbps here.
    assert mixed.bandwidth_Bps(22, 0) == pytest.approx(2e9 / 8)


def test_yaml_round_trip_keeps_user_types(mixed, tmp_path):
    d = mixed.to_dict()
    assert d["gpu_types"][0]["name"] == "RTX-A6000"
    assert "regions" not in d                             # links are written out explicitly
    assert ClusterSpec.from_dict(yaml.safe_load(yaml.safe_dump(d))) == mixed
    path = tmp_path / "again.json"
    path.write_text(json.dumps(d))
    assert load_cluster(path) == mixed


def test_homogeneous_helper():
    c = homogeneous("H100", nodes=2)
    assert c.num_devices == 16 and c.gpu_counts() == {"H100": 16}
    assert c.bandwidth_Bps(0, 8) == pytest.approx(3200e9 / 8)


# --- errors --------------------------------------------------------------------------------------

ONE = {"nodes": [{"gpu": "A100", "count": 2, "region": "x"}]}
TWO = {"nodes": [{"gpu": "A100", "count": 2, "region": "x"}, {"gpu": "L4", "region": "y"}],
       "region_links": [{"a": "x", "b": "y", "latency_ms": 20, "bandwidth_gbps": 2}]}


def _link(**change):
    return {**TWO, "region_links": [{**TWO["region_links"][0], **change}]}


@pytest.mark.parametrize(("data", "field", "problem"), [
    ({"nodes": [{"gpu": "B300"}]}, "nodes[0].gpu", "unknown GPU type; known: A100, A100-40GB"),
    ({"nodes": [{"gpu": "L4", "count": 0}]}, "nodes[0].count", "must be >= 1"),
    ({"nodes": [{"gpu": "L4", "count": 73}]}, "nodes[0].count", "<= 72"),
    ({"nodes": [{"gpu": "L4", "nic_gbps": 0}]}, "nodes[0].nic_gbps", "must be > 0"),
    ({"nodes": [{"gpu": "L4", "nic_gbps": 4e11}]}, "nodes[0].nic_gbps", "units: Gbit/s"),
    ({"nodes": [{"gpu": "L4", "edge": "yes"}]}, "nodes[0].edge", "true or false"),
    ({"nodes": [{"gpu": "L4", "gpus": 8}]}, "nodes[0].gpus", "unknown key"),
    ({"nodes": []}, "nodes", "non-empty list"),
    ({"nodes": [{"name": "a", "gpu": "L4"}, {"name": "a", "gpu": "L4"}]}, "nodes.name", "unique"),
    (_link(bandwidth_gbps=0), "region_links[0].bandwidth_gbps", "must be > 0"),
    (_link(bandwidth_gbps=-5), "region_links[0].bandwidth_gbps", "must be > 0"),
    (_link(latency_ms=60000), "region_links[0].latency_ms", "[0, 1000] ms (units: milliseconds)"),
    (_link(latency_ms=-1), "region_links[0].latency_ms", "units: milliseconds"),
    (_link(b="x"), "region_links[0].b", "must differ from a"),
    ({**TWO, "region_links": []}, "region_links", "topology is disconnected"),
    ({**ONE, "regions": "gcp"}, "regions", "only built-in region matrix is 'aws'"),
    ({**ONE, "regions": "aws"}, "nodes[0].region", "not an AWS region code"),
    ({**ONE, "network": {"edge_bandwidth_gbps": 0}}, "network.edge_bandwidth_gbps", "> 0"),
    ({**ONE, "network": {"intra_zone_latency_ms": 5000}}, "network.intra_zone_latency_ms",
     "units: milliseconds"),
    ({**ONE, "network": {"jitter_ms": 1}}, "network.jitter_ms", "unknown key"),
    ({**ONE, "gpu_types": [{"name": "X", "bf16_tflops": 1, "memory_gb": 1, "hbm_gbps": 2e9}]},
     "gpu_types[0].hbm_gbps", "units: GB/s"),
    ({**ONE, "region_links": 5}, "region_links", "must be a list"),
    ({**ONE, "schema_version": 2}, "schema_version", "reads version 1"),
    ({**ONE, "zones": 2}, "zones", "unknown key"),
])
def test_errors_name_the_field(data, field, problem):
    with pytest.raises(SpecError) as err:
        ClusterSpec.from_dict(data)
    assert err.value.field == field
    assert problem in str(err.value)


def test_disconnected_topology_lists_the_region_groups():
    with pytest.raises(SpecError) as err:
        ClusterSpec("c", (NodeSpec("a", "L4", 1, "x"), NodeSpec("b", "L4", 1, "y"),
                          NodeSpec("c", "L4", 1, "z")),
                    region_links=(RegionLink("x", "y", 5, 1),))
    assert err.value.field == "region_links"
    assert err.value.value == [["z"], ["x", "y"]]


def test_malformed_yaml_file(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("nodes: [{gpu: A100, count: 8\n")
    with pytest.raises(SpecError) as err:
        load_cluster(path)
    # the value is the file's path (named once), and the parser's line and column follow
    assert (err.value.field, err.value.value) == ("cluster", str(path))
    assert "malformed yaml" in str(err.value) and "\n" not in str(err.value)
    assert "line 2, column 1" in str(err.value)


def test_file_errors_name_the_file_and_field(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"nodes": [{"gpu": "A100"}, {"gpu": "TPU"}]}))
    with pytest.raises(SpecError) as err:
        load_cluster(path)
    assert err.value.field == "c.yaml: nodes[1].gpu"
    path.write_text("- just a list\n")
    with pytest.raises(SpecError, match="mapping at the top level"):
        load_cluster(path)
    with pytest.raises(SpecError, match="neither a preset nor a file"):
        load_cluster(tmp_path / "missing.yaml")


def test_node_errors_name_the_entry_in_the_file():
    # the fifth entry (nodes[4]) comes after repeats: the error names it, not nodes[6]
    nodes = [{"gpu": "A100", "repeat": 3}, {"gpu": "L4"}, {"gpu": "L4"}, {"gpu": "L4"},
             {"gpu": "L4", "count": 73}]
    with pytest.raises(SpecError, match=r"^nodes\[4\]\.count = 73: must be <= 72"):
        ClusterSpec.from_dict({"nodes": nodes})
    # an unknown key of a user GPU type shows its value
    with pytest.raises(SpecError, match=r"^gpu_types\[0\]\.colour = 'red': unknown key"):
        ClusterSpec.from_dict({"gpu_types": [{"name": "X", "bf16_tflops": 1, "memory_gb": 1,
                                              "hbm_gbps": 1, "colour": "red"}],
                               "nodes": [{"gpu": "X"}]})
