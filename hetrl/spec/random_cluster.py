"""Random clusters (for tests and scaling studies); every choice flows from ``seed``."""

from __future__ import annotations

import numpy as np

from hetrl.errors import require
from hetrl.spec.cluster import ClusterSpec, NodeSpec, RegionLink
from hetrl.spec.hardware import PAPER_GPU_TYPES


def random_cluster(seed: int, num_nodes: int = 4, num_regions: int = 2,
                   gpus: tuple[str, ...] | None = None, gpus_per_node: tuple[int, ...] = (1, 2, 4, 8),
                   edge_probability: float = 0.0, name: str | None = None) -> ClusterSpec:
    """``num_nodes`` nodes of random GPU types (``gpus``; default the paper's seven,
    :data:`~hetrl.spec.hardware.PAPER_GPU_TYPES`, so that a seed keeps its cluster as the
    catalog grows) and sizes spread over ``num_regions`` regions.

    Regions are fully connected with one-way delays drawn in [1, 60] ms and per-flow bandwidth in
    [0.5, 10] Gbit/s; a node is an edge node with ``edge_probability`` (never the first node of a
    region, so every region keeps a non-edge node).
    """
    rng = np.random.default_rng(seed)
    types = gpus or PAPER_GPU_TYPES
    regions = [f"r{i}" for i in range(num_regions)]
    nodes = []
    for i in range(num_nodes):
        region = regions[i % num_regions]
        first_in_region = i < num_regions
        nodes.append(NodeSpec(
            name=f"n{i}",
            gpu=str(types[int(rng.integers(len(types)))]),
            count=int(gpus_per_node[int(rng.integers(len(gpus_per_node)))]),
            region=region,
            zone=str("ab"[int(rng.integers(2))]),
            edge=bool(not first_in_region and rng.random() < edge_probability),
        ))
    used = sorted({n.region for n in nodes})
    links = tuple(
        RegionLink(a, b, round(float(rng.uniform(1, 60)), 3), round(float(rng.uniform(0.5, 10)), 3))
        for i, a in enumerate(used) for b in used[i + 1:]
    )
    return ClusterSpec(name or f"random-{seed}", tuple(nodes), links)


def nested_random_cluster(seed: int, num_nodes: int, num_regions: int = 16,
                          nodes_per_region: int = 1, gpus: tuple[str, ...] | None = None,
                          gpus_per_node: tuple[int, ...] = (1, 2, 4, 8),
                          edge_probability: float = 0.0, name: str | None = None) -> ClusterSpec:
    """The first ``num_nodes`` nodes of one endless random cluster per ``seed``: the cluster of
    n nodes is the cluster of m < n nodes plus n - m new nodes, with the same region links, so
    every plan of the smaller cluster is a plan of the larger one with the same estimate.

    Nodes come in blocks of ``nodes_per_region``, dealt round robin over ``num_regions``
    regions: node i lies in region ``r{(i // nodes_per_region) % num_regions}`` (with the
    default 1, plain round robin). The first blocks open the regions; later ones add nodes to
    regions already open. A node's GPU type, GPU count and edge flag (never the first node of a
    region) come from a random stream of its own, and the link between regions a and b
    (one-way delay in [1, 60] ms, per-flow bandwidth in [0.5, 10] Gbit/s) from the pair's own,
    so neither depends on the size. Every node is in zone "a": a second zone in a region would
    add an inter-zone hop to the routes of its old nodes.
    """
    require(num_nodes >= 1, "num_nodes", num_nodes, "need at least one node")
    require(num_regions >= 1, "num_regions", num_regions, "need at least one region")
    require(nodes_per_region >= 1, "nodes_per_region", nodes_per_region, "must be >= 1")
    types = gpus or PAPER_GPU_TYPES
    nodes = []
    for i in range(num_nodes):
        rng = np.random.default_rng((seed, 0, i))
        gpu = str(types[int(rng.integers(len(types)))])
        count = int(gpus_per_node[int(rng.integers(len(gpus_per_node)))])
        block = i // nodes_per_region
        first_in_region = block < num_regions and i % nodes_per_region == 0
        edge = bool(rng.random() < edge_probability) and not first_in_region
        nodes.append(NodeSpec(name=f"n{i}", gpu=gpu, count=count,
                              region=f"r{block % num_regions}", edge=edge))
    used = min(-(-num_nodes // nodes_per_region), num_regions)
    links = []
    for a in range(used):
        for b in range(a + 1, used):
            rng = np.random.default_rng((seed, 1, a, b))
            links.append(RegionLink(f"r{a}", f"r{b}", round(float(rng.uniform(1, 60)), 3),
                                    round(float(rng.uniform(0.5, 10)), 3)))
    return ClusterSpec(name or f"nested-{seed}-{num_nodes}", tuple(nodes), tuple(links))
