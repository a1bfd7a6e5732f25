"""Weight-sync sources of the real backend: the ones the cost model's weight sync picks."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetrl.cost.model import cost_model
from hetrl.cost.sync import weight_sync_pulls
from hetrl.io import load_plan
from hetrl.plan import Plan, TaskGroup, make_placement, validate
from hetrl.spec.presets import cluster_preset, workload_preset
from real.placement import sync_sources

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_each_stage_comes_from_the_device_that_trains_it_as_the_cost_model_pulls():
    wl, cl = workload_preset("tiny-grpo-sync"), cluster_preset("tiny4-two-region")
    plan = load_plan(EXAMPLES / "plan-tiny-grpo-cross-region.yaml")
    sources = sync_sources(plan, "actor_training", "actor_generation", wl, cl)
    # generation on 0 and 3; training stage 0 on device 1, stage 1 on device 2
    assert sources == {0: [1, 2], 3: [1, 2]}
    gen, train = plan.placement("actor_generation"), plan.placement("actor_training")
    pulls, local = weight_sync_pulls(gen, cost_model(wl, cl).shapes(gen.task, gen), train, cl,
                                     cost_model(wl, cl).params, shared_in_place=False)
    assert sorted((s, d) for s, d, _ in pulls) == sorted(
        (s, d) for d, chosen in sources.items() for s in chosen)
    assert local == []


def test_a_generation_device_that_trains_a_stage_copies_it_locally():
    wl, cl = workload_preset("tiny-grpo-sync"), cluster_preset("tiny4-single-region")
    layers = wl.model("actor").layers
    gen = make_placement("actor_generation", (0, 1), 2, 1, 1, layers)
    train = make_placement("actor_training", (1, 2), 1, 2, 1, layers)
    others = [make_placement(t, (0, 1), 2, 1, 1, layers)
              for t in ("reward_inference", "reference_inference")]
    plan = Plan((TaskGroup(tuple(wl.task_names), (0, 1, 2)),), (gen, *others, train))
    validate(plan, wl, cl)  # one task group; training on part of it
    sources = sync_sources(plan, "actor_training", "actor_generation", wl, cl)
    assert sources == {0: [1, 2], 1: [1, 2]}  # device 1 keeps stage 0 from its own trainer


def test_megatron_layouts_are_checked_before_any_worker_starts():
    from dataclasses import replace

    from hetrl.errors import SpecError
    from hetrl.plan import colocated_plan
    from real.placement import check_supported, megatron_grids, tasklets

    wl, cl = workload_preset("tiny-ppo-sync"), cluster_preset("tiny4-single-region")
    megatron = {"training": "megatron"}
    plan = load_plan(EXAMPLES / "plan-tiny-ppo-megatron-tiny4.yaml")
    check_supported(plan, wl, megatron)
    with pytest.raises(SpecError, match=r"placements\[actor_training\]\.tp.*megatron"):
        check_supported(plan, wl)  # the torch engines run tp = 1 only
    grid = megatron_grids(plan, wl, megatron)["actor_training"]
    assert (grid.dp, grid.pp, grid.tp) == (1, 2, 2) and grid.boundaries == (0, 2, 4)
    mine = [t for t in tasklets(plan, wl) if t.task == "actor_training"]
    assert [(t.device, t.stage, t.tp_rank, t.tp) for t in mine] == [
        (0, 0, 0, 2), (1, 0, 1, 2), (2, 1, 0, 2), (3, 1, 1, 2)]
    # tp must divide the heads (4) and query groups (2); generation stays tp = 1
    bad = colocated_plan(wl, cl, tp=4)
    with pytest.raises(SpecError, match=r"placements\[actor_generation\]\.tp"):
        check_supported(bad, wl, megatron)
    train = replace(plan.placement("actor_training"), tp=4, pp=1,
                    devices=(((0, 1, 2, 3),),), layers_per_stage=(4,))
    with pytest.raises(SpecError, match=r"must divide the model's kv_heads \(2\)"):
        check_supported(plan.with_placement(train), wl, megatron)
