"""Every commercial AWS region (issue 40, item 1): measured cells kept, great-circle estimates
(source G) elsewhere with their fit error stated, links to regions outside the matrix, and a
misspelled region named where it is written."""

from __future__ import annotations

import pytest

from experiments.estimate_aws_rtt import bandwidth_gbps, fit, great_circle_km, regions
from hetrl.errors import SpecError
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.regions import aws_bandwidth_gbps, aws_regions, aws_rtt_ms, aws_rtt_source

PAPER_TEN = ("us-east-1", "us-east-2", "eu-west-3", "eu-north-1", "eu-west-2", "eu-west-1",
             "eu-south-2", "eu-central-2", "eu-central-1", "eu-south-1")
FLEET = [{"name": "va-h100", "gpu": "H100", "region": "us-east-1", "repeat": 2},
         {"name": "or-l40s", "gpu": "L40S", "region": "us-west-2", "repeat": 4},
         {"name": "ie-a100", "gpu": "A100", "region": "eu-west-1", "repeat": 2}]


def test_the_matrix_covers_every_commercial_region_symmetrically():
    known = aws_regions()
    assert tuple(known)[:10] == PAPER_TEN
    for r in ("us-west-1", "us-west-2", "ca-central-1", "sa-east-1", "af-south-1", "il-central-1",
              "mx-central-1", "me-central-1", "ap-south-1", "ap-northeast-1", "ap-southeast-2"):
        assert r in known
    rtt, bw, src = aws_rtt_ms(), aws_bandwidth_gbps(), aws_rtt_source()
    for a in known:
        assert rtt[(a, a)] == 0
        for b in known:
            if a != b:
                assert rtt[(a, b)] == rtt[(b, a)] > 0 and bw[(a, b)] == bw[(b, a)]
                assert src[(a, b)] == src[(b, a)]


def test_measured_cells_keep_their_values_and_others_are_marked_estimated():
    rtt, src = aws_rtt_ms(), aws_rtt_source()
    assert rtt[("us-east-1", "eu-west-1")] == 69.5 and src[("us-east-1", "eu-west-1")] == "C"
    assert rtt[("eu-north-1", "eu-south-2")] == 50.5 and src[("eu-north-1", "eu-south-2")] == "A"
    for (a, b), s in src.items():
        assert (s in "CAE") == (a in PAPER_TEN and b in PAPER_TEN), (a, b, s)
        if s == "G":  # bandwidth by the same window model as the measured cells
            assert aws_bandwidth_gbps()[(a, b)] == pytest.approx(bandwidth_gbps(rtt[(a, b)]),
                                                                 abs=0.006)


def test_the_estimate_fits_the_measured_pairs():
    f = fit(regions())
    assert f["pairs"] == 43
    assert 1.2 < f["inflation"] < 1.6 and 0 < f["overhead_ms"] < 20
    assert f["rmse_ms"] < 8 and f["mape"] < 0.2
    # light in fibre over the great circle is a floor: every estimate lies above it
    rtt = aws_rtt_ms()
    coords = regions()
    for (a, b), s in aws_rtt_source().items():
        if s == "G":
            assert rtt[(a, b)] > 2 * great_circle_km(coords[a], coords[b]) / 2e5 * 1e3


def test_the_issue_fleet_needs_no_links():
    c = ClusterSpec.from_dict({"name": "fleet", "regions": "aws", "nodes": FLEET})
    assert c.regions == ("us-east-1", "us-west-2", "eu-west-1")
    assert len(c.region_links) == 3
    link = next(lk for lk in c.region_links if {lk.a, lk.b} == {"us-east-1", "us-west-2"})
    assert link.latency_ms == aws_rtt_ms()[("us-east-1", "us-west-2")] / 2


def test_a_misspelled_region_is_named_with_the_closest():
    nodes = [dict(n) for n in FLEET]
    nodes[2]["region"] = "eu-west1"
    with pytest.raises(SpecError) as info:
        ClusterSpec.from_dict({"regions": "aws", "nodes": nodes})
    assert info.value.field == "nodes[2].region"
    assert "did you mean 'eu-west-1'" in str(info.value)


def test_region_links_add_regions_outside_the_matrix_and_override_pairs():
    nodes = [{"gpu": "H100", "region": "us-east-1"}, {"gpu": "L4", "region": "onprem-lab"},
             {"gpu": "L40S", "region": "us-west-2"}]
    links = [{"a": "onprem-lab", "b": "us-east-1", "latency_ms": 4, "bandwidth_gbps": 10},
             {"a": "us-west-2", "b": "us-east-1", "latency_ms": 30, "bandwidth_gbps": 2}]
    c = ClusterSpec.from_dict({"regions": "aws", "nodes": nodes, "region_links": links})
    pairs = {frozenset((lk.a, lk.b)): lk for lk in c.region_links}
    assert pairs[frozenset(("us-east-1", "us-west-2"))].latency_ms == 30  # the override wins
    assert len(pairs) == 2  # onprem-lab reaches us-west-2 relayed through us-east-1
    assert c.latency_s(2, 1) > 0


def test_a_link_to_a_region_no_node_uses_is_an_error():
    nodes = [{"gpu": "L4", "region": "eu-west-1"}, {"gpu": "L4", "region": "us-east-1"}]
    links = [{"a": "eu-west1", "b": "us-east-1", "latency_ms": 35, "bandwidth_gbps": 1}]
    with pytest.raises(SpecError) as info:
        ClusterSpec.from_dict({"nodes": nodes, "region_links": links})
    assert info.value.field == "region_links[0].a"
    assert "no node is in this region" in str(info.value)
    assert "did you mean 'eu-west-1'" in str(info.value)
