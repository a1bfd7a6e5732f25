"""Hardware primitives: kernel, HBM and point-to-point times, and collectives on hand-built links."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetrl.cost.primitives import (
    GroupLinks,
    all_gather_time,
    all_reduce_pieces,
    all_reduce_time,
    all_reduce_time_vec,
    broadcast_time,
    group_links,
    hbm_time,
    matmul_time,
    p2p_time,
    reduce_scatter_time,
)
from hetrl.spec.cluster import ClusterSpec, NodeSpec, RegionLink, homogeneous


def flat(n: int, lat: float, bw: float) -> GroupLinks:
    """n devices on one node: ring = intra links, no hierarchy."""
    return GroupLinks(n, lat, bw, 1, n, lat, bw, 0.0, math.inf)


# 2 nodes x 2 devices: NVLink-like inside (1 us, 300 GB/s), a 1 ms / 1 GB/s link between.
HIER = GroupLinks(n=4, ring_latency_s=1e-3, ring_Bps=1e9, nodes=2, per_node=2,
                  intra_latency_s=1e-6, intra_Bps=300e9, inter_latency_s=1e-3, inter_Bps=1e9)


# --- kernels and point-to-point -----------------------------------------------------------------

def test_matmul_time_is_flops_over_achieved_peak():
    # 312e12 FLOPs at 312 TFLOP/s x 0.5 = 2 s
    assert matmul_time(312e12, 312e12, 0.5) == pytest.approx(2.0)


def test_hbm_time_is_bytes_over_achieved_bandwidth():
    # 16 GB at 2000 GB/s x 0.8 = 16e9 / 1.6e12 = 0.01 s
    assert hbm_time(16e9, 2000e9, 0.8) == pytest.approx(0.01)


def test_p2p_time_is_latency_plus_bytes_over_bandwidth():
    # 1 GB over 10 ms and 1 GB/s x 0.8: 0.01 + 1e9 / 0.8e9 = 0.01 + 1.25 = 1.26 s
    assert p2p_time(1e9, 0.01, 1e9, 0.8) == pytest.approx(1.26)
    assert p2p_time(0.0, 0.01, 1e9, 0.8) == 0.0  # nothing to send: no latency either


# --- all-reduce ---------------------------------------------------------------------------------

def test_all_reduce_two_devices_ring():
    g = flat(2, 1e-3, 1e9)
    # ring: 2(n-1) lat + 2(n-1)/n B/bw = 2e-3 + 1 x 1e9/1e9 = 1.002 s
    # tree: 2 log2(2) lat + 2 B/bw = 2e-3 + 2 = 2.002 s -> ring
    assert all_reduce_time(1e9, g, 1.0) == pytest.approx(1.002)
    # efficiency 0.5 halves the bandwidth: 2e-3 + 1e9 / 0.5e9 = 2.002 s
    assert all_reduce_time(1e9, g, 0.5) == pytest.approx(2.002)


def test_all_reduce_four_devices_ring_for_large_tree_for_small_messages():
    g = flat(4, 1e-3, 1e9)
    # 1 GB: ring 6 x 1e-3 + 2 x 3/4 x 1 = 1.506 s; tree 2 x 2 x 1e-3 + 2 x 1 = 2.004 s -> ring
    assert all_reduce_time(1e9, g, 1.0) == pytest.approx(1.506)
    # 1 kB: ring 6e-3 + 1.5e-6 = 0.0060015 s; tree 4e-3 + 2e-6 = 0.004002 s -> tree
    assert all_reduce_time(1e3, g, 1.0) == pytest.approx(0.004002)


def test_all_reduce_trivial_cases_are_free():
    assert all_reduce_time(1e9, flat(1, 0.0, math.inf), 1.0) == 0.0
    assert all_reduce_time(0.0, flat(4, 1e-3, 1e9), 1.0) == 0.0


def test_all_reduce_hierarchical_two_nodes_of_two():
    B = 1e9
    # flat ring: 6 x 1e-3 + 1.5 x B / 1e9 = 1.506; tree: 4e-3 + 2 = 2.004
    # hierarchical: intra reduce-scatter + all-gather on 2 devices over 300 GB/s:
    #   2 x (1 x 1e-6 + 1/2 x 1e9 / 300e9) = 2e-6 + 1/300 = 0.0033353...
    # inter: all-reduce of B/2 between 2 nodes over 1 GB/s (ring, 2 steps):
    #   2 x 1 x 1e-3 + 2 x 1/2 x 0.5e9 / 1e9 = 0.002 + 0.5 = 0.502
    expected = 2e-6 + 1 / 300 + 0.502
    assert all_reduce_time(B, HIER, 1.0) == pytest.approx(expected)
    assert expected < 1.506
    # uneven nodes (per_node 0): no hierarchical option, the flat ring stays
    uneven = GroupLinks(3, 1e-3, 1e9, 2, 0, 1e-6, 300e9, 1e-3, 1e9)
    # ring on 3: 4e-3 + 2 x 2/3 x 1 = 1.33733..; tree: 2 x 2 x 1e-3 + 2 = 2.004
    assert all_reduce_time(B, uneven, 1.0) == pytest.approx(4e-3 + 4 / 3)


def test_all_reduce_vec_agrees_elementwise():
    sizes = np.array([0.0, 1.0, 1e3, 1e5, 1e6, 3.3e7, 1e9, 4e10])
    for g in (flat(2, 1e-3, 1e9), flat(4, 1e-3, 1e9), flat(8, 2e-6, 300e9), HIER,
              GroupLinks(3, 1e-3, 1e9, 2, 0, 1e-6, 300e9, 1e-3, 1e9),
              GroupLinks(6, 5e-3, 5e8, 3, 2, 2e-6, 32e9, 5e-3, 5e8),
              GroupLinks(16, 5.2e-5, 50e9, 2, 8, 2e-6, 300e9, 5.2e-5, 50e9, 6.25e9),
              flat(1, 0.0, math.inf)):
        for eff in (1.0, 0.8):
            vec = all_reduce_time_vec(sizes, g, eff)
            scalar = [all_reduce_time(float(b), g, eff) for b in sizes]
            np.testing.assert_allclose(vec, scalar, rtol=1e-12, atol=0.0)


@settings(max_examples=60)
@given(n=st.integers(1, 64), nodes=st.integers(1, 8), lat=st.floats(0, 0.1),
       bw=st.floats(1e6, 1e12), ilat=st.floats(0, 1e-3), ibw=st.floats(1e9, 1e12),
       nbytes=st.floats(0, 1e11), eff=st.floats(0.05, 1.0), cross=st.floats(1e6, 1e12))
def test_all_reduce_vec_agrees_on_random_links(n, nodes, lat, bw, ilat, ibw, nbytes, eff, cross):
    per_node = n // nodes if n % nodes == 0 else 0
    g = GroupLinks(n, lat, bw, nodes, per_node, ilat, ibw, lat, bw, cross)
    vec = all_reduce_time_vec(np.array([nbytes]), g, eff)
    assert vec[0] == pytest.approx(all_reduce_time(nbytes, g, eff), rel=1e-12, abs=0.0)
    pieces = all_reduce_pieces(g, eff)  # the decode drain's affine form
    if nbytes > 0 and pieces:
        assert min(a + b * nbytes for a, b in pieces) == pytest.approx(vec[0], rel=1e-9)


# --- all-gather, reduce-scatter, broadcast ------------------------------------------------------

def test_all_gather_ring_and_tree():
    g = flat(4, 1e-3, 1e9)
    # 1 GB result: ring 3 x 1e-3 + 3/4 x 1 = 0.753; tree 2 x 1e-3 + 1 = 1.002 -> ring
    assert all_gather_time(1e9, g, 1.0) == pytest.approx(0.753)
    # 1 kB: ring 3e-3 + 7.5e-7; tree 2e-3 + 1e-6 = 0.002001 -> tree
    assert all_gather_time(1e3, g, 1.0) == pytest.approx(0.002001)
    # two devices: ring 1e-3 + 0.5 = 0.501 s
    assert all_gather_time(1e9, flat(2, 1e-3, 1e9), 1.0) == pytest.approx(0.501)
    assert reduce_scatter_time(1e9, g, 1.0) == all_gather_time(1e9, g, 1.0)
    assert all_gather_time(1e9, flat(1, 0.0, math.inf), 1.0) == 0.0


def test_broadcast_chain_and_tree():
    g = flat(4, 1e-3, 1e9)
    # 1 GB: pipelined chain 3 x 1e-3 + 1 = 1.003; binary tree 2 x (1e-3 + 1) = 2.002 -> chain
    assert broadcast_time(1e9, g, 1.0) == pytest.approx(1.003)
    # 1 kB over 10 ms links: chain 3 x 0.01 + 1e-6 = 0.030001; tree 2 x (0.01 + 1e-6) = 0.020002
    assert broadcast_time(1e3, flat(4, 0.01, 1e9), 1.0) == pytest.approx(0.020002)
    assert broadcast_time(1e9, flat(1, 0.0, math.inf), 1.0) == 0.0


# --- group_links on a real cluster --------------------------------------------------------------

def two_region_cluster() -> ClusterSpec:
    """2 nodes x 2 A100 in regions r0 and r1, 10 ms one-way and 8 Gbit/s between them."""
    return ClusterSpec("two-by-two", (NodeSpec("a", "A100-80GB", 2, "r0"),
                                      NodeSpec("b", "A100-80GB", 2, "r1")),
                       region_links=(RegionLink("r0", "r1", 10.0, 8.0),))


def test_group_links_two_nodes_in_two_regions():
    c = two_region_cluster()
    g = group_links(c, (3, 0, 2, 1))
    # Inside a node: two GPU<->host hops of 1 us; NVLink 300 GB/s per direction.
    # Across: 1 us (gpu-host) + 25 us (host-zone, half the 0.05 ms intra-zone delay) + 10 ms
    # (region link) + 25 us + 1 us = 10.052 ms; bandwidth min(300 GB/s, NIC 400 Gbit/s = 50 GB/s,
    # 8 Gbit/s = 1 GB/s) = 1e9 B/s.
    assert g.n == 4 and g.nodes == 2 and g.per_node == 2
    assert g.ring_latency_s == pytest.approx(0.010052)
    assert g.ring_Bps == pytest.approx(1e9)
    assert g.intra_latency_s == pytest.approx(2e-6)
    assert g.intra_Bps == pytest.approx(300e9)
    assert g.inter_latency_s == pytest.approx(0.010052)
    assert g.inter_Bps == pytest.approx(1e9)
    # Order-independent (the ring goes node by node), and memoised per cluster.
    assert group_links(c, (0, 1, 2, 3)) == g
    assert group_links(c, (3, 0, 2, 1)) is g
    # One node only: a two-device ring over NVLink.
    one = group_links(c, (0, 1))
    assert (one.ring_latency_s, one.ring_Bps, one.nodes) == (pytest.approx(2e-6), 300e9, 1)
    # A single device has no ring.
    assert group_links(c, (2,)).ring_Bps == math.inf


def test_all_reduce_on_the_two_region_cluster_goes_hierarchical():
    g = group_links(two_region_cluster(), (0, 1, 2, 3))
    B, eff = 1e9, 0.8
    # flat ring: 6 x 0.010052 + 1.5 x 1e9 / 0.8e9 = 0.060312 + 1.875 = 1.935312
    # hierarchical: 2 x (2e-6 + 0.5 x 1e9 / 240e9) + 2 x 0.010052 + 2 x 0.5 x 0.5e9 / 0.8e9
    #             = 4e-6 + 1/240 + 0.020104 + 0.625
    expected = 4e-6 + 1 / 240 + 0.020104 + 0.625
    assert all_reduce_time(B, g, eff) == pytest.approx(expected)


def test_flows_leaving_a_node_at_once_share_its_nic():
    """Two nodes of 8 A100s in one zone (NIC 400 Gbit/s = 50e9 B/s, NVLink 300e9 B/s, 2 us inside
    a node, 52 us between nodes), all 16 in one group, 1 GB per device, efficiency 0.8."""
    c = homogeneous("A100-80GB", nodes=2, gpus_per_node=8)
    g = group_links(c, tuple(range(16)))
    # The ring crosses each node boundary with one flow (50e9); the tree's and the hierarchical
    # scheme's inter-node steps send from all 8 devices of a node at once: 50e9 / 8 each.
    assert (g.ring_Bps, g.inter_Bps) == (50e9, 50e9)
    assert g.cross_Bps == pytest.approx(6.25e9)
    # hierarchical: inside, 2 x (7 x 2e-6 + 7/8 x 1e9 / 240e9); between the 2 nodes, 1/8 of the
    # bytes per flow at 6.25e9 x 0.8 = 5e9: min(ring, tree) on k = 2 = 2 x 52e-6 + 0.125e9 / 5e9
    intra = 2 * (7 * 2e-6 + 7 / 8 * 1e9 / 240e9)
    inter = 2 * 52e-6 + 0.125e9 / 5e9
    # the flat ring: 30 x 52e-6 + 2 x 15/16 x 1e9 / 40e9 = 0.04844; the tree: 8 x 52e-6 + 0.4
    assert all_reduce_time(1e9, g, 0.8) == pytest.approx(intra + inter)  # 32.4 ms, not 10.5 ms
    # all-gather: ring 15 x 52e-6 + 15/16 x 1e9 / 40e9 beats the tree (4 x 52e-6 + 1e9 / 5e9)
    assert all_gather_time(1e9, g, 0.8) == pytest.approx(15 * 52e-6 + 15 / 16 * 1e9 / 40e9)
    # one device per node: the NIC is the link itself, nothing shared
    pair = group_links(c, (0, 8))
    assert pair.cross_Bps == 50e9 and pair.ring_Bps == 50e9
    # within one node: no flow leaves it
    assert group_links(c, tuple(range(8))).cross_Bps == math.inf
