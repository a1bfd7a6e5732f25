"""The search's compiled kernel (hetrl.search.kernels.locality_swaps), compiled and run as Python
(``py_func``), makes the swaps a plain definition makes: repeatedly, of the swaps of two GPUs of
one type in different groups and nodes, the one that raises the locality score most (the score
recomputed from scratch), ties to the earliest pair of (group, node, type) classes."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from hetrl.cost.model import CostModel
from hetrl.search.ea import AFF_NODE, AFF_REGION, AFF_ZONE, DeviceFacts
from hetrl.search.kernels import locality_swaps
from hetrl.spec.presets import cluster_preset, workload_preset
from hetrl.spec.random_cluster import random_cluster


def _score(order, group_of, facts) -> int:
    total = 0
    for g in set(group_of):
        devs = [d for d, h in zip(order, group_of, strict=True) if h == g]
        total += sum(facts.affinity(a, b) for a, b in itertools.combinations(devs, 2))
    return total


def _plain(order, group_of, facts, max_swaps) -> list[int]:
    order = list(order)
    for _ in range(max_swaps):
        first: dict[tuple[int, int, int], int] = {}
        for p, d in enumerate(order):
            first.setdefault((group_of[p], facts.node[d], facts.gpu[d]), p)
        classes = sorted(first)  # (group, node, type) order
        now = _score(order, group_of, facts)
        best = (0, None)
        for ci, cj in itertools.product(classes, repeat=2):
            if not (ci[0] < cj[0] and ci[2] == cj[2] and ci[1] != cj[1]):
                continue
            p, q = first[ci], first[cj]
            trial = list(order)
            trial[p], trial[q] = trial[q], trial[p]
            gain = _score(trial, group_of, facts) - now
            if gain > best[0]:
                best = (gain, (p, q))
        if best[1] is None:
            break
        p, q = best[1]
        order[p], order[q] = order[q], order[p]
    return order


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
@pytest.mark.parametrize("seed", range(6))
def test_locality_swaps_make_the_plain_definitions_swaps(seed, compiled):
    cl = (cluster_preset("hetero24-two-region") if seed % 3 == 0 else
          random_cluster(seed, num_nodes=6, num_regions=3, gpus=("A100-80GB", "L40S", "L4")))
    facts = DeviceFacts.of(CostModel(workload_preset("qwen3-4b-grpo-sync"), cl))
    node, zone, region, gpu, n_node, n_zone, n_region, n_gpu = facts.arrays
    rng = np.random.default_rng(seed)
    n = cl.num_devices
    for max_swaps in (1, 3, 10_000):
        groups = int(rng.integers(2, 5))
        group_of = np.sort(rng.integers(0, groups, n)).astype(np.int64)
        order = rng.permutation(n).astype(np.int64)
        expected = _plain(order.tolist(), group_of.tolist(), facts, max_swaps)
        fn = locality_swaps if compiled else locality_swaps.py_func
        fn(order, group_of, groups, node, zone, region, gpu, n_node, n_zone, n_region, n_gpu,
           AFF_NODE, AFF_ZONE, AFF_REGION, max_swaps)
        assert order.tolist() == expected
