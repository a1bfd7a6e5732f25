"""SHA-EA's warm start, screening, idle GPUs and typed options (issue 26): the starts are valid
genotypes of the plans the cheap heuristics find, the search never loses to the baselines whose
structures it starts from, and options are checked by name, type and range."""

from __future__ import annotations

import numpy as np
import pytest

from hetrl.cost.model import CostModel
from hetrl.errors import SpecError
from hetrl.plan import validate
from hetrl.search import Budget, get_scheduler
from hetrl.search.base import Evaluator
from hetrl.search.ea import Arm, DeviceFacts
from hetrl.search.genome import decode
from hetrl.search.options import PolishOptions, SHAOptions, WarmStartOptions
from hetrl.search.pools import streamrl_pools
from hetrl.search.space import task_groupings
from hetrl.search.warm import from_pools, region_sets, starts
from hetrl.spec.cluster import ClusterSpec, NodeSpec, RegionLink
from hetrl.spec.presets import cluster_preset, workload_preset


def three_region_cluster() -> ClusterSpec:
    """8 A100 + 8 L40S + 8 L4 over three regions, the L4s far away (24 GPUs)."""
    return ClusterSpec(
        "three-region",
        (NodeSpec("va", "A100-80GB", 8, "us-east-1"), NodeSpec("oh", "L40S", 8, "us-east-2"),
         NodeSpec("fr", "L4", 8, "eu-west-3")),
        region_links=(RegionLink("us-east-1", "us-east-2", 10.0, 5.0),
                      RegionLink("us-east-1", "eu-west-3", 40.0, 1.0),
                      RegionLink("us-east-2", "eu-west-3", 45.0, 1.0)),
    )


# --- the starts ------------------------------------------------------------------------------

@pytest.mark.parametrize("workload", ["qwen3-8b-ppo-async", "qwen3-8b-grpo-sync"])
@pytest.mark.parametrize("cluster", ["paper64-single-region", "paper64-multi-region-hybrid",
                                     "paper64-multi-continent"])
def test_starts_are_genotypes_of_the_space(workload, cluster):
    wl, cl = workload_preset(workload), cluster_preset(cluster)
    groupings = set(task_groupings(wl))
    out = starts(wl, cl)
    assert out[0].name == "colocated" and out[0].sizes == (cl.num_devices,)
    keys = set()
    for s in out:
        assert s.groups in groupings  # canonical: a level-1 arm of the search
        assert sorted(s.order) == list(range(cl.num_devices))  # a permutation of all GPUs
        assert 1 <= min(s.sizes) and sum(s.sizes) <= cl.num_devices
        assert s.key not in keys  # no duplicates
        keys.add(s.key)
    names = {s.name for s in out}
    assert {"types A100-80GB", "streamrl", "verl-async"} <= names
    if len(cl.regions) > 1:
        assert any(n.startswith("region ") for n in names)
    # every StreamRL pool structure is a start (or the same structure as one)
    for pools in streamrl_pools(wl, cl):
        assert from_pools("x", wl, cl, list(pools)).key in keys


def test_from_pools_puts_groups_in_canonical_order_and_idle_gpus_last():
    wl, cl = workload_preset("qwen3-8b-ppo-async"), cluster_preset("paper64-single-region")
    rest = tuple(t for t in wl.task_names if t != "actor_generation")
    # given in the "wrong" order: the rest first, generation second
    s = from_pools("x", wl, cl, [(rest[::-1], tuple(range(24))),
                                 (("actor_generation",), tuple(range(24, 48)))])
    assert s.groups == (("actor_generation",), rest)
    assert s.sizes == (24, 24)
    assert s.order[:24] == tuple(range(24, 48)) and s.order[24:48] == tuple(range(24))
    assert s.order[48:] == tuple(range(48, 64))  # the L4s idle


def test_region_sets_grow_by_the_best_link():
    cl = three_region_cluster()
    sets = dict(region_sets(cl))
    # the most peak FLOP/s first (the L40S region), then its best link (10 ms to Virginia)
    assert list(sets)[0] == "region us-east-2"
    assert sets["regions us-east-2+1"] == ("us-east-2", "us-east-1")
    assert all(len(r) < 3 for r in sets.values())  # never all the regions (that is colocated)
    assert region_sets(cluster_preset("paper64-single-region")) == []


# --- rule-of-thumb layouts that fit together ---------------------------------------------------

def test_structured_individual_fits_its_group_together():
    """The seed's layouts fit the smallest GPU by the tasks' own bytes per GPU; those are an
    average stage's, so the heaviest stage (the LM head's) may still overflow a 24 GB L4 by a
    little (0.1 GB here since the memory model counts the driver's memory and frees a sleeping
    rollout's weights: other layouts fit the room), which the tuning step repairs."""
    wl, cl = workload_preset("qwen3-8b-ppo-sync"), cluster_preset("paper64-single-region")
    model = CostModel(wl, cl)
    arm = Arm((tuple(wl.task_names),), (64,), model, DeviceFacts.of(model),
              np.random.default_rng(0))
    g = arm.seeded_genotype()
    room = min(arm.facts.memory) * arm._room
    assert sum(arm._need(t, lay) for t, lay in g.layouts) <= room
    ev = Evaluator(wl, cl, Budget(evaluations=10**6), model=model)
    f = arm.fitness(ev, g)
    arm.population = [(f, g)]
    tuned, h, _ = arm.tune(ev, (f, g), cap=200)
    assert tuned <= f
    assert model.estimate(decode(arm.improve(h), model)).feasible


def test_an_arm_with_idle_gpus_leaves_the_slowest_type_idle():
    wl, cl = workload_preset("qwen3-8b-grpo-sync"), cluster_preset("paper64-single-region")
    model = CostModel(wl, cl)
    arm = Arm((tuple(wl.task_names),), (48,), model, DeviceFacts.of(model),
              np.random.default_rng(0))
    g = arm.seeded_genotype()
    idle = {cl.devices[d].gpu.name for d in g.order[48:]}
    assert idle == {"L4"}  # the slowest type (peak bf16 FLOP/s)
    plan = decode(g, model)
    validate(plan, wl, cl)
    assert len(plan.device_ids) <= 48


# --- tune: coordinate descent over full-group layouts ------------------------------------------

def test_tune_only_improves_and_joins_the_population(small_workload, small_cluster):
    model = CostModel(small_workload, small_cluster)
    arm = Arm((tuple(small_workload.task_names),), (small_cluster.num_devices,), model,
              DeviceFacts.of(model), np.random.default_rng(0))
    ev = Evaluator(small_workload, small_cluster, Budget(evaluations=10**6), model=model)
    arm.step(ev)
    before = arm.best
    f, g, _ = arm.tune(ev, arm.population[0], 200, sweeps=3)
    assert f == arm.best <= before
    assert min(f for f, _ in arm.population) == arm.best
    assert any(h == g for _, h in arm.population)
    assert arm.evaluations <= 1 + 200


# --- the floor: never worse than a baseline whose structure it starts from ---------------------

@pytest.mark.parametrize("workload", ["qwen3-4b-grpo-async", "qwen3-4b-ppo-sync"])
def test_hetrl_is_never_above_the_pool_baselines_at_the_same_budget(workload):
    """At 1,000 evaluations (issue 26's floor target; at 400 the warm start affords to tune
    only two starts here and StreamRL's structure, priced third, is not among them)."""
    wl = workload_preset(workload).with_(batch_prompts=64)
    cl = three_region_cluster()
    budget = Budget(evaluations=1000, seed=0)
    ours = get_scheduler("hetrl").search(wl, cl, budget).estimate.iteration_s
    baselines = ("streamrl", "verl-async") if workload.endswith("async") else ("verl",)
    for name in baselines:
        theirs = get_scheduler(name).search(wl, cl, budget).estimate.iteration_s
        assert ours <= theirs + 1e-9, name


def test_the_fastest_infeasible_starts_take_generations_tuning_step():
    """On hetero24, verl's pool starts overflowed memory with their rule-of-thumb generation
    layout until the memory model freed a sleeping rollout's weights (issue 58); now they fit
    and reach the warm start the repair used to reach, 242.72 s, with or without it
    (docs/search-history.md, "Infeasible starts repaired", and its 2026-12-07 note). The
    repair still runs within the same budget and ends no worse here."""
    wl, cl = workload_preset("qwen3-8b-ppo-sync"), cluster_preset("hetero24-two-region")
    budget = Budget(evaluations=1000, seed=0)
    on = get_scheduler("hetrl").search(wl, cl, budget)
    off = get_scheduler("hetrl", warm_repaired=0).search(wl, cl, budget)
    assert on.extra["warm_best"] == pytest.approx(242.72, abs=0.01)
    assert on.extra["warm_best"] <= off.extra["warm_best"]
    assert on.estimate.iteration_s <= off.estimate.iteration_s
    assert on.evaluations == off.evaluations == 1000


def test_warm_start_and_screening_are_reported_and_can_be_turned_off(small_workload,
                                                                     small_cluster):
    budget = Budget(evaluations=300, seed=0)
    r = get_scheduler("hetrl").search(small_workload, small_cluster, budget)
    assert r.extra["warm_starts"] >= 1 and r.extra["screened"] >= 1
    off = get_scheduler("hetrl", warm_start=False, screening=False).search(
        small_workload, small_cluster, budget)
    assert "warm_starts" not in off.extra and "screened" not in off.extra
    assert off.evaluations == 300


# --- options -----------------------------------------------------------------------------------

def test_a_misspelled_option_is_an_error_naming_it_and_the_known_ones():
    with pytest.raises(SpecError, match="warm_strat.*unknown; known: .*warm_start"):
        get_scheduler("hetrl", warm_strat=False)
    with pytest.raises(SpecError, match="verl option.*load_balance.*known: k_best"):
        get_scheduler("verl", load_balance=False)


@pytest.mark.parametrize("options, match", [
    ({"population": True}, "population.*must be int"),  # booleans are not integers
    ({"population": 1}, "population.*must be >= 2"),
    ({"warm_start": 1}, "warm_start.*must be bool"),
    ({"p_sub": 1.5}, r"p_sub.*must be in \[0, 1"),
    ({"exploit_fraction": float("nan")}, "exploit_fraction.*must be float"),
    ({"gpu_groupings": 0}, "gpu_groupings.*must be >= 1"),
    ({"polish": False, "kick_moves": 2}, "kick_moves = 2: does nothing with polish=False"),
    ({"warm_start": False, "warm_tuned": 2}, "warm_tuned = 2: does nothing with warm_start"),
    ({"screening": False, "screening_fraction": 0.1}, "does nothing with screening=False"),
    ({"sub_layouts": False, "p_sub": 0.1}, "does nothing with sub_layouts=False"),
    ({"split_screen": 0, "window_screen": 3}, "window_screen = 3: does nothing with split_scr"),
    ({"window_screen": -1}, "window_screen.*must be >= 0"),
    ({"warm_repaired": -1}, "warm_repaired.*must be >= 0"),
    ({"polish": 1}, "polish.*must be bool"),
])
def test_options_are_checked_for_type_and_range(options, match):
    with pytest.raises(SpecError, match=match):
        get_scheduler("hetrl", **options)


def test_options_are_a_frozen_dataclass_with_documented_defaults():
    s = get_scheduler("hetrl", p_sub=0.0, gpu_groupings=None)
    assert isinstance(s.options, SHAOptions) and s.options.p_sub == 0.0
    assert s.options.warm_start == WarmStartOptions() and s.options.polish == PolishOptions()
    with pytest.raises(AttributeError):
        s.options.p_sub = 0.5  # type: ignore[misc]
    # nested: the flat keywords land in their group; off switches make the group None
    n = get_scheduler("hetrl", stall_steps=5, warm_start=False).options
    assert n.polish == PolishOptions(stall_steps=5) and n.warm_start is None
    assert get_scheduler("hetrl", polish=False).options.polish is None
    off = get_scheduler("hetrl", split_screen=0, window_screen=0).options.polish
    assert (off.split_screen, off.window_screen) == (0, 0)
    assert get_scheduler("deap", population=4, cxpb=1).options.cxpb == 1


def test_verl_keeps_the_fastest_of_its_k_best_believed_configurations(small_workload,
                                                                      small_cluster):
    budget = Budget(evaluations=400, seed=0)
    one = get_scheduler("verl", k_best=1).search(small_workload, small_cluster, budget)
    five = get_scheduler("verl").search(small_workload, small_cluster, budget)
    assert five.estimate.iteration_s <= one.estimate.iteration_s
    assert one.extra["measured_configurations"] == 1
    assert 1 <= five.extra["measured_configurations"] <= 5
