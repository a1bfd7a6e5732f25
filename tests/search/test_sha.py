"""SHA-EA's parts: successive halving vs random search, GPU-group sizes, swap local search,
Baldwinian evolution, and the load balancer."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hetrl.cost.model import CostModel
from hetrl.errors import SpecError
from hetrl.plan import Plan, TaskGroup, even_layers, make_placement, validate
from hetrl.search import Budget, get_scheduler
from hetrl.search.balance import balance_data, balance_layers, proportional_split
from hetrl.search.base import Evaluator
from hetrl.search.ea import (
    AFF_NODE,
    AFF_REGION,
    AFF_ZONE,
    Arm,
    DeviceFacts,
    local_search,
)
from hetrl.search.genome import decode
from hetrl.search.options import PolishOptions, SHAOptions
from hetrl.search.polish import _SplitRun
from hetrl.search.sha import HetRLSimpleScheduler, sample_sizes
from hetrl.spec.cluster import ClusterSpec, NodeSpec, RegionLink
from hetrl.spec.presets import cluster_preset, workload_preset
from hetrl.spec.random_cluster import random_cluster

# --- SHA-EA vs random search ---------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sha_ea_beats_random_search_at_equal_evaluations(seed, small_workload, small_cluster):
    budget = Budget(evaluations=300, seed=seed)
    sha = get_scheduler("hetrl").search(small_workload, small_cluster, budget)
    rnd = get_scheduler("random").search(small_workload, small_cluster, budget)
    assert sha.evaluations == rnd.evaluations == 300
    assert sha.estimate.iteration_s < rnd.estimate.iteration_s


def test_hetrl_simple_runs(small_workload, small_cluster):
    assert HetRLSimpleScheduler.halve is False and HetRLSimpleScheduler.swaps == "within"
    result = get_scheduler("hetrl-simple").search(small_workload, small_cluster,
                                                  Budget(evaluations=150, seed=0))
    validate(result.plan, small_workload, small_cluster)
    assert result.estimate.feasible and result.evaluations <= 150


def test_sha_ea_improves_with_budget(small_workload, small_cluster):
    """More evaluations never hurt much: the best of a long run is at least as good as the
    first feasible plan of its own history."""
    result = get_scheduler("hetrl").search(small_workload, small_cluster,
                                           Budget(evaluations=400, seed=1))
    feasible = [h[2] for h in result.history if h[2] < float("inf")]
    assert result.estimate.iteration_s == min(feasible) <= feasible[0]


def test_sha_ea_says_whether_its_polish_finished_a_pass(small_workload, small_cluster):
    """At 500 evaluations the co-located finalist's first polish pass is cut off (the result
    names a budget where the largest unfinished pass fits a third of it, and at least twice
    the budget given); at 3,000 it finishes."""
    short = get_scheduler("hetrl").search(small_workload, small_cluster,
                                          Budget(evaluations=500, seed=0)).to_dict()
    assert short["polish_finished"] is False
    assert short["polish_budget"]["evaluations"] >= 2 * 500
    assert short["suggested_budget"]["evaluations"] >= short["polish_budget"]["evaluations"]
    assert short["polish_budget"]["evaluations"] <= 3000  # where a pass did finish
    long = get_scheduler("hetrl").search(small_workload, small_cluster,
                                         Budget(evaluations=3000, seed=0)).to_dict()
    assert long["polish_finished"] is True and long["polish_budget"] is None
    # without the polish, nothing is said of one
    bare = get_scheduler("hetrl", polish=None).search(small_workload, small_cluster,
                                                      Budget(evaluations=300, seed=0))
    assert "polish_finished" not in bare.to_dict()


# --- level 2: GPU-group sizes --------------------------------------------------------------------


@given(st.integers(min_value=1, max_value=96), st.integers(min_value=1, max_value=6),
       st.integers(min_value=1, max_value=8), st.integers(min_value=0, max_value=2**32 - 1))
def test_sample_sizes_are_distinct_compositions(n, groups, k, seed):
    if groups > n:
        groups = n
    out = sample_sizes(n, groups, k, np.random.default_rng(seed))
    assert 1 <= len(out) <= k
    assert len(set(out)) == len(out)
    for sizes in out:
        assert len(sizes) == groups and sum(sizes) == n and min(sizes) >= 1
    even = tuple(n // groups + (1 if i < n % groups else 0) for i in range(groups))
    assert out[0] == even


def test_sample_sizes_by_hand():
    rng = np.random.default_rng(0)
    out = sample_sizes(64, 3, 4, rng)
    assert out[0] == (22, 21, 21)
    assert out[1] == (24, 24, 16)  # 8 nodes over 3 groups, whole nodes
    assert len(out) == 4
    assert sample_sizes(5, 5, 3, rng) == [(1, 1, 1, 1, 1)]  # the only composition


# --- level 3/5: swap local search ----------------------------------------------------------------


def slices(order, sizes):
    """The groups of an order, the unused rest as a group of its own (as local search sees it)."""
    out, start = [], 0
    for n in sizes:
        out.append(order[start:start + n])
        start += n
    if start < len(order):
        out.append(order[start:])
    return out


def locality(order, sizes, facts: DeviceFacts) -> int:
    """Sum over groups of the affinity of every pair of the group's GPUs (node 4, zone 2,
    region 1)."""
    total = 0
    for group in slices(order, sizes):
        for a, b in itertools.combinations(group, 2):
            total += facts.affinity(a, b)
    return total


def mixed_cluster() -> ClusterSpec:
    """6 nodes x 4 GPUs, two types, three regions (with two zones in r1): cross-node swaps of one
    GPU type exist."""
    nodes = (
        NodeSpec("a0", "A100-80GB", 4, "r1", "a"), NodeSpec("l0", "L40S", 4, "r1", "b"),
        NodeSpec("a1", "A100-80GB", 4, "r2"), NodeSpec("l1", "L40S", 4, "r2"),
        NodeSpec("a2", "A100-80GB", 4, "r3"), NodeSpec("l2", "L40S", 4, "r3"),
    )
    links = (RegionLink("r1", "r2", 10, 5), RegionLink("r1", "r3", 20, 2),
             RegionLink("r2", "r3", 15, 3))
    return ClusterSpec("mixed24", nodes, links)


def test_affinity_levels():
    facts = DeviceFacts.of(CostModel(workload_preset("qwen3-4b-grpo-sync"), mixed_cluster()))
    assert facts.affinity(0, 1) == AFF_NODE == 4  # same node
    assert facts.affinity(0, 4) == AFF_REGION == 1  # r1, zones a and b
    assert facts.affinity(0, 8) == 0  # different regions
    two_zone = ClusterSpec("z", (NodeSpec("x", "L4", 1, "r"), NodeSpec("y", "L4", 1, "r")))
    f2 = DeviceFacts.of(CostModel(workload_preset("qwen3-4b-grpo-sync"), two_zone))
    assert f2.affinity(0, 1) == AFF_ZONE == 2  # one zone, two nodes


def test_local_search_by_hand():
    """Two groups of two A100s interleaved over two nodes: one swap puts each group in a node."""
    cl = ClusterSpec("2x2", (NodeSpec("p", "A100-80GB", 2, "r"), NodeSpec("q", "A100-80GB", 2, "r")))
    facts = DeviceFacts.of(CostModel(workload_preset("qwen3-4b-grpo-sync"), cl))
    before = (0, 2, 1, 3)  # groups {0, 2} and {1, 3}: every pair across nodes (zone: 2 each)
    after = local_search(before, (2, 2), facts)
    assert locality(before, (2, 2), facts) == 4
    assert locality(after, (2, 2), facts) == 8
    assert {frozenset(g) for g in slices(after, (2, 2))} == {frozenset({0, 1}), frozenset({2, 3})}
    # HetRL-simple's "within" swaps never move a GPU to another group.
    within = local_search(before, (2, 2), facts, swaps="within")
    assert [set(g) for g in slices(within, (2, 2))] == [{0, 2}, {1, 3}]


def _local_search_case(seed: int):
    cl = mixed_cluster() if seed % 2 else random_cluster(seed, num_nodes=6, num_regions=3,
                                                          gpus=("A100-80GB", "L40S", "L4"))
    facts = DeviceFacts.of(CostModel(workload_preset("qwen3-4b-grpo-sync"), cl))
    rng = np.random.default_rng(seed)
    n = cl.num_devices
    groups = int(rng.integers(1, min(4, n) + 1))
    used = int(rng.integers(groups, n + 1))
    sizes = tuple(int(s) for s in sample_sizes(used, groups, 3, rng)[-1])
    order = tuple(int(d) for d in rng.permutation(n))
    return facts, order, sizes


@given(st.integers(min_value=0, max_value=10_000))
def test_local_search_invariants(seed):
    facts, order, sizes = _local_search_case(seed)
    after = local_search(order, sizes, facts)
    assert sorted(after) == sorted(order)  # the same devices, each once
    assert locality(after, sizes, facts) >= locality(order, sizes, facts)
    for g_before, g_after in zip(slices(order, sizes), slices(after, sizes), strict=True):
        assert len(g_before) == len(g_after)  # group sizes kept
        # swaps only exchange GPUs of one type: each group keeps its multiset of GPU types
        assert sorted(facts.gpu[d] for d in g_before) == sorted(facts.gpu[d] for d in g_after)
    for group in slices(after, sizes)[: len(sizes)]:
        nodes = [facts.node[d] for d in group]
        runs = [k for k, _ in itertools.groupby(nodes)]
        assert len(runs) == len(set(runs)), "a group's GPUs come node by node"
    # "within" keeps every group's set of devices
    within = local_search(order, sizes, facts, swaps="within")
    for g_before, g_after in zip(slices(order, sizes), slices(within, sizes), strict=True):
        assert set(g_before) == set(g_after)


@pytest.mark.parametrize("seed", [1, 3, 4, 7])
def test_local_search_ends_in_a_local_optimum(seed):
    """With enough swaps allowed, no single cross-group swap of two GPUs of one type improves
    the locality score of the result."""
    facts, order, sizes = _local_search_case(seed)
    after = list(local_search(order, sizes, facts, max_swaps=10_000))
    score = locality(after, sizes, facts)
    bounds = np.cumsum((0,) + sizes + (len(after) - sum(sizes),))
    group = np.searchsorted(bounds, np.arange(len(after)), side="right") - 1
    for i, j in itertools.combinations(range(len(after)), 2):
        if group[i] == group[j] or facts.gpu[after[i]] != facts.gpu[after[j]]:
            continue
        trial = list(after)
        trial[i], trial[j] = trial[j], trial[i]
        assert locality(trial, sizes, facts) <= score


# --- Baldwinian evolution ------------------------------------------------------------------------


def _two_group_arm(seed: int) -> tuple:
    """(workload, cluster, cost model, device facts, arm): generation on 12 GPUs of the mixed
    cluster, the other tasks on the other 12, a population of 6."""
    wl = workload_preset("qwen3-4b-grpo-sync").with_(batch_prompts=64)
    cl = mixed_cluster()
    model = CostModel(wl, cl)
    facts = DeviceFacts.of(model)
    groups = (("actor_generation",), ("reward_inference", "reference_inference", "actor_training"))
    return wl, cl, model, facts, Arm(groups, (12, 12), model, facts, np.random.default_rng(seed),
                                     options=SHAOptions(population=6))


def test_baldwinian_population_keeps_unimproved_genotypes():
    wl, cl, model, _, arm = _two_group_arm(5)
    calls: list = []
    original_improve = arm.improve

    def spy(g):
        out = original_improve(g)
        calls.append((g, out))
        return out

    arm.improve = spy
    evaluated: list[Plan] = []
    ev = Evaluator(wl, cl, Budget(evaluations=60, seed=0), model=model)
    original_evaluate = ev.evaluate

    def spy_evaluate(plan):
        evaluated.append(plan)
        return original_evaluate(plan)

    ev.evaluate = spy_evaluate
    arm.run(ev, 40)
    assert arm.evaluations == len(evaluated) == len(calls) == 40
    improved = dict(calls)
    # Local search runs before every evaluation: each evaluated plan is an improved genotype's.
    for plan, (_, out) in zip(evaluated, calls, strict=True):
        assert plan.placements == decode(out, model).placements
    # The population holds the genotypes local search was given, with the improved fitness.
    changed = 0
    for f, g in arm.population:
        assert g in improved, "a population member is a mutated/random genotype"
        better = improved[g]
        assert f == pytest.approx(ev.fitness(model.estimate(decode(better, model), check=False)))
        if better != g:
            changed += 1
    assert changed > 0, "local search changed some genotypes, and they were not written back"


def test_memoised_decoding_and_local_search_match_fresh_ones():
    """decode memoises placements per cost model and an arm memoises local search per device
    order: after a search has filled both, every genotype decodes as with a fresh cost model,
    and improves as local search computes it afresh."""
    wl, cl, model, facts, arm = _two_group_arm(7)
    arm.run(Evaluator(wl, cl, Budget(evaluations=200, seed=0), model=model), 150)
    assert arm._improved, "the memo was used"
    checked = 0
    for g in [g for _, g in arm.population] + [arm.mutate(g) for _, g in arm.population]:
        assert decode(g, model) == decode(g, CostModel(wl, cl))
        assert arm.improve(g).order == local_search(g.order, g.sizes, facts)
        checked += 1
    assert checked == 12


# --- load balancer -------------------------------------------------------------------------------


def test_proportional_split_by_hand():
    # raw = 1 + 7 * w / 4 = (2.75, 2.75, 4.5): floors (2, 2, 4), two remainders of 0.75 first.
    assert proportional_split(10, [1, 1, 2]) == (3, 3, 4)
    # raw (1.7, 1.7, 6.6) -> (2, 2, 6); the third is capped at 3: its excess moves one at a time
    # to the part with the most room: (3, 2, 5), (3, 3, 4), (4, 3, 3).
    assert proportional_split(10, [1, 1, 8], caps=[5, 5, 3]) == (4, 3, 3)
    assert proportional_split(4, [5, 1, 1, 1]) == (1, 1, 1, 1)
    with pytest.raises(ValueError):
        proportional_split(2, [1, 1, 1])


@given(st.integers(min_value=1, max_value=80),
       st.lists(st.floats(min_value=0.01, max_value=100.0), min_size=1, max_size=8),
       st.data())
def test_proportional_split_properties(total, weights, data):
    if total < len(weights):
        total = len(weights)
    out = proportional_split(total, weights)
    assert sum(out) == total and min(out) >= 1 and len(out) == len(weights)
    for i, j in itertools.permutations(range(len(weights)), 2):
        if weights[i] > weights[j]:
            assert out[i] >= out[j]  # a faster part never gets fewer
    caps = data.draw(st.lists(st.integers(min_value=1, max_value=total), min_size=len(weights),
                              max_size=len(weights)))
    capped = proportional_split(total, weights, caps)
    assert sum(capped) == total and min(capped) >= 1
    if sum(caps) >= total:
        assert all(c <= cap for c, cap in zip(capped, caps, strict=True))


def test_data_balance_gives_faster_replicas_larger_shares(small_workload, small_cluster):
    """Generation is memory-bound: an A100 replica (2039 GB/s) decodes faster than an L40S one
    (864 GB/s), so it gets the larger share, and the task finishes sooner than with equal
    shares."""
    model = CostModel(small_workload, small_cluster)
    p = make_placement("actor_generation", list(range(8)), 2, 1, 4, 36)
    times = model.replica_seconds(p)
    assert times[0] < times[1]
    balanced = balance_data(model, p)
    w = balanced.data_weights
    assert w[0] > w[1] and w[0] == 1.0
    assert w[1] == pytest.approx(times[0] / times[1], rel=1e-5)

    def plan_with(gen):
        others = [make_placement(t, list(range(8)), 2, 1, 4, 36)
                  for t in small_workload.task_names[1:]]
        return Plan((TaskGroup(small_workload.task_names, tuple(range(8))),), (gen, *others))

    even = model.estimate(plan_with(p)).tasks["actor_generation"]
    shared = model.estimate(plan_with(balanced)).tasks["actor_generation"]
    assert shared < even
    # Identical replicas keep equal weights.
    same = make_placement("actor_generation", [0, 1, 2, 3], 2, 1, 2, 36)
    assert balance_data(model, same).data_weights == (1.0, 1.0)


def test_layer_balance_gives_faster_stages_more_layers():
    """Training on A100 (312 TFLOPS) then L4 (121 TFLOPS) stages: the A100 stage gets more of
    the 36 layers; identical stages keep the even split."""
    wl = workload_preset("qwen3-4b-grpo-sync")
    cl = cluster_preset("hetero24-two-region")  # A100 0-7, L40S 8-15, L4 16-23
    model = CostModel(wl, cl)
    p = make_placement("actor_training", [0, 1, 2, 3, 16, 17, 18, 19], 1, 2, 4, 36)
    out = balance_layers(model, p)
    assert sum(out.layers_per_stage) == 36
    assert out.layers_per_stage[0] > out.layers_per_stage[1]
    # proportional to FLOPS, unless the L4 stage's memory cap binds
    assert out.layers_per_stage[0] >= round(36 * 312 / (312 + 121)) - 1
    assert model.task_alone(out)[0] < model.task_alone(p)[0]
    same = make_placement("actor_training", [0, 1, 2, 3, 4, 5, 6, 7], 1, 2, 4, 36)
    assert balance_layers(model, same).layers_per_stage == even_layers(36, 2)
    gen = replace(p, task="actor_generation")
    # generation balances by HBM bandwidth: A100 2039 GB/s vs L4 300 GB/s
    assert balance_layers(model, gen).layers_per_stage[0] > 18


# --- part-of-group layouts and the polish (our additions) ----------------------------------------


@pytest.mark.parametrize("n", [1, 2, 8, 16, 24, 64])
def test_sub_layouts_complete_level_4(n):
    from hetrl.search.space import layouts, sub_layouts

    shape = workload_preset("qwen3-8b-ppo-sync").model("actor")
    full, sub = set(layouts(shape, n)), set(sub_layouts(shape, n))
    assert not full & sub
    assert all(x[0] * x[1] * x[2] < n for x in sub)
    # together: every (dp, pp, tp) with dp * pp * tp <= n under the tp / pp rules (paper: L4)
    every = {(dp, pp, tp) for tp in {x[2] for x in full} for pp in range(1, 17)
             for dp in range(1, n + 1) if dp * pp * tp <= n and pp <= shape.layers}
    assert full | sub == every


def test_offsets_are_block_aligned():
    from hetrl.search.moves import offsets

    assert list(offsets(16, 24)) == [0, 8, 16]
    assert list(offsets(8, 16)) == [0, 8]
    assert list(offsets(6, 16)) == [0, 2, 4, 6, 8, 10, 12, 14]


def test_polish_splits_independent_tasks_and_only_improves(small_workload, small_cluster):
    model = CostModel(small_workload, small_cluster)
    tasks = tuple(small_workload.task_names)
    arm = Arm((tasks,), (8,), model, DeviceFacts.of(model), np.random.default_rng(0))
    assert ("reward_inference", "reference_inference") in arm.polisher._independent_sets(2)
    assert all(("actor_generation", t) not in arm.polisher._independent_sets(2) for t in tasks)
    ev = Evaluator(small_workload, small_cluster, Budget(evaluations=10**6))
    arm.run(ev, 8)
    before = min(f for f, _ in arm.population)
    arm.polish(ev, cap=400)
    after = min(f for f, _ in arm.population)
    assert after <= before
    assert arm.evaluations <= 8 + 400


def test_hetrl_reaches_the_split_plan_on_a_small_instance(small_workload, small_cluster):
    """The ILP's optimum on 8 GPUs puts two inference tasks side by side on the two nodes;
    SHA-EA, with part-of-group layouts and the polish, finds a plan at least as good."""
    budget = Budget(evaluations=1500, seed=0)
    a = get_scheduler("hetrl").search(small_workload, small_cluster, budget)
    b = get_scheduler("hetrl").search(small_workload, small_cluster, budget)
    assert a.plan == b.plan  # deterministic
    ilp = get_scheduler("ilp").search(small_workload, small_cluster,
                                      Budget(evaluations=200, seed=0, workers=1))
    assert a.estimate.iteration_s <= ilp.estimate.iteration_s * 1.01


def test_arm_stalled_counts_evaluations_since_its_best(small_workload, small_cluster):
    model = CostModel(small_workload, small_cluster)
    arm = Arm(tuple((t,) for t in small_workload.task_names), (2, 2, 2, 2), model,
              DeviceFacts.of(model), np.random.default_rng(0))
    ev = Evaluator(small_workload, small_cluster, Budget(evaluations=10**6))
    arm.run(ev, 40)
    assert 1 <= arm.improved_at <= arm.evaluations == 40
    assert arm.stalled(arm.evaluations - arm.improved_at)
    assert not arm.stalled(arm.evaluations - arm.improved_at + 1)


@pytest.mark.parametrize("stall", [64, 10**9])
def test_stalled_finalist_is_polished_even_when_a_pass_does_not_fit(stall, small_workload,
                                                                    small_cluster, monkeypatch):
    """A finalist whose whole polish pass costs more than the cap is still polished (a partial
    pass) once its EA has stalled; without a stall it is not."""
    calls = []
    real = Arm.polish

    def spy(self, ev, max_passes=2, cap=None):
        calls.append(cap)
        return real(self, ev, max_passes, cap)

    monkeypatch.setattr(Arm, "polish_cost", lambda self: 10**9)
    monkeypatch.setattr(Arm, "polish", spy)
    result = get_scheduler("hetrl", stall_steps=stall).search(
        small_workload, small_cluster, Budget(evaluations=1500, seed=0))
    assert result.evaluations <= 1500
    if stall == 64:
        assert calls and all(c == 500 for c in calls)
    else:
        assert not calls


@pytest.mark.parametrize("seconds, evaluations, expect", [
    (None, 300, "cap"),           # an evaluation budget alone: exactly it
    # a cap far above what the time allows: the time decides (5 s, not less: the 24 timed
    # warm-up evaluations must finish inside it on a loaded machine)
    (5.0, 10**9, "time"),
    (600.0, 40, "cap"),           # a cap below what the time allows: the cap decides
])
def test_evaluation_budget_is_the_smaller_of_time_and_cap(seconds, evaluations, expect,
                                                          small_workload, small_cluster):
    sched = HetRLSimpleScheduler()
    ev = Evaluator(small_workload, small_cluster, Budget(seconds=seconds, evaluations=evaluations))
    model = ev.model
    # the warm-up runs on an arm with all tasks in one group
    warm = Arm((tuple(small_workload.task_names),), (small_cluster.num_devices,), model,
               DeviceFacts.of(model), np.random.default_rng(0), swaps=sched.swaps)
    total = sched._evaluation_budget(ev, warm if seconds is not None else None)
    if expect == "cap":
        assert total == evaluations
    else:
        assert 16 <= total < evaluations


def test_time_budget_warm_up_runs_on_the_colocated_arm_the_search_keeps(
        small_workload, small_cluster, monkeypatch):
    # the warm-up that turns seconds into evaluations searches on the all-co-located
    # grouping's arm, and the rounds go on with that arm: its first plans are not thrown away
    from hetrl.search.sha import _SHABase

    seen = {}
    real = _SHABase._evaluation_budget

    def spy(ev, warm):
        total = real(ev, warm)
        seen["warm"], seen["after_warm_up"] = warm, (warm.evaluations, warm.best)
        return total

    monkeypatch.setattr(_SHABase, "_evaluation_budget", staticmethod(spy))
    result = get_scheduler("hetrl").search(small_workload, small_cluster,
                                           Budget(seconds=3.0, seed=0))
    warm = seen["warm"]
    assert warm is not None and len(warm.groups) == 1 and len(warm.population) == 8
    evaluations, best = seen["after_warm_up"]
    assert evaluations == 24 and warm.evaluations > evaluations  # it searched on in the rounds
    assert result.estimate.iteration_s <= best


def _colocated_arm(workload, cluster, seed=0, **options):
    model = CostModel(workload, cluster)
    tasks = tuple(workload.task_names)
    return Arm((tasks,), (cluster.num_devices,), model, DeviceFacts.of(model),
               np.random.default_rng(seed), options=SHAOptions.from_flat(**options))


def test_polish_stopped_at_a_cap_resumes_where_it_stopped(small_workload, small_cluster):
    """Two polish calls of 100 evaluations each do what one of 200 does: the pass stopped at
    the first cap goes on from where it stopped, it does not start again."""
    ev_a = Evaluator(small_workload, small_cluster, Budget(evaluations=10**6))
    ev_b = Evaluator(small_workload, small_cluster, Budget(evaluations=10**6))
    a, b = _colocated_arm(small_workload, small_cluster), _colocated_arm(small_workload,
                                                                        small_cluster)
    assert a.polish_cost() > 200  # so both stop at their caps
    for arm, ev in ((a, ev_a), (b, ev_b)):
        arm.run(ev, 8)
    a.polish(ev_a, cap=100)
    assert a.polishing and a.polish_pending()
    a.polish(ev_a, cap=100)
    b.polish(ev_b, cap=200)
    assert a.evaluations == b.evaluations == 208
    # the same plans in the same order: the same improvements at the same evaluations (the
    # populations may differ: each call puts its best so far into the population)
    assert [(e, f) for _, e, f in ev_a.history] == [(e, f) for _, e, f in ev_b.history]
    assert min(f for f, _ in a.population) == min(f for f, _ in b.population)


def test_finished_polish_waits_for_a_new_best_without_kicks(small_workload, small_cluster):
    ev = Evaluator(small_workload, small_cluster, Budget(evaluations=10**6))
    arm = _colocated_arm(small_workload, small_cluster, kick_moves=0)
    arm.run(ev, 8)
    for _ in range(20):  # whole passes, each from the last one's end while it improves
        arm.polish(ev)  # no cap: the whole pass
        if not arm.polish_pending():
            break
    assert not arm.polishing and not arm.polish_pending()
    spent = arm.evaluations
    arm.polish(ev)  # nothing new to start from: no evaluations
    assert arm.evaluations == spent
    arm.best = arm.best - 1.0  # as if the EA had found better
    assert arm.polish_pending()


def test_converged_polish_goes_on_from_a_kicked_best(small_workload, small_cluster):
    """Iterated local search: once a pass has converged, the next starts from the best after
    ``kick_moves`` random moves -- it evaluates, and never makes the arm's best worse."""
    ev = Evaluator(small_workload, small_cluster, Budget(evaluations=10**6))
    arm = _colocated_arm(small_workload, small_cluster, kick_moves=3)
    arm.run(ev, 8)
    arm.polish(ev)  # no cap: the whole first pass
    assert not arm.polishing and arm.polish_pending()
    best, spent = arm.best, arm.evaluations
    arm.polish(ev, cap=50)
    assert arm.evaluations > spent and arm.best <= best
    # the kicked pass does not restart at each call: it resumes until it converges
    assert arm.polishing
    arm.polish(ev)
    assert not arm.polishing and arm.best <= best


def test_a_pass_that_improved_is_followed_by_one_from_its_end(small_workload, small_cluster,
                                                             monkeypatch):
    """A pass's splits start from where the pass started only, so a pass that improved on its
    start is followed by another from its end, not by a kick: no random move is made, and
    without kicks the polish still has work."""
    ev = Evaluator(small_workload, small_cluster, Budget(evaluations=10**6))
    arm = _colocated_arm(small_workload, small_cluster, kick_moves=0)
    arm.run(ev, 8)
    start = arm.best
    arm.polish(ev)
    assert arm.best < start  # the first pass improved (the fixture's EA best is far off)
    polisher = arm.polisher
    assert polisher._chain is not None and polisher._chain[0] == arm.best
    assert arm.polish_pending()
    monkeypatch.setattr(type(arm), "mutate", lambda self, g: pytest.fail("kicked"))
    best, spent = arm.best, arm.evaluations
    arm.polish(ev)  # from the first pass's end
    assert arm.evaluations > spent and arm.best <= best


def test_kicks_alternate_type_orders_and_random_moves(small_workload, monkeypatch):
    """With ``kick_orders`` (and no window kicks), the first, third, ... kick reorders the
    group's type blocks (the next order of its types not tried since the best last improved),
    the others make ``kick_moves`` random moves; once no order is left, every kick is random."""
    cluster = ClusterSpec("mixed", (
        NodeSpec("a1", "A100-80GB", 2, "us-east-1"), NodeSpec("l1", "L40S", 2, "us-east-2"),
        NodeSpec("t1", "L4", 2, "us-east-2")),
        region_links=(RegionLink("us-east-1", "us-east-2", 10.0, 5.0),))
    arm = _colocated_arm(small_workload, cluster, kick_moves=2, kick_windows=False)
    gpu = [d.gpu.name for d in cluster.devices]
    moves = []
    monkeypatch.setattr(type(arm), "mutate", lambda self, g: moves.append(1) or g)
    g = arm.polisher.type_blocked(arm.random_genotype())

    def types(h):
        return list(dict.fromkeys(gpu[d] for d in h.order))

    seen, random_kicks = [types(g)], 0
    ev = Evaluator(small_workload, cluster, Budget(evaluations=10**6))
    for _ in range(10):  # 3 types: 5 other orders, on the odd kicks
        before = len(moves)
        h = arm.polisher.kicks.kicked(ev, g)
        if len(moves) > before:
            assert len(moves) - before == 2 and h == g  # kick_moves random moves
            random_kicks += 1
        else:
            seen.append(types(h))
    assert len(seen) == 6 and len({tuple(t) for t in seen}) == 6  # every order once
    assert random_kicks == 5
    arm.polisher.kicks.count = 0
    for _ in range(2):  # no order left: random moves
        before = len(moves)
        arm.polisher.kicks.kicked(ev, g)
        assert len(moves) - before == 2
    assert arm.polisher.type_reordered(g, 6) is None
    # kick_orders does nothing without kicks
    with pytest.raises(SpecError, match="kick_orders"):
        SHAOptions.from_flat(kick_moves=0, kick_orders=True)
    assert not SHAOptions.from_flat(kick_orders=False).polish.kick_orders


def test_window_kicks_move_one_task_onto_a_type_window_best_priced_first(small_workload,
                                                                         monkeypatch):
    """With ``kick_windows`` the kicks take turns: a type window, a type order, random moves.
    A window kick moves one task onto a type window of its group it is not on; every such move
    is priced once (one evaluation each) and they come best-priced first, each once."""
    cluster = ClusterSpec("mixed", (
        NodeSpec("a1", "A100-80GB", 2, "us-east-1"), NodeSpec("l1", "L40S", 2, "us-east-2"),
        NodeSpec("t1", "L4", 2, "us-east-2")),
        region_links=(RegionLink("us-east-1", "us-east-2", 10.0, 5.0),))
    arm = _colocated_arm(small_workload, cluster, kick_moves=2, kick_windows=True)
    p = arm.polisher
    moves = []
    monkeypatch.setattr(type(arm), "mutate", lambda self, g: moves.append(1) or g)
    g = p.type_blocked(arm.seeded_genotype())
    ev = Evaluator(small_workload, cluster, Budget(evaluations=10**6))
    windows = p.type_windows(g, 0)

    def moved(h):
        """The one task ``h`` moved from ``g``, which must be onto one of the type windows."""
        diff = [t for t, _ in g.layouts
                if (h.layout(t), h.offset(t)) != (g.layout(t), g.offset(t))]
        assert len(diff) == 1 and h.order == g.order
        t = diff[0]
        assert (h.offset(t), math.prod(h.layout(t)[:3])) in windows
        return t

    first = p.kicks.kicked(ev, g)  # a window: every move priced now
    moved(first)
    priced = ev.evaluations
    assert priced == len(p.kicks.windows) + 1 >= 2
    f_first = arm.fitness(ev, first)
    assert all(arm.fitness(ev, h) >= f_first for h in p.kicks.windows)
    assert p.kicks.kicked(ev, g).order != g.order  # an order
    before = len(moves)
    assert p.kicks.kicked(ev, g) == g and len(moves) - before == 2  # random moves
    left = list(p.kicks.windows)
    count = ev.evaluations
    assert p.kicks.kicked(ev, g) == left[0] and ev.evaluations == count  # the next, not priced again
    p.kicks.new_best()  # (a pass ended below the best): every window is new again, priced again
    p.kicks.count = 0
    assert p.kicks.kicked(ev, g) == first and ev.evaluations == count + priced
    with pytest.raises(SpecError, match="kick_windows"):
        SHAOptions.from_flat(kick_moves=0, kick_windows=True)


class _FakeArm:
    def __init__(self, best, sizes=(8,)):
        self.best, self.sizes = best, sizes


def test_finalists_keep_the_best_colocated_arm_and_the_best_warm_arm():
    from hetrl.search.rounds import Level1
    from hetrl.search.sha import choose_finalists

    together = Level1((("a", "b", "c"),), [_FakeArm(9.0), _FakeArm(7.0)], True)
    split = Level1((("a",), ("b", "c")), [_FakeArm(1.0), _FakeArm(2.0), _FakeArm(3.0),
                                           _FakeArm(4.0)], True)
    alive = [split]  # the halving dropped the co-located grouping
    out = choose_finalists(alive, together.arms)
    assert [a.best for a in out] == [7.0, 1.0, 2.0, 3.0]  # added first: its polish goes first
    assert [a.best for a in choose_finalists(alive, together.arms, colocated=False)] == [
        1.0, 2.0, 3.0]
    # the best warm arm joins (after the three best), unless it is among them already
    warm = [_FakeArm(5.0), _FakeArm(6.0)]
    assert [a.best for a in choose_finalists(alive, together.arms, warm=warm)] == [
        7.0, 1.0, 2.0, 3.0, 5.0]
    assert [a.best for a in choose_finalists(alive, [], warm=split.arms[1:])] == [1.0, 2.0, 3.0]
    # already among the best three: not added twice
    together.arms.append(_FakeArm(0.5))
    assert [a.best for a in choose_finalists([together, split], together.arms)] == [
        0.5, 1.0, 2.0]
    together.arms = [_FakeArm(float("inf"))]  # nothing feasible found: not kept
    assert len(choose_finalists(alive, together.arms)) == 3
    # co-located on part of the GPUs (a warm start's fast types): the best such arm is kept
    # beside the best on all of them, the better first (it polishes first)
    together.arms = [_FakeArm(9.0), _FakeArm(8.0), _FakeArm(6.5, (6,)), _FakeArm(7.5, (4,))]
    assert [a.best for a in choose_finalists(alive, together.arms)] == [6.5, 8.0, 1.0, 2.0, 3.0]


class _Clock:
    """An Evaluator stand-in for the replanning arithmetic: evaluations, elapsed seconds, and
    a budget with an optional evaluation cap."""

    def __init__(self, evaluations, elapsed, cap=None):
        self.evaluations, self._elapsed = evaluations, elapsed
        self.budget = Budget(seconds=100.0, evaluations=cap)

    def elapsed(self):
        return self._elapsed


def test_rounds_are_replanned_from_the_last_rounds_rate():
    from hetrl.search.sha import _SHABase

    # the last round: 1,000 evaluations in 10 s (100/s); 20 s left to the rounds' deadline,
    # over 4 rounds: 500 evaluations each -- whatever the warm-up planned
    ev = _Clock(evaluations=3000, elapsed=50.0)
    assert _SHABase._replanned(ev, 70.0, 4, 0, (40.0, 2000), 0.3) == pytest.approx(500.0)
    # an evaluation cap bounds it
    # (the cap's 70% for the rounds: (4,000 - 24) x 0.7 = 2,783.2, less what they have spent)
    ev = _Clock(evaluations=2976 + 24, elapsed=50.0, cap=4000)
    assert _SHABase._replanned(ev, 70.0, 4, 24, (40.0, 2000), 0.3) == 0.0  # all spent
    ev = _Clock(evaluations=1024, elapsed=50.0, cap=4000)  # 1,000 spent; rate 1,024 / 10 s
    assert _SHABase._replanned(ev, 70.0, 4, 24, (40.0, 0), 0.3) == pytest.approx(
        ((4000 - 24) * 0.7 - 1000) / 4)
    # past the deadline: nothing
    assert _SHABase._replanned(_Clock(3000, 80.0), 70.0, 2, 0, (40.0, 2000), 0.3) == 0.0


def test_time_budget_reports_its_halving_rounds(small_workload, small_cluster):
    result = get_scheduler("hetrl").search(small_workload, small_cluster,
                                           Budget(seconds=2.0, seed=0))
    assert 1 <= result.extra["halving_rounds"]
    assert 0 <= result.extra["halving_rounds_completed"] <= result.extra["halving_rounds"]
    assert result.to_dict()["halving_rounds"] == result.extra["halving_rounds"]


def test_type_blocked_puts_each_groups_gpus_in_blocks_of_one_type(small_workload):
    """The polish's first move: each group's GPUs reordered into runs of one type (nodes of a
    type together), the same GPUs in each group, types and nodes in order of first appearance."""
    from hetrl.spec.cluster import ClusterSpec, NodeSpec, RegionLink

    cluster = ClusterSpec("mixed", (
        NodeSpec("a1", "A100-80GB", 2, "us-east-1"), NodeSpec("l1", "L40S", 2, "us-east-2"),
        NodeSpec("a2", "A100-80GB", 2, "us-east-1"), NodeSpec("t1", "L4", 2, "us-east-2"),
        NodeSpec("l2", "L40S", 2, "us-east-2")),
        region_links=(RegionLink("us-east-1", "us-east-2", 10.0, 5.0),))
    model = CostModel(small_workload, cluster)
    tasks = tuple(small_workload.task_names)
    arm = Arm((tasks[:2], tasks[2:]), (6, 4), model, DeviceFacts.of(model),
              np.random.default_rng(0))
    gpu = [d.gpu.name for d in cluster.devices]
    node = [d.node for d in cluster.devices]
    for _ in range(20):  # random genotypes of the arm
        g = arm.random_genotype()
        blocked = arm.polisher.type_blocked(g)
        for before, after in zip(g.slices(), blocked.slices(), strict=True):
            assert sorted(before) == sorted(after)
            types = [gpu[d] for d in after]
            runs = [t for i, t in enumerate(types) if i == 0 or t != types[i - 1]]
            assert len(runs) == len(set(runs))  # one run per type
            assert runs == list(dict.fromkeys(gpu[d] for d in before))  # first-appearance order
            nodes = [node[d] for d in after]
            node_runs = [n for i, n in enumerate(nodes) if i == 0 or n != nodes[i - 1]]
            assert len(node_runs) == len(set(node_runs))  # a node's GPUs together
        assert arm.polisher.type_blocked(blocked) == blocked  # already in blocks: unchanged


def test_a_pair_split_starts_from_a_guess_that_fits(small_workload, small_cluster):
    """The second task's first guess on its window: the most data-parallel layout whose own
    memory fits the window's smallest GPU, else the one that needs least memory."""
    arm = _colocated_arm(small_workload, small_cluster)
    g = arm.random_genotype()
    task = next(t for t in small_workload.task_names
                if small_workload.task(t).kind == "training")
    room = min(arm.facts.memory) * 0.9 * arm.model.params.usable_memory_fraction
    for used, options in arm.sub_by_used[task].items():
        guess = arm.polisher.moves.first_guess(task, options, g, 0)
        assert guess in options
        window = [g.order[k % len(g.order)] for k in range(used)]
        fits = [x for x in options if arm._need(task, x) < min(
            arm.facts.memory[d] for d in window) * 0.9 * arm.model.params.usable_memory_fraction]
        if fits:
            assert guess == max(fits, key=lambda x: (x[0], -x[1]))
        else:
            assert arm._need(task, guess) == min(arm._need(task, x) for x in options)
            assert arm._need(task, guess) >= room


def test_in_first_polish_until_the_first_pass_ends(small_workload, small_cluster):
    """The final phase keeps the co-located arm while its first polish pass runs: the flag is
    set from the first capped call until the pass finishes, and never again after."""
    ev = Evaluator(small_workload, small_cluster, Budget(evaluations=10**6))
    arm = _colocated_arm(small_workload, small_cluster)
    arm.run(ev, 8)
    assert not arm.in_first_polish
    arm.polish(ev, cap=50)
    assert arm.polishing and arm.in_first_polish
    arm.polish(ev)  # the rest of the pass
    assert not arm.polishing and not arm.in_first_polish


def test_a_pass_splits_three_independent_tasks_over_three_windows():
    """PPO's reward, reference and critic inference depend on none of each other: a polish
    pass also splits them over three consecutive windows of their group (sizes aligned to the
    nodes, summing to the group) and tries every such split; the count the final phase plans
    passes with includes them."""
    wl = workload_preset("qwen3-8b-ppo-sync")
    cluster = cluster_preset("hetero24-two-region")  # three 8-GPU nodes
    model = CostModel(wl, cluster)
    tasks = tuple(wl.task_names)

    def arm(**kw):
        return Arm((tasks,), (24,), model, DeviceFacts.of(model), np.random.default_rng(0),
                   options=SHAOptions.from_flat(**kw))

    trio = ("reward_inference", "reference_inference", "critic_inference")
    on, off = arm(), arm(split_triples=False)
    assert on.polisher._independent_sets(3) == [trio]
    assert on.polisher._splits() == off.polisher._independent_sets(2) + [trio]
    assert off.polisher._splits() == off.polisher._independent_sets(2)
    # with more ways to split than its pairs together (paper64: 42 against 3 x 14), the triple
    # replaces the pairs inside it; on three 8-GPU nodes (2 against 3 x 6) it does not
    big = CostModel(wl, cluster_preset("paper64-multi-country"))
    wide = Arm((tasks,), (64,), big, DeviceFacts.of(big), np.random.default_rng(0))
    assert wide.polisher._splits() == [("actor_training", "critic_training"), trio]
    shapes = list(on.polisher._split_shapes(trio, 24))
    assert sorted(order for order, _, _ in shapes) == sorted([
        trio, ("reward_inference", "critic_inference", "reference_inference")])
    for _, sizes, options in shapes:
        assert sizes == (8, 8, 8)
        assert all(x[0] * x[1] * x[2] == m for m, opts in zip(sizes, options, strict=True)
                   for x in opts)

    ev = Evaluator(wl, cluster, Budget(evaluations=10**6), model=model)
    seen = []
    base = on.seeded_genotype()
    for _ in on.polisher._split(ev, trio, list(on.polisher._split_runs(trio, 24, base)), base,
                                lambda g, f: seen.append((f, g))):
        pass
    windows = [[set(decode(g, model).placement(t).device_ids) for t in trio] for _, g in seen]
    apart = [f for (f, _), w in zip(seen, windows, strict=True)
             if not (w[0] & w[1] or w[0] & w[2] or w[1] & w[2])]
    # every first-window offset of both orders, each task taking turns at its layouts
    assert len(apart) >= 2 * 3 * 3
    counted = on.polish_cost() - off.polish_cost()
    assert 0.5 * len(seen) <= counted <= 2 * len(seen)


def test_a_split_mix_is_the_same_in_both_orders_and_tells_gpu_types_apart():
    """A pair comes in both orders, so two shapes can hold the same windows: their mix (per
    task its window size and the GPU types in it) is the same, and it differs when a window
    moves over other GPU types -- the sweeps after a split start from the best split of each
    mix, not twice from one split."""
    wl = workload_preset("qwen3-8b-ppo-sync")
    model = CostModel(wl, cluster_preset("paper64-multi-country"))  # 24 + 24 + 16 GPUs
    arm = Arm((tuple(wl.task_names),), (64,), model, DeviceFacts.of(model),
              np.random.default_rng(0))
    g = arm.polisher.type_blocked(arm.seeded_genotype())
    types = [arm.facts.gpu[d] for d in g.order]

    def split(order, sizes, start):
        h = g
        for t, m in zip(order, sizes, strict=True):
            h = h.with_offset(t, start % 64)
            start += m
        return _SplitRun((order, sizes), [], h)

    pair = ("actor_training", "critic_training")
    one = arm.polisher._mix(split(pair, (40, 24), 24))
    assert one == arm.polisher._mix(split(pair[::-1], (24, 40), 0))  # the same windows
    assert one != arm.polisher._mix(split(pair, (40, 24), 32))  # moved by a node, over other types
    for task, size, counts in one:
        assert sum(c for _, c in counts) == size
        start = 24 if task == "actor_training" else 0
        window = [types[(start + k) % 64] for k in range(size)]
        assert dict(counts) == {t: window.count(t) for t in set(window)}


def test_cost_model_memos_start_afresh_past_their_bound_with_the_same_search(
        small_workload, small_cluster, monkeypatch):
    """Long searches bound the cost model's memory: past ``MODEL_ENTRIES`` its own tables empty
    (all at once). Estimates are pure, so the search's plan and history do not change."""
    import hetrl.cost.memo as memo

    budget = Budget(evaluations=600, seed=0)
    free = get_scheduler("hetrl").search(small_workload, small_cluster, budget)
    sizes = []
    real = CostModel.clear_memos

    def spy(self):
        sizes.append(self.memo_entries())
        real(self)
    monkeypatch.setattr(memo, "MODEL_ENTRIES", 50)
    monkeypatch.setattr(CostModel, "clear_memos", spy)
    bounded = get_scheduler("hetrl").search(small_workload, small_cluster, budget)
    assert len(sizes) > 5 and all(s > 50 for s in sizes)
    assert bounded.plan == free.plan
    assert [h[1:] for h in bounded.history] == [h[1:] for h in free.history]


def test_split_halving_gives_every_split_its_first_turn_and_fewer_evaluations():
    """``split_halving``: every (shape, offset) split of a pair gets its first turn, then only
    the better half of the splits still turning goes on after each turn; the pass costs fewer
    evaluations than turning every split to its fixed point, and the count the final phase plans
    with follows the measured one."""
    wl = workload_preset("qwen3-8b-ppo-sync")
    cluster = cluster_preset("hetero24-two-region")
    model = CostModel(wl, cluster)
    tasks = tuple(wl.task_names)
    pair = ("actor_training", "critic_training")
    ev = Evaluator(wl, cluster, Budget(evaluations=10**6), model=model)

    def run(halving: bool):
        arm = Arm((tasks,), (24,), model, DeviceFacts.of(model), np.random.default_rng(0),
                  options=SHAOptions(polish=PolishOptions(split_halving=halving,
                                                          split_screen=0)))
        seen = []
        base = arm.seeded_genotype()
        for _ in arm.polisher._split(ev, pair, list(arm.polisher._split_runs(pair, 24, base)), base,
                                     lambda g, f: seen.append((f, g))):
            pass
        # the pair's windows: (offset, GPUs used) of each task
        windows = {tuple((g.offset(t), math.prod(g.layout(t)[:3])) for t in pair) for _, g in seen}
        return arm, seen, windows

    full_arm, full, full_windows = run(False)
    half_arm, half, half_windows = run(True)
    assert len(half) < len(full)
    assert half_windows == full_windows  # every split had its first turn
    expected = set()
    for order, ms, _ in half_arm.polisher._split_shapes(pair, 24):
        for off in half_arm.polisher._split_offsets(ms, 24):
            at = {t: ((off + sum(ms[:i])) % 24, ms[i]) for i, t in enumerate(order)}
            expected.add(tuple(at[t] for t in pair))
    assert full_windows == expected
    for arm, seen in ((full_arm, full), (half_arm, half)):
        assert 0.5 * len(seen) <= arm.polisher.split_cost(pair) <= 2 * len(seen)


def test_screened_splits_price_every_split_then_turn_only_the_best_priced():
    """``split_screen``: every split of every task set is priced as built before any turn;
    then per task set only the ``split_screen`` best-priced splits take turns, the task sets in
    order of their best-priced split; fewer evaluations than turning every split, and the
    count the final phase plans with follows the measured one."""
    wl = workload_preset("qwen3-8b-ppo-sync")
    cluster = cluster_preset("hetero24-two-region")
    model = CostModel(wl, cluster)
    tasks = tuple(wl.task_names)
    ev = Evaluator(wl, cluster, Budget(evaluations=10**6), model=model)

    def run(screen: int):
        arm = Arm((tasks,), (24,), model, DeviceFacts.of(model), np.random.default_rng(0),
                  options=SHAOptions(polish=PolishOptions(split_screen=screen,
                                                          window_screen=0)))
        seen = []
        base = arm.seeded_genotype()
        p = arm.polisher

        def trial(g, f):
            seen.append((f, g))
        if screen:
            for _ in p._screened_splits(ev, base, trial):
                pass
        else:  # every split turns
            for t in p._splits():
                b = p._split_base(base, t)
                for _ in p._split(ev, t, list(p._split_runs(t, 24, b)), b, trial):
                    pass
        return arm, seen, base

    arm, seen, base = run(4)
    sets = arm.polisher._splits()
    built = [list(arm.polisher._split_runs(t, 24, arm.polisher._split_base(base, t)))
             for t in sets]
    count = sum(len(runs) for runs in built)
    # first, every split as built, in the task sets' order
    assert [g for _, g in seen[:count]] == [r.genotype for runs in built for r in runs]
    # then the turns: the first task set to turn is the one with the best-priced split
    best = min(range(len(sets)), key=lambda i: min(f for f, _ in seen[
        sum(len(r) for r in built[:i]):sum(len(r) for r in built[:i + 1])]))
    first_turn = seen[count][1]
    assert any(first_turn.with_layout(t, r.genotype.layout(t)) == r.genotype
               for r in built[best] for t in sets[best])
    _, unscreened, _ = run(0)
    assert len(seen) < len(unscreened)
    assert 0.5 * len(seen) <= sum(arm.polisher.split_cost(t) for t in sets) <= 2 * len(seen)


def test_type_windows_hold_each_gpu_type_and_all_but_one_and_are_screened_with_the_splits():
    """``window_screen``: on a type-blocked group, a task's type windows are each GPU type's
    block and its complement; after the splits, each task alone is priced once on each window
    (a first guess), and only the ``window_screen`` best-priced windows of a task turn over its
    layouts there; the count the final phase plans with is of the same order."""
    wl = workload_preset("qwen3-8b-ppo-sync")
    cluster = cluster_preset("paper64-single-region")
    model = CostModel(wl, cluster)
    tasks = tuple(wl.task_names)
    ev = Evaluator(wl, cluster, Budget(evaluations=10**6), model=model)
    arm = Arm((tasks,), (64,), model, DeviceFacts.of(model), np.random.default_rng(0),
              options=SHAOptions(polish=PolishOptions(window_screen=2)))
    p = arm.polisher
    base = p.type_blocked(arm.seeded_genotype())
    gpu = [p.space.facts.gpu[d] for d in base.order]
    blocks: list[list[int]] = []  # [start, size] of each type's block
    for i, t in enumerate(gpu):
        if i == 0 or t != gpu[i - 1]:
            blocks.append([i, 0])
        blocks[-1][1] += 1
    assert len(blocks) == len(set(gpu)) >= 2  # one block per type
    expected = set()
    for start, size in blocks:
        expected |= {(start, size), ((start + size) % 64, 64 - size)}
    windows = p.type_windows(base, 0)
    assert set(windows) == {w for w in expected if p.space.aligned(w[1], 64)}
    for off, m in windows:  # a window holds one type, or every type but one
        kinds = {gpu[(off + k) % 64] for k in range(m)}
        assert len(kinds) in (1, len(set(gpu)) - 1)

    seen = []
    for _ in p._screened_splits(ev, base, lambda g, f: seen.append(g)):
        pass
    runs = {t: list(p.window_runs(t, base)) for t in tasks}
    count = sum(len(r) for r in runs.values())
    assert count == sum(1 for t in tasks for _, m in windows if p.space.sub_by_used[t].get(m))
    splits = sum(len(list(p._split_runs(s, 64, p._split_base(base, s)))) for s in p._splits())
    # every split, then every window run, priced as built
    assert seen[splits:splits + count] == [r.genotype for t in tasks for r in runs[t]]
    # a task alone turns over its layouts on at most two of its windows
    turned = []
    for t in tasks:
        moved = {(g.offset(t), g.layout(t)) for g in seen[splits + count:]
                 if all(g.layout(u) == base.layout(u) and g.offset(u) == base.offset(u)
                        for u in tasks if u != t)}
        turned.append({off for off, lay in moved
                       if (off, lay[0] * lay[1] * lay[2]) in windows})
    assert all(len(on) <= 2 for on in turned) and any(turned)
    cost = p.window_cost()
    moves = count + sum(2 * max(map(len, p.space.sub_by_used[t].values())) for t in tasks)
    assert 0.5 * moves <= cost <= 2 * moves


def test_a_plan_merged_into_one_group_keeps_its_placements_and_its_price(small_workload,
                                                                         small_cluster):
    """The carry into the co-located arm (``carry_best``): a two-group genotype as one group
    of all the GPUs decodes to the same placements and the cost model prices it the same; a
    task whose window wraps round its group's end cannot be merged."""
    from hetrl.search.genome import merged

    model = CostModel(small_workload, small_cluster)
    facts = DeviceFacts.of(model)
    tasks = tuple(small_workload.task_names)
    groups = (tasks[:1], tasks[1:])
    arm = Arm(groups, (4, 4), model, facts, np.random.default_rng(0))
    ev = Evaluator(small_workload, small_cluster, Budget(evaluations=10**6))
    whole = Arm((tasks,), (8,), model, facts, np.random.default_rng(1))
    for seed in range(6):
        arm.rng = np.random.default_rng(seed)
        g = arm.random_genotype()
        h = merged(g, tasks, 8)
        assert h is not None and h.sizes == (8,) and h.groups == (tasks,)
        a, b = decode(g, model), decode(h, model)
        assert a.placements == b.placements
        assert model.estimate(b).iteration_s == model.estimate(a).iteration_s
        whole.take(ev, h)
        assert min(f for f, _ in whole.population) <= model.estimate(a).iteration_s
    assert merged(g, tasks, 7) is None  # fewer GPUs than the groups hold


def test_a_wrapping_window_is_merged_by_turning_its_group(small_workload, small_cluster):
    """A window that wraps round its group's end is merged by turning (rotating) the group's
    slice first, so every task stays on the same GPUs in the same order: the same placements
    and price. Only windows that no turn unwraps together (on 4 GPUs, two of 3 starting at
    GPUs 0 and 2) cannot be merged."""
    from hetrl.search.genome import _unwrapping_turn, merged

    model = CostModel(small_workload, small_cluster)
    facts = DeviceFacts.of(model)
    tasks = tuple(small_workload.task_names)
    arm = Arm((tasks[:1], tasks[1:]), (4, 4), model, facts, np.random.default_rng(0))
    for seed in range(4):
        arm.rng = np.random.default_rng(seed)
        g = arm.random_genotype()
        # the second group's tasks on two GPUs each: the first from the group's last GPU
        # (wrapping round), the others from its second (a turn by one GPU unwraps them all)
        for t in tasks[1:]:
            g = g.with_layout(t, (2, 1, 1)).with_offset(t, 3 if t == tasks[1] else 1)
        h = merged(g, tasks, 8)
        assert h is not None and h.order != g.order and sorted(h.order) == sorted(g.order)
        assert h.offset(tasks[1]) == 4 + 2 and h.offset(tasks[2]) == 4 + 0
        a, b = decode(g, model), decode(h, model)
        assert a.placements == b.placements
        assert model.estimate(b).iteration_s == model.estimate(a).iteration_s
    assert _unwrapping_turn([(2, 2), (1, 4)], 4) == 1  # the full window must start the slice
    assert _unwrapping_turn([(0, 2), (2, 2)], 4) == 0  # nothing wraps: no turn
    assert _unwrapping_turn([(3, 2), (1, 2)], 4) == 1  # turned by 1: (2, 2) and (0, 2)
    assert _unwrapping_turn([(0, 3), (2, 3)], 4) is None


def test_the_final_phase_starts_the_colocated_arm_from_the_best_plan_so_far(small_workload,
                                                                           small_cluster):
    """``carry_best``: before the final phase the co-located arm on all GPUs takes the best plan
    any arm holds (merged into one group), once; the search stays deterministic."""
    from hetrl.search.rounds import Level1
    from hetrl.search.sha import _SHABase

    model = CostModel(small_workload, small_cluster)
    facts = DeviceFacts.of(model)
    tasks = tuple(small_workload.task_names)
    ev = Evaluator(small_workload, small_cluster, Budget(evaluations=10**6))
    split = Arm((tasks[:1], tasks[1:]), (4, 4), model, facts, np.random.default_rng(0))
    whole = Arm((tasks,), (8,), model, facts, np.random.default_rng(1))
    split.run(ev, 8)
    whole.population = [(math.inf, whole.random_genotype())]  # nothing feasible of its own
    level1 = [Level1((tasks,), [whole], True), Level1(split.groups, [split], True)]
    _SHABase._carry_best(ev, level1, [whole], 8, 10**6)
    assert whole.best == split.best and len(whole.population) == 2
    _SHABase._carry_best(ev, level1, [whole], 8, 10**6)  # no better plan: nothing taken
    assert len(whole.population) == 2
    budget = Budget(evaluations=800, seed=0)
    a = get_scheduler("hetrl").search(small_workload, small_cluster, budget)
    assert a.plan == get_scheduler("hetrl").search(small_workload, small_cluster, budget).plan


def test_the_carried_plan_is_the_best_one_the_colocated_arm_can_hold(small_workload,
                                                                     small_cluster):
    """A best plan with a window wrapping round its group's end cannot be merged into one
    group: the next best is carried instead (not nothing, which left the co-located arm on
    random-1024 with an infeasible best). With a hopeless polish on all GPUs (a pass costing
    more than ten times the budget), the co-located arm on part of them gets the plan too."""
    from hetrl.search.genome import merged
    from hetrl.search.rounds import Level1
    from hetrl.search.sha import _hopeless, _SHABase

    model = CostModel(small_workload, small_cluster)
    facts = DeviceFacts.of(model)
    tasks = tuple(small_workload.task_names)
    ev = Evaluator(small_workload, small_cluster, Budget(evaluations=10**6))
    split = Arm((tasks[:1], tasks[1:]), (2, 4), model, facts, np.random.default_rng(0))
    ok = next(g for g in (split.random_genotype() for _ in range(50))
              if merged(g, tasks, 6) is not None
              and g.layout(tasks[1])[0] * g.layout(tasks[1])[1] * g.layout(tasks[1])[2] > 1)
    # windows that no turn of their group unwraps: a full-group window from GPU 1 (only a turn
    # by one GPU unwraps it) beside one of ``tasks[1]`` from GPU 0 (which that turn wraps)
    full = next(lay for lay in split.layout_options[tasks[2]] if math.prod(lay[:3]) == 4)
    wraps = ok.with_offset(tasks[1], 0).with_layout(tasks[2], full).with_offset(tasks[2], 1)
    assert merged(wraps, tasks, 8) is None
    split.population = [(1.0, wraps), (2.0, ok)]
    whole = Arm((tasks,), (8,), model, facts, np.random.default_rng(1))
    part = Arm((tasks,), (6,), model, facts, np.random.default_rng(2))
    for arm in (whole, part):
        arm.population = [(math.inf, arm.random_genotype())]
    level1 = [Level1((tasks,), [whole, part], True), Level1(split.groups, [split], True)]
    _SHABase._carry_best(ev, level1, [whole, part], 8, 10**6)
    assert [g for _, g in whole.population][-1] == merged(ok, tasks, 8)
    assert len(part.population) == 1  # a polish that can finish a pass: the part arm keeps its own
    assert _hopeless(whole, 1) and not _hopeless(whole, 10**6)
    _SHABase._carry_best(ev, level1, [whole, part], 8, 1)
    assert [g for _, g in part.population][-1] == merged(ok, tasks, 6)


def test_the_inner_halving_keeps_to_its_share(small_workload, small_cluster):
    """A grouping holding more arms than its share gives one step each per round (warm starts'
    arms: 161 in one grouping on random-1024) enters only its best-priced ones: the round
    spends its share (plus rounding), not a step per arm per round, which on random-1024 took
    the evaluations of every other grouping's job in the round."""
    from hetrl.search.rounds import affordable, halving_round, job_cap

    assert affordable(10, 6, 1) == 2 and affordable(10, 1000, 1) == 10
    assert affordable(10, 6, 16, least=2) == 2 and affordable(1, 0, 1) == 1
    model = CostModel(small_workload, small_cluster)
    facts = DeviceFacts.of(model)
    tasks = tuple(small_workload.task_names)
    ev = Evaluator(small_workload, small_cluster, Budget(evaluations=10**6))
    arms = [Arm((tasks,), (8,), model, facts, np.random.default_rng(i)) for i in range(40)]
    for arm in arms:
        arm.run(ev, 1)
    best_two = sorted(arms, key=lambda a: a.best)[:2]
    before = ev.evaluations
    survivors = halving_round(arms, 6, ev, halve=True)
    assert ev.evaluations - before <= job_cap(arms, 6, True) < len(arms)
    assert len(survivors) == 1 and survivors[0] in best_two
    before = ev.evaluations  # the ablation without halving: every arm its step
    halving_round(arms, 6, ev, halve=False)
    assert ev.evaluations - before == len(arms)


def test_a_pooled_search_finds_the_serial_searchs_plan(small_workload, small_cluster):
    """The rounds' jobs run on a process pool with ``Budget.workers`` > 1 (hetrl/search/rounds.py):
    each job's evaluation cap is fixed before any runs, so the pool changes where the jobs run,
    not what they find."""
    serial = get_scheduler("hetrl").search(small_workload, small_cluster,
                                           Budget(evaluations=1500, seed=3, workers=1))
    pooled = get_scheduler("hetrl").search(small_workload, small_cluster,
                                           Budget(evaluations=1500, seed=3, workers=2))
    assert pooled.plan == serial.plan
    assert pooled.evaluations == serial.evaluations == 1500
