"""The slowest data-parallel replica's load (hetrl.cost.stragglers) against its definition."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hetrl.cost.lengths import length_stats
from hetrl.cost.stragglers import expected_max_normal, straggler_load
from hetrl.spec.presets import workload_preset


def test_expected_max_of_normals_known_values():
    assert expected_max_normal(1) == 0.0
    assert expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-6)
    # E[max of 3] = 3 / (2 sqrt(pi))
    assert expected_max_normal(3) == pytest.approx(3 / (2 * math.sqrt(math.pi)), rel=1e-6)
    zs = [expected_max_normal(k) for k in (2, 4, 8, 16, 64, 1024)]
    assert zs == sorted(zs) and zs[-1] < math.sqrt(2 * math.log(1024))


def test_one_replica_or_no_sequences_carry_the_mean():
    L = length_stats(workload_preset("qwen3-8b-grpo-sync"))
    assert straggler_load(100.0, 1, L, 8) == 1.0
    assert straggler_load(0.0, 8, L, 8) == 1.0


@pytest.mark.parametrize("dp,per_replica", [(4, 64), (12, 64), (24, 32), (48, 16)])
def test_load_matches_sampled_maximum(dp, per_replica):
    """Monte Carlo: draw prompts and their grouped responses as the simulator does, split by
    count into dp contiguous chunks, take the largest chunk's tokens over the mean chunk's."""
    wl = workload_preset("qwen3-8b-grpo-sync")
    g = wl.responses_per_prompt
    L = length_stats(wl)
    rng = np.random.default_rng(7)
    n = dp * per_replica
    ratios = []
    for _ in range(2000):
        prompts = np.repeat(wl.prompt_length.sample(rng, n // g), g)
        tokens = (prompts + wl.response_length.sample(rng, n)).reshape(dp, per_replica).sum(1)
        ratios.append(tokens.max() / (per_replica * L.seq_mean))
    sampled = float(np.mean(ratios)) - 1.0
    model = straggler_load(float(per_replica), dp, L, g) - 1.0
    assert model == pytest.approx(sampled, rel=0.05)
    # groups matter: the same split with ungrouped prompts carries less
    assert straggler_load(float(per_replica), dp, L, 1) < straggler_load(float(per_replica), dp, L, g)


def test_more_replicas_or_fewer_sequences_mean_a_heavier_straggler():
    L = length_stats(workload_preset("qwen3-8b-ppo-sync"))
    assert straggler_load(64.0, 24, L, 1) > straggler_load(64.0, 12, L, 1)
    assert straggler_load(16.0, 12, L, 1) > straggler_load(64.0, 12, L, 1)


def test_a_wider_data_parallel_inference_costs_more_per_replica():
    """The cost model charges a dp = 24 task more than the same replicas at their mean load."""
    from hetrl.cost.model import CostModel
    from hetrl.plan import Plan, TaskGroup, make_placement
    from hetrl.spec.presets import cluster_preset

    wl = workload_preset("qwen3-8b-grpo-sync").with_(batch_prompts=96)
    cl = cluster_preset("paper24-a100-single-region")
    devices = tuple(range(24))
    plan = Plan((TaskGroup(wl.task_names, devices),),
                tuple(make_placement(t, devices, 24 if t != "actor_generation" else 3,
                                     1, 1 if t != "actor_generation" else 8,
                                     wl.model(wl.task(t).role).layers)
                      for t in wl.task_names))
    model = CostModel(wl, cl)
    est = model.estimate(plan, check=False)
    mean_load = model.replica_seconds(plan.placement("reference_inference"))[0]
    assert est.tasks["reference_inference"] > mean_load * 1.05
