"""The simulator replays mixture-of-experts plans: all-to-alls as flows (training and inference
micro-batches) or priced per decode step (generation), expert gradients over their own groups,
and the iteration within 15% of the cost model's."""

from __future__ import annotations

import pytest

from hetrl.cost import CostModel
from hetrl.plan import colocated_plan
from hetrl.search import Budget, get_scheduler
from hetrl.spec.cluster import ClusterSpec, NodeSpec
from hetrl.spec.presets import cluster_preset, workload_preset
from sim.driver import simulate

H100X16 = ClusterSpec("h100x16", (NodeSpec("n0", "H100", 8, "us-east-1"),
                                  NodeSpec("n1", "H100", 8, "us-east-1")))


@pytest.mark.parametrize("ep", [4, 8])  # each EP group inside a node, or across both
def test_expert_parallel_plans_simulate_near_their_estimate(ep):
    wl = workload_preset("qwen3-30b-a3b-grpo-sync")
    plan = colocated_plan(wl, H100X16, tp=2, ep=ep)
    est = CostModel(wl, H100X16).estimate(plan)
    result = simulate(plan, wl, H100X16, iterations=2)
    assert result.iteration_s == pytest.approx(est.iteration_s, rel=0.15)
    spans = [s for s in result.trace.spans if s.name == "all-to-all"]
    assert spans and all(s.bytes > 0 for s in spans)
    # across the two nodes the all-to-all pays the NICs: a longer iteration
    if ep == 8:
        inside = simulate(colocated_plan(wl, H100X16, tp=2, ep=4), wl, H100X16, iterations=2)
        assert inside.iteration_s < result.iteration_s


def test_the_searched_moe_plan_simulates_within_15_percent():
    wl, cl = workload_preset("qwen3-30b-a3b-grpo-sync"), cluster_preset("paper64-multi-country")
    found = get_scheduler("hetrl").search(wl, cl, Budget(evaluations=3000, seed=0))
    assert found.estimate.feasible
    result = simulate(found.plan, wl, cl, iterations=2)
    assert result.iteration_s == pytest.approx(found.estimate.iteration_s, rel=0.15)
