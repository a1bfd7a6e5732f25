"""The neighbourhood pricer (hetrl.cost.neighbourhood) against the scalar CostModel.estimate:
every plan a search prices in batches, re-priced one by one on a fresh cost model, must give
the same seconds and feasibility to the last bit (issue 59's honesty property)."""

from __future__ import annotations

import numpy as np
import pytest

import hetrl.search.base as search_base
from hetrl.cost.model import CostModel
from hetrl.cost.neighbourhood import price_plans
from hetrl.plan import colocated_plan
from hetrl.search import Budget, get_scheduler
from hetrl.search.base import time_fitness
from hetrl.spec.presets import cluster_preset, workload_preset
from hetrl.spec.random_cluster import random_cluster


def _searched(monkeypatch, workload, cluster, evaluations: int) -> tuple[list, list]:
    """The plans the hetrl search priced through the neighbourhood pricer, and its briefs."""
    plans, briefs = [], []

    def recording(model, batch):
        out = price_plans(model, batch)
        plans.extend(batch)
        briefs.extend(out)
        return out

    monkeypatch.setattr(search_base, "price_plans", recording)
    get_scheduler("hetrl").search(workload, cluster, Budget(evaluations=evaluations, seed=0))
    return plans, briefs


#: case: (workload, cluster, workload changes, evaluations); budgets large enough for the
#: polish to reach plans of two task groups (its splits and sweeps) where marked below
CASES = {
    "ppo-sync-multi-country": ("qwen3-8b-ppo-sync", "paper64-multi-country", {}, 12000),
    "grpo-async-multi-continent": ("qwen3-8b-grpo-async", "paper64-multi-continent", {}, 2500),
    "ppo-async": ("qwen3-4b-ppo-async", "paper64-multi-region-hybrid", {}, 1500),
    "fsdp-and-offload": ("qwen3-8b-ppo-sync", "hetero24-two-region",
                         {"backends": ("megatron", "fsdp")}, 6000),
    "rollout-awake-capped": ("qwen3-8b-grpo-sync", "paper64-single-region",
                             {"gen_sleep_level": 0, "gen_gpu_memory_utilization": 0.6}, 1500),
    "moe": ("qwen3-30b-a3b-grpo-sync", "paper64-single-region", {}, 1500),
}
SEVERAL_GROUPS = ("ppo-sync-multi-country", "fsdp-and-offload")


@pytest.mark.parametrize("case", sorted(CASES))
def test_batched_fitness_equals_scalar(monkeypatch, case):
    name, cluster_name, changes, evaluations = CASES[case]
    workload = workload_preset(name)
    if changes:
        workload = workload.with_(**changes)
    cluster = cluster_preset(cluster_name)
    plans, briefs = _searched(monkeypatch, workload, cluster, evaluations)
    assert len(plans) >= 200, "the search priced too few plans in batches to test"
    scalar = CostModel(workload, cluster)  # its own tables: nothing shared with the search's
    ests = [scalar.estimate(p, check=False) for p in plans]
    batched = np.array([time_fitness(b.iteration_s, b.feasible) for b in briefs])
    expected = np.array([time_fitness(e.iteration_s, e.feasible) for e in ests])
    assert np.array_equal(batched, expected)
    assert [b.feasible for b in briefs] == [e.feasible for e in ests]
    assert any(not b.feasible for b in briefs) and any(b.feasible for b in briefs)
    if case in SEVERAL_GROUPS:
        assert any(len(p.groups) > 1 for p in plans)
    if "fsdp" in changes.get("backends", ()):
        assert any(q.backend == "fsdp" and q.offload for p in plans for q in p.placements)
    if workload.model("actor").moe is not None:
        assert any(q.ep > 1 for p in plans for q in p.placements)


def test_batched_fitness_equals_scalar_on_1024_gpus(monkeypatch):
    cluster = random_cluster(0, num_nodes=128, num_regions=16, gpus_per_node=(8,))
    workload = workload_preset("qwen3-8b-grpo-async")
    plans, briefs = _searched(monkeypatch, workload, cluster, 1500)
    assert len(plans) >= 100
    scalar = CostModel(workload, cluster)
    expected = [(e.iteration_s, e.feasible) for e in
                (scalar.estimate(p, check=False) for p in plans)]
    assert [(b.iteration_s, b.feasible) for b in briefs] == expected


def test_plans_more_than_one_move_apart_are_priced_alone(ppo8b, paper_clusters):
    """A batch of unrelated plans (different groups, relays, several tasks moved) still
    answers as the scalar path does."""
    cluster = paper_clusters["multi-country"]
    model = CostModel(ppo8b, cluster)
    a = colocated_plan(ppo8b, cluster, tp=4)
    b = a.__class__(a.groups, a.placements, sync_relay=not a.sync_relay)
    c = colocated_plan(ppo8b, cluster, tp=2)  # every task moved
    plans = [a, b, c, a]
    out = price_plans(model, plans)
    scalar = CostModel(ppo8b, cluster)
    for plan, brief in zip(plans, out, strict=True):
        est = scalar.estimate(plan, check=False)
        assert (brief.iteration_s, brief.feasible) == (est.iteration_s, est.feasible)
    assert out[0] is out[3]  # one plan twice: priced once
    assert model.evaluations == len(plans)
