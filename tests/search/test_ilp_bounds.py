"""The phased ILP's pairwise bounds and local search, checked against enumeration.

``Pairwise.bounds`` claims, for each sharing pattern and each candidate i of a task t, a lower
bound LB(t = i) on the pattern model's objective over every plan that uses i: every plan
(one candidate per task) that fits in memory and keeps the pattern's "apart" pairs on disjoint
devices, scored as the pattern scores it (each stage its heaviest clique of the pattern's
sharing graph, actor training + the weight sync at least). The enumeration below scores every
such plan of small candidate lists and checks the claim for every candidate of every task.
``Descent`` claims its best responses are the exact objective of the plan with one task
switched; checked against ``phased_objective_ms``.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from hetrl.cost.model import CostModel
from hetrl.search.ilp import (
    candidates,
    phased_objective_ms,
    prune_dominated,
    stages_of,
    sync_ms,
)
from hetrl.search.ilp.local import Descent, local_search
from hetrl.search.ilp.model import fits
from hetrl.search.ilp.pairwise import Pairwise
from hetrl.search.ilp.phased import _pairs, _stage_cliques, pattern_objective_ms
from tests.search.test_ilp import tiny_cluster, tiny_ppo, tiny_workload


def _sample(cands, per_task: int, seed: int):
    """``per_task`` candidates of each task: the two needing least memory (so that plans fit
    on these small GPUs) and others drawn at random."""
    rng = np.random.default_rng(seed)
    out = {}
    for t, cs in cands.items():
        light = sorted(range(len(cs)), key=lambda i: cs[i].need.max())[:2]
        rest = [i for i in range(len(cs)) if i not in light]
        out[t] = [cs[i] for i in sorted(light + list(rng.choice(rest, per_task - 2,
                                                                replace=False)))]
    return out


@pytest.mark.parametrize(("workload", "per_task"), [(tiny_workload, 8), (tiny_ppo, 5)])
def test_pairwise_bounds_never_exceed_a_plans_value(workload, per_task):
    wl, cl = workload(), tiny_cluster(True)
    model = CostModel(wl, cl)
    cands = _sample(candidates(model), per_task, seed=1)
    stages = stages_of(wl)
    pairs = _pairs(stages)
    pw = Pairwise(model, cands)
    keep = {t: np.arange(len(cs)) for t, cs in cands.items()}
    plans = [combo for combo in itertools.product(*(range(len(cs)) for cs in cands.values()))
             if fits(model, {t: cands[t][i] for t, i in zip(cands, combo, strict=True)})]
    checked = 0
    for shared in itertools.product((True, False), repeat=len(pairs)):
        cliques = _stage_cliques(stages, pairs, shared)
        apart = {(a, b) for (_, a, b), on in zip(pairs, shared, strict=True) if not on}
        apart |= {(b, a) for a, b in apart}
        lb = {t: pw.bounds(t, keep, stages, cliques, apart) for t in cands}
        for combo in plans:
            chosen = {t: cands[t][i] for t, i in zip(cands, combo, strict=True)}
            if any(set(chosen[a].devices) & set(chosen[b].devices) for a, b in apart):
                continue
            value = pattern_objective_ms(model, chosen, stages, pairs, shared)
            for t, i in zip(cands, combo, strict=True):
                assert lb[t][i] <= value, (shared, t, i)
            checked += 1
    assert checked > 100  # the enumeration really scored plans


def test_disjoint_sets_by_node_transform_equal_the_direct_check():
    """The least value over candidates on disjoint devices, by the per-node transform and by
    comparing every pair of device sets."""
    wl, cl = tiny_ppo(), tiny_cluster(True)
    model = CostModel(wl, cl)
    cands = candidates(model)
    pw = Pairwise(model, cands)
    assert pw._flat is not None
    rows = np.arange(len(cands["reward_inference"]))
    cols = np.arange(len(cands["critic_inference"]))
    values = pw.ms["critic_inference"]
    by_nodes = pw._least_apart("reward_inference", rows, "critic_inference", cols, values)
    pw._flat = None
    direct = pw._least_apart("reward_inference", rows, "critic_inference", cols, values)
    assert np.array_equal(by_nodes, direct)
    assert (direct < np.iinfo(np.int64).max // 4).any()


def test_memory_compatibility_is_the_per_device_sum():
    wl, cl = tiny_ppo(), tiny_cluster(True)
    model = CostModel(wl, cl)
    cands = candidates(model)
    pw = Pairwise(model, cands)
    a, b = "actor_training", "critic_training"
    rows, cols = np.arange(len(cands[a])), np.arange(len(cands[b]))
    fit = pw._fits(a, rows, b, cols)
    want = np.array([[fits(model, {a: x, b: y}) for y in cands[b]] for x in cands[a]])
    assert np.array_equal(fit, want)
    assert not want.all() and want.any()
    assert np.array_equal(pw._fits(b, cols, a, rows), want.T)  # the memo, the other way round


@pytest.mark.parametrize("workload", [tiny_workload, tiny_ppo])
def test_best_responses_are_the_objective_of_the_switched_plan(workload):
    wl, cl = workload(), tiny_cluster(True)
    model = CostModel(wl, cl)
    cands = prune_dominated(candidates(model))
    stages = stages_of(wl)
    descent = Descent(Pairwise(model, cands), stages)
    rng = np.random.default_rng(0)
    start = {t: 0 for t in cands}
    for t in cands:  # a plan that fits: the cheapest memory first
        start[t] = int(np.argmin([c.need.max() for c in cands[t]]))
    assert fits(model, {t: cands[t][i] for t, i in start.items()})
    ch = dict(start)
    for _ in range(4):
        for t in cands:
            r = descent.responses(ch, t)
            for i in rng.choice(len(cands[t]), size=6, replace=False):
                switched = {u: cands[u][ch[u]] for u in cands} | {t: cands[t][int(i)]}
                if fits(model, switched):
                    assert r[i] == phased_objective_ms(model, switched, stages)
                else:
                    assert r[i] == np.iinfo(np.int64).max
            ch[t] = int(np.argmin(r))  # move on to a best response
    assert descent.value(ch) == phased_objective_ms(
        model, {t: cands[t][i] for t, i in ch.items()}, stages)


def test_local_search_is_seeded_and_never_worse_than_its_start():
    wl, cl = tiny_ppo(), tiny_cluster(True)
    model = CostModel(wl, cl)
    cands = prune_dominated(candidates(model))
    stages = stages_of(wl)
    pw = Pairwise(model, cands)
    start = {t: min(cs, key=lambda c: c.need.max()) for t, cs in cands.items()}
    first, value = local_search(pw, stages, start, kicks=10, seed=3)
    again, value2 = local_search(pw, stages, start, kicks=10, seed=3)
    assert first == again and value == value2
    assert value == phased_objective_ms(model, first, stages)
    assert value <= phased_objective_ms(model, start, stages)
    assert fits(model, first)


def test_weight_sync_table_equals_sync_ms():
    wl, cl = tiny_ppo(), tiny_cluster(True)
    model = CostModel(wl, cl)
    cands = candidates(model)
    pw = Pairwise(model, cands)
    gens, trains = cands["actor_generation"], cands["actor_training"]
    table = pw.sync(np.arange(len(gens)), np.arange(len(trains)))
    want = np.array([[sync_ms(model, g, a) for a in trains] for g in gens])
    assert np.array_equal(table, want)
    assert (want == 0).any() and (want > 0).any()  # shared in place, and pulled
