"""Micro-batches by token budget and padding (hetrl/cost/batching.py), checked against closed
forms and brute force.

Hardware and model as tests/cost/test_tasks.py: A100-80GB (312e12 FLOP/s, train_flops 0.4,
infer_flops 0.5: tests/hand_params.py), Qwen3-8B (MATMUL dense FLOPs per token with the LM head, ATTN attention FLOPs per
token per context token). Lengths: a fixed 256-token prompt and a response uniform over 1..1024
tokens, so the longest of k sequences is 256 + the longest of k uniform draws, whose mean is
1024 - sum_{s=1}^{1023} (s / 1024)^k (P(max <= s) = (s / 1024)^k).
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetrl.cost.batching import (
    Batching,
    longest_moments,
    memory_tokens,
    micro_batching,
    micro_count,
)
from hetrl.cost.flops import stage_shapes
from hetrl.cost.lengths import length_stats
from hetrl.cost.memory import task_memory_bytes
from hetrl.cost.model import CostModel
from hetrl.cost.replica import replica_hw
from hetrl.cost.tasks import forward_engine
from hetrl.errors import SpecError
from hetrl.plan import colocated_plan
from hetrl.spec.lengths import LengthDist
from hetrl.spec.model import model_preset
from hetrl.spec.presets import WORKLOAD_PRESETS, workload_preset
from hetrl.spec.workload import WorkloadSpec
from tests.cost.plans import random_plans
from tests.cost.test_tasks import ATTN, MATMUL, PEAK
from tests.hand_params import HAND_PARAMS

PROMPT = 256
N = 1024  # responses uniform over 1..N


def wide(**kw) -> WorkloadSpec:
    q8 = model_preset("Qwen3-8B")
    base = dict(name="wide", algorithm="grpo", mode="sync",
                models=(("actor", q8), ("reference", q8), ("reward", q8)),
                batch_prompts=4, responses_per_prompt=4, prompt_length=LengthDist.fixed(PROMPT),
                response_length=LengthDist(mean=(1 + N) / 2, max=N, min=1, kind="uniform"))
    return WorkloadSpec(**{**base, **kw})


def uniform_max_moments(k: int) -> tuple[float, float]:
    """E[256 + max of k uniform 1..N] and E[(256 + max)^2], summed directly."""
    cdf = [(s / N) ** k for s in range(N + 1)]
    pmf = [cdf[s] - cdf[s - 1] for s in range(1, N + 1)]
    mean = sum((PROMPT + s) * p for s, p in zip(range(1, N + 1), pmf, strict=True))
    sq = sum((PROMPT + s) ** 2 * p for s, p in zip(range(1, N + 1), pmf, strict=True))
    return mean, sq


def test_the_paper_presets_keep_todays_meaning():
    """Today's formulas price a micro-batch's mean real tokens, E[S] per sequence and E[S^2] for
    attention: that is remove_padding = true by count, so every preset is unchanged."""
    for name in WORKLOAD_PRESETS:
        wl = workload_preset(name)
        assert wl.remove_padding and wl.micro_batch_tokens is None
        assert micro_batching(wl, "training") == wl.micro_batch_size
        assert micro_batching(wl, "inference") == wl.inference_micro_batch_size


def test_longest_moments_small_cases_by_hand_and_by_brute_force():
    # S = 1 + R, R uniform on {1, 2}: the longest of two is 2 with probability 1/4.
    two = LengthDist(mean=1.5, max=2, min=1, kind="uniform")
    assert longest_moments(LengthDist.fixed(1), two, 1, 2) == pytest.approx((2.75, 7.75), abs=1e-12)
    # Prompts uniform on 1..3, responses on 1..4, groups of 2 responses sharing a prompt: four
    # adjacent sequences are two groups, two adjacent sequences one group (one prompt).
    p = LengthDist(mean=2, max=3, min=1, kind="uniform")
    r = LengthDist(mean=2.5, max=4, min=1, kind="uniform")
    for k in (2, 4):
        total = total_sq = count = 0
        for prompts in itertools.product((1, 2, 3), repeat=k // 2):
            for resp in itertools.product((1, 2, 3, 4), repeat=k):
                m = max(prompts[i // 2] + resp[i] for i in range(k))
                total, total_sq, count = total + m, total_sq + m * m, count + 1
        assert longest_moments(p, r, 2, k) == pytest.approx((total / count, total_sq / count),
                                                            rel=1e-12)


def test_padding_a_wide_distribution_costs_the_longest_over_the_mean(a100x8):
    """Training 16 sequences in micro-batches of 8 on one GPU (compute-bound): with padding
    removed a micro-batch costs 3 x (8 E[S] MATMUL + ATTN 8 E[S^2] / 2) FLOPs; padded to its
    longest, E[S] and E[S^2] become E[M_8] and E[M_8^2] -- 1.53x here; padded to the longest
    possible (256 + 1024), 1.68x."""
    hw = replica_hw(a100x8, ((0,),))
    shapes = stage_shapes(model_preset("Qwen3-8B"), (36,), 1, True, 2)
    es = PROMPT + (1 + N) / 2  # 768.5
    es2 = PROMPT**2 + 2 * PROMPT * (1 + N) / 2 + (N + 1) * (2 * N + 1) / 6
    em, em2 = uniform_max_moments(8)
    assert em == pytest.approx(PROMPT + N * 8 / 9, rel=1e-3)  # ~ 256 + 8/9 of 1024

    def seconds(**kw):
        wl = wide(micro_batch_size=8, **kw)
        engine = forward_engine("training", shapes, hw, length_stats(wl), HAND_PARAMS,
                                micro_batching(wl, "training"), False)
        return engine.replica(16).seconds

    def flops(mean, sq):
        return 2 * 3 * (8 * mean * MATMUL + ATTN * 8 * sq / 2) / (PEAK * 0.4)

    packed, longest, static = (seconds(), seconds(remove_padding=False),
                               seconds(remove_padding=False, pad_to="max"))
    assert packed == pytest.approx(flops(es, es2), rel=1e-12)
    assert longest == pytest.approx(flops(em, em2), rel=1e-9)
    assert static == pytest.approx(flops(1280, 1280**2), rel=1e-12)
    assert longest / packed == pytest.approx(1.527, abs=1e-3)
    assert static / packed == pytest.approx(1.678, abs=1e-3)
    # fixed lengths: nothing to pad
    fixed = wide(remove_padding=False).with_(response_length=LengthDist.fixed(512))
    b = micro_batching(fixed, "training")
    assert isinstance(b, Batching)
    assert longest_moments(b.prompt, b.response, b.group, 8) == pytest.approx((768, 768**2))


def test_a_token_budget_gives_ceil_tokens_over_budget_micro_batches(a100x8):
    """16 sequences of 512 tokens (T = 8192) on a 2-stage pipeline: a budget of 2048 tokens is
    4 micro-batches, exactly as micro-batches of 4 sequences; 3000 tokens is ceil(8192 / 3000) =
    3 micro-batches of 16 / 3 sequences, as micro-batches of 6 (ceil(16 / 6) = 3); 1F1B takes
    (m + pp - 1) slots, of which pp - 1 are the bubble."""
    fixed = wide().with_(response_length=LengthDist.fixed(256))
    L = length_stats(fixed)
    hw = replica_hw(a100x8, ((0,), (1,)))
    shapes = stage_shapes(model_preset("Qwen3-8B"), (18, 18), 1, True, 2)

    def replica(batching):
        return forward_engine("training", shapes, hw, L, HAND_PARAMS, batching,
                              False).replica(16)

    for budget, m, mbs in ((2048, 4, 4), (3000, 3, 6), (8192, 1, 16), (512, 16, 1)):
        b = micro_batching(fixed.with_(micro_batch_tokens=budget), "training")
        assert micro_count(16, b, L.seq_mean) == (m, 16 / m)
        by_tokens, by_count = replica(b), replica(mbs)
        assert by_tokens.seconds == by_count.seconds
        assert by_tokens.parts["bubble"] / by_tokens.seconds == pytest.approx(1 / (m + 1))
    # the slowest replica's excess tokens need more micro-batches: 8192 x 1.1 / 2048 -> 5
    b = micro_batching(fixed.with_(micro_batch_tokens=2048), "training")
    assert micro_count(16, b, L.seq_mean, load=1.1)[0] == 5
    # never more micro-batches than sequences
    assert micro_count(2, b, L.seq_mean, load=10.0)[0] == 2


def test_memory_follows_the_padded_tokens():
    """Activations and logits are linear in a micro-batch's tokens: padded to its longest they
    grow by E[M_8] / E[S]; a token budget holds a full budget of real tokens."""
    wl = wide(micro_batch_size=8)
    L = length_stats(wl)
    (s,) = stage_shapes(model_preset("Qwen3-8B"), (36,), 1, True, 2)
    args = (L, HAND_PARAMS, False)
    _, _, packed = task_memory_bytes("training", s, 0, 1, 1, 16, 8, *args)
    padded_b = micro_batching(wl.with_(remove_padding=False), "training")
    _, _, padded = task_memory_bytes("training", s, 0, 1, 1, 16, padded_b, *args)
    em, _ = uniform_max_moments(8)
    assert padded / packed == pytest.approx(em / L.seq_mean, rel=1e-9)
    budget = micro_batching(wl.with_(micro_batch_tokens=4096), "training")
    assert memory_tokens(16, budget, L) == (pytest.approx(4096), 4)  # 16 x 768.5 / 4096 -> 4
    _, _, by_budget = task_memory_bytes("training", s, 0, 1, 1, 16, budget, *args)
    assert by_budget / packed == pytest.approx(4096 / (8 * L.seq_mean), rel=1e-12)
    # a replica with fewer tokens than the budget holds them all
    assert memory_tokens(2, budget, L)[0] == pytest.approx(2 * L.seq_mean)


def test_the_cost_model_prices_padding_in_time_and_memory(a100x8):
    wl = wide(batch_prompts=16, micro_batch_size=8, inference_micro_batch_size=8)
    padded = wl.with_(remove_padding=False)
    plan = colocated_plan(wl, a100x8, tp=2, devices=[0, 1, 2, 3])
    a = CostModel(wl, a100x8, HAND_PARAMS).estimate(plan)
    b = CostModel(padded, a100x8, HAND_PARAMS).estimate(plan)
    for task in ("reference_inference", "reward_inference", "actor_training"):
        assert b.tasks[task] > 1.4 * a.tasks[task]
    assert b.tasks["actor_generation"] == a.tasks["actor_generation"]
    assert max(b.peak_memory_gb.values()) > max(a.peak_memory_gb.values())


@pytest.mark.parametrize(("change", "field", "problem"), [
    ({"micro_batch_tokens": 1000}, "micro_batch_tokens",
     "integer >= the longest sequence, prompt_length.max + response_length.max = 1280 tokens"),
    ({"inference_micro_batch_tokens": 4096.0}, "inference_micro_batch_tokens", "integer"),
    ({"micro_batch_tokens": True}, "micro_batch_tokens", "integer"),
    ({"remove_padding": "no"}, "remove_padding", "true or false"),
    ({"remove_padding": False, "pad_to": "batch"}, "pad_to", "['longest', 'max']"),
    ({"pad_to": "max"}, "pad_to", "only with remove_padding: false"),
])
def test_bad_batching_values_name_field_value_and_limit(change, field, problem):
    with pytest.raises(SpecError) as err:
        wide(**change)
    assert err.value.field == field and problem in str(err.value)
    assert f"{field} = {change[field]!r}" in str(err.value)  # the field and its value


def test_the_new_keys_round_trip_and_default_to_todays_meaning():
    wl = wide(micro_batch_tokens=4096, inference_micro_batch_tokens=8192, remove_padding=False,
              pad_to="max")
    d = wl.to_dict()
    assert d["schema_version"] == 2
    assert WorkloadSpec.from_dict(d) == wl and WorkloadSpec.from_dict(d).to_dict() == d
    for key in ("micro_batch_tokens", "inference_micro_batch_tokens", "remove_padding", "pad_to"):
        del d[key]
    old = WorkloadSpec.from_dict(d)
    assert (old.micro_batch_tokens, old.inference_micro_batch_tokens, old.remove_padding,
            old.pad_to) == (None, None, True, "longest")


@settings(max_examples=25)
@given(data=st.data())
def test_padding_never_makes_a_forward_task_cheaper(data, grpo4b, a100x8):
    """On random plans, each inference and training task costs at least as much padded to the
    micro-batch's longest as packed, and padded to the longest possible at least as much again;
    working memory follows the same order (generation is untouched)."""
    plan = data.draw(random_plans(grpo4b, a100x8))
    packed, longest, static = (
        CostModel(wl, a100x8, HAND_PARAMS).estimate(plan, check=False) for wl in (
            grpo4b, grpo4b.with_(remove_padding=False),
            grpo4b.with_(remove_padding=False, pad_to="max")))
    for task in grpo4b.task_names:
        if task == "actor_generation":
            assert longest.tasks[task] == packed.tasks[task] == static.tasks[task]
            continue
        assert packed.tasks[task] <= longest.tasks[task] * (1 + 1e-12)
        assert longest.tasks[task] <= static.tasks[task] * (1 + 1e-12)
    for d, gb in packed.peak_memory_gb.items():
        assert gb <= longest.peak_memory_gb[d] + 1e-9 <= static.peak_memory_gb[d] + 2e-9
