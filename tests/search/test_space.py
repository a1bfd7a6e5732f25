"""The five-level search space: Bell numbers, canonical task groupings, layouts, level sizes."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from hetrl.search.space import (
    MAX_PP,
    MAX_TP,
    bell,
    device_classes,
    layouts,
    set_partitions,
    space_size,
    task_groupings,
)
from hetrl.spec.model import model_presets
from hetrl.spec.presets import cluster_preset, workload_preset

#: Stirling numbers of the second kind S(6, k), k = 1..6: partitions of 6 tasks into k groups.
STIRLING6 = {1: 1, 2: 31, 3: 90, 4: 65, 5: 15, 6: 1}


def test_bell_numbers_by_hand():
    assert [bell(n) for n in range(8)] == [1, 1, 2, 5, 15, 52, 203, 877]
    assert bell(6) == 203 and bell(4) == 15
    assert sum(STIRLING6.values()) == 203


def test_set_partitions_counts_match_bell():
    for n in range(1, 7):
        parts = list(set_partitions([str(i) for i in range(n)]))
        assert len(parts) == bell(n)
        assert len({frozenset(frozenset(g) for g in p) for p in parts}) == bell(n)


def _check_partitions(groupings, tasks):
    order = {t: i for i, t in enumerate(tasks)}
    for p in groupings:
        flat = [t for g in p for t in g]
        assert sorted(flat) == sorted(tasks)  # every task exactly once
        assert all(g for g in p)
        for g in p:  # canonical: tasks in workflow order, groups by their first task
            assert list(g) == sorted(g, key=order.get)
        assert [order[g[0]] for g in p] == sorted(order[g[0]] for g in p)
    assert len(set(groupings)) == len(groupings)


def test_task_groupings_ppo(ppo8b):
    groupings = task_groupings(ppo8b)
    assert len(groupings) == 203
    _check_partitions(groupings, ppo8b.task_names)
    by_size = {k: sum(1 for p in groupings if len(p) == k) for k in range(1, 7)}
    assert by_size == STIRLING6
    assert groupings[0] == (ppo8b.task_names,)  # everything co-located comes first
    assert groupings[-1] == tuple((t,) for t in ppo8b.task_names)


def test_task_groupings_grpo(grpo4b):
    groupings = task_groupings(grpo4b)
    assert len(groupings) == 15
    assert len(grpo4b.task_names) == 4
    _check_partitions(groupings, grpo4b.task_names)
    assert {k: sum(1 for p in groupings if len(p) == k) for k in range(1, 5)} == {
        1: 1, 2: 7, 3: 6, 4: 1}


def test_layouts_qwen3_8b_on_64_by_hand():
    """Qwen3-8B (32 heads, 8 KV heads, 36 layers) on 64 GPUs: tp in {1, 2, 4, 8}; pp up to 16
    for tp <= 4 (every floor split uses > 32 GPUs) and up to 8 for tp = 8: 16 + 16 + 16 + 8."""
    shape = model_presets()["Qwen3-8B"]
    lays = layouts(shape, 64)
    assert len(lays) == 56
    assert (64, 1, 1) in lays and (1, 8, 8) in lays and (1, 16, 4) in lays
    assert (5, 11, 1) in lays  # 55 of 64 GPUs used
    assert (1, 9, 8) not in lays  # 72 > 64
    assert {tp for _, _, tp in lays} == {1, 2, 4, 8}


def test_layouts_small_group_by_hand():
    shape = model_presets()["Qwen3-8B"]
    # n = 3: tp 1 with pp 1, 2, 3 (dp = 3 // pp), and tp 2 using 2 > 1.5 of the 3 GPUs.
    assert set(layouts(shape, 3)) == {(3, 1, 1), (1, 2, 1), (1, 3, 1), (1, 1, 2)}
    assert set(layouts(shape, 1)) == {(1, 1, 1)}
    # Qwen2.5-7B has 28 heads: tp 8 does not divide them.
    assert {tp for _, _, tp in layouts(model_presets()["Qwen2.5-7B"], 64)} == {1, 2, 4}


@given(st.sampled_from(sorted(model_presets())), st.integers(min_value=1, max_value=130))
def test_layouts_respect_limits(name, n):
    shape = model_presets()[name]
    lays = layouts(shape, n)
    assert lays, "every group size has at least the (n, 1, 1) layout"
    assert len(set(lays)) == len(lays)
    for dp, pp, tp in lays:
        assert shape.heads % tp == 0
        assert shape.kv_heads % tp == 0 or tp % shape.kv_heads == 0
        assert tp <= MAX_TP and tp & (tp - 1) == 0
        assert 1 <= pp <= min(shape.layers, MAX_PP)
        assert n / 2 < dp * pp * tp <= n
        assert dp == n // (pp * tp)


def test_space_size_paper64_by_hand(ppo8b):
    cluster = cluster_preset("paper64-multi-country")
    size = space_size(ppo8b, cluster)
    assert size["tasks"] == 6 and size["devices"] == 64
    assert size["level1_task_groupings"] == 203 and size["bell_number"] == 203
    # Level 2: sum over groupings of C(63, G - 1); with S(6, k) groupings of k groups:
    # 1*1 + 31*63 + 90*1953 + 65*39711 + 15*595665 + 1*7028847.
    assert math.comb(63, 2) == 1953 and math.comb(63, 3) == 39711
    assert math.comb(63, 4) == 595665 and math.comb(63, 5) == 7028847
    by_hand = 1 + 31 * 63 + 90 * 1953 + 65 * 39711 + 15 * 595665 + 7028847
    assert by_hand == 18_722_761
    assert size["level2_gpu_groupings"] == by_hand
    # Level 3, largest at 6 groups (sizes 11, 11, 11, 11, 10, 10): 64! / (11!^4 10!^2).
    raw = math.factorial(64) // (math.factorial(11) ** 4 * math.factorial(10) ** 2)
    assert math.isclose(size["log10_level3_gpu_sets"], math.log10(raw), rel_tol=1e-9)
    # With symmetry: 8 nodes of 8 interchangeable GPUs, each split over 6 groups: C(13, 5)^8.
    assert len(device_classes(cluster)) == 8
    assert math.isclose(size["log10_level3_gpu_sets_symmetric"], 8 * math.log10(math.comb(13, 5)))
    # Level 4: 56 layouts per task (see test_layouts_qwen3_8b_on_64_by_hand), six tasks (the
    # preset searches Megatron layouts only, the paper's space); with fsdp among the workload's
    # backends the five training and inference tasks also have the FSDP variants of (64, 1, 1),
    # with and without offload: 58.
    assert math.isclose(size["log10_level4_layouts"], 6 * math.log10(56))
    fsdp = space_size(ppo8b.with_(backends=("megatron", "fsdp")), cluster)
    assert math.isclose(fsdp["log10_level4_layouts"], math.log10(56) + 5 * math.log10(58))
    assert math.isclose(size["log10_level5_tasklet_maps"], 6 * math.log10(math.factorial(64)))
    total = (math.log10(by_hand) + size["log10_level3_gpu_sets"] + size["log10_level4_layouts"]
             + size["log10_level5_tasklet_maps"])
    assert math.isclose(size["log10_total"], total)


def test_space_size_grpo_small(grpo4b):
    cluster = cluster_preset("hetero16-two-region")
    size = space_size(grpo4b, cluster)
    # GRPO: groupings of 4 tasks by group count 1, 7, 6, 1 -> sum of C(15, G - 1).
    assert size["level2_gpu_groupings"] == 1 + 7 * 15 + 6 * 105 + 1 * 455
    assert size["level1_task_groupings"] == 15


def test_decoding_moves_actor_inference_onto_the_trainers_gpus():
    """A genotype may put actor_inference on GPUs of its group that actor_training does not use
    (an offset, a part-of-group layout): decoding moves it onto the trainer's GPUs -- its own
    layout where it fits, else the trainer's -- so every decoded plan validates."""
    from hetrl.cost.model import CostModel
    from hetrl.plan import validate
    from hetrl.search.genome import Genotype, decode

    wl = workload_preset("qwen3-4b-grpo-sync").with_(recompute_logprobs=True)
    cl = cluster_preset("a100x8")
    model = CostModel(wl, cl)
    lay = {t: (8, 1, 1) for t in wl.task_names}
    lay.update(actor_training=(4, 1, 1), actor_inference=(2, 1, 1))
    g = Genotype((wl.task_names,), (8,), tuple(range(8)), tuple(lay.items()),
                 offsets=(("actor_inference", 6),))
    plan = decode(g, model)
    validate(plan, wl, cl)
    ai, at = plan.placement("actor_inference"), plan.placement("actor_training")
    assert (ai.dp, ai.pp, ai.tp) == (2, 1, 1) and set(ai.device_ids) <= set(at.device_ids)
    big = decode(Genotype(g.groups, g.sizes, g.order, tuple({**lay, "actor_inference": (8, 1, 1)}
                                                             .items())), model)
    validate(big, wl, cl)
    assert big.placement("actor_inference").dp == 4  # the trainer's layout: 4 of 8 GPUs
