"""The cost model's mixture-of-experts and FP8 terms: a dense model written as one expert
estimates bit-identically, expert parallelism splits weights and adds its all-to-alls, decode reads
the experts a batch uses, and FP8 halves the rollout's bytes and needs FP8 units."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetrl.cost import CostModel
from hetrl.cost.expert_parallel import alltoall_pieces, dispatch_bytes
from hetrl.cost.flops import stage_shapes
from hetrl.cost.primitives import GroupLinks
from hetrl.errors import SpecError
from hetrl.plan import colocated_plan, validate
from hetrl.spec.cluster import ClusterSpec, NodeSpec
from hetrl.spec.model import model_preset
from hetrl.spec.moe import MoE
from hetrl.spec.presets import cluster_preset, workload_preset
from tests.cost.plans import random_plans
from tests.cost.test_properties import clusters, workloads

#: two nodes of 8 H100 in one region
H100X16 = ClusterSpec("h100x16", (NodeSpec("n0", "H100", 8, "us-east-1"),
                                  NodeSpec("n1", "H100", 8, "us-east-1")))


def as_one_expert(wl):
    """``wl`` with every model written as an MoE of one expert, top-1, as wide as its MLP."""
    return dataclasses.replace(wl, models=tuple(
        (r, dataclasses.replace(m, moe=MoE(1, 1, m.ffn))) for r, m in wl.models))


def assert_same_estimate(a, b) -> None:
    assert a.iteration_s == b.iteration_s
    assert a.tasks == b.tasks and a.parts == b.parts
    assert a.feasible == b.feasible and a.task_violations == b.task_violations
    for (ia, pa), (ib, pb) in zip(a.memory.peaks, b.memory.peaks, strict=True):
        assert np.array_equal(ia, ib) and np.array_equal(pa, pb)


@pytest.mark.parametrize(("workload", "cluster", "tp", "pp"), [
    ("qwen3-8b-ppo-sync", "a100x8", 4, 1),
    ("qwen3-4b-grpo-async", "paper64-single-region", 2, 2),
    ("qwen3-14b-ppo-async", "paper64-multi-country", 4, 2),
])
def test_one_expert_top1_estimates_bit_identically_on_the_presets(workload, cluster, tp, pp):
    wl, cl = workload_preset(workload), cluster_preset(cluster)
    plan = colocated_plan(wl, cl, tp=tp, pp=pp)
    assert_same_estimate(CostModel(wl, cl).estimate(plan),
                         CostModel(as_one_expert(wl), cl).estimate(plan, check=False))


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_one_expert_top1_estimates_bit_identically_on_random_layouts(data):
    wl, cluster = data.draw(workloads), data.draw(clusters)
    plan = data.draw(random_plans(wl, cluster))
    assert_same_estimate(CostModel(wl, cluster).estimate(plan),
                         CostModel(as_one_expert(wl), cluster).estimate(plan, check=False))


def test_expert_parallelism_splits_the_experts_only():
    m = model_preset("Qwen3-30B-A3B")
    one = stage_shapes(m, (48,), 2, True, 2)[0]
    eight = stage_shapes(m, (48,), 2, True, 2, ep=8, expert_load=1.25)[0]
    assert one.expert_params == m.expert_params / 2
    assert eight.expert_params == m.expert_params / 16
    assert one.params - one.expert_params == pytest.approx(eight.params - eight.expert_params)
    # the busiest rank's routed-expert FLOPs: 1.25 x the mean
    routed = 2 * 48 * 8 * 3 * 2048 * 768 / 2
    assert eight.matmul_flops_per_token - one.matmul_flops_per_token == pytest.approx(0.25 * routed)


def test_decode_reads_the_experts_its_batch_uses():
    m = model_preset("Qwen3-30B-A3B")
    s = stage_shapes(m, (48,), 1, True, 2)[0]
    other = s.weight_bytes - s.expert_weight_bytes
    # one token uses 8 of 128 experts
    assert s.decode_weight_bytes(1) == pytest.approx(other + s.expert_weight_bytes * 8 / 128)
    # 64 tokens: each expert is used with probability 1 - (120/128)^64
    used = 1 - (120 / 128) ** 64
    assert s.decode_weight_bytes(64) == pytest.approx(other + s.expert_weight_bytes * used)
    # an expert-parallel group of 4 decodes 4 x 16 tokens together
    s4 = stage_shapes(m, (48,), 1, True, 2, ep=4)[0]
    assert s4.decode_weight_bytes(16) == pytest.approx(
        s4.weight_bytes - s4.expert_weight_bytes * (1 - used))


def test_alltoall_by_hand():
    # 16 devices, 2 nodes of 8: 7/15 of the bytes inside a node at 300 GB/s, 8/15 across at
    # 50 GB/s (the uplink share), one latency (the slower link's)
    g = GroupLinks(16, 5e-5, 50e9, 2, 8, 2e-6, 300e9, 5e-5, 50e9, 50e9)
    a, b = alltoall_pieces(g, 1.0)
    assert a == 5e-5 and b == pytest.approx(8 / 15 / 50e9)
    inside = GroupLinks(8, 2e-6, 300e9, 1, 8, 2e-6, 300e9, 0.0, math.inf)
    assert alltoall_pieces(inside, 0.5) == (2e-6, 1 / 150e9)
    s = stage_shapes(model_preset("Qwen3-30B-A3B"), (48,), 2, True, 2, ep=4,
                     expert_load=1.25)[0]
    # 1000 tokens x top-8 x hidden 2048 x 2 bytes x load 1.25 x 3/4 held elsewhere / tp 2
    assert dispatch_bytes(s, 1000) == pytest.approx(1000 * 8 * 2048 * 2 * 1.25 * 0.75 / 2)


def test_expert_parallelism_within_a_node_beats_across_slow_nodes():
    wl = workload_preset("qwen3-30b-a3b-grpo-sync")
    fast = H100X16
    plan = colocated_plan(wl, fast, tp=2, ep=4)  # each EP group: 8 GPUs of one node
    across = colocated_plan(wl, fast, tp=2, ep=8)  # each EP group spans both nodes
    a, b = CostModel(wl, fast).estimate(plan), CostModel(wl, fast).estimate(across)
    assert a.feasible and a.parts["actor_training"]["ep"] > 0
    assert b.parts["actor_training"]["ep"] > a.parts["actor_training"]["ep"]
    assert a.parts["actor_generation"]["ep"] < b.parts["actor_generation"]["ep"]


def test_ep_and_fp8_validation_errors():
    wl = workload_preset("qwen3-30b-a3b-grpo-sync")
    cl = cluster_preset("a100x8")
    with pytest.raises(SpecError, match=r"ep = 3: must be an integer|ep = 3: must divide"):
        colocated_plan(wl, cl, tp=1, ep=3)
    with pytest.raises(SpecError, match="must divide dp = 4"):
        colocated_plan(wl, cl, tp=2, ep=8)
    dense = workload_preset("qwen3-8b-grpo-sync")
    plan = colocated_plan(dense, cl, tp=1)
    bad = plan.with_placement(dataclasses.replace(plan.placement("actor_training"), ep=2))
    with pytest.raises(SpecError, match="Qwen3-8B is dense"):
        validate(bad, dense, cl)
    fp8 = dense.with_(gen_precision="fp8")
    with pytest.raises(SpecError) as exc:
        validate(colocated_plan(dense, cl, tp=1), fp8, cl)
    assert "actor_generation runs in FP8 (gen_precision: fp8)" in str(exc.value)
    assert "A100-80GB, which has no FP8 tensor cores" in str(exc.value)


def test_fp8_rollout_halves_weight_and_kv_bytes_and_runs_at_the_fp8_peak():
    wl = workload_preset("qwen3-8b-grpo-sync")
    cl = ClusterSpec("h100x8", (NodeSpec("n", "H100", 8, "us-east-1"),))
    plan = colocated_plan(wl, cl, tp=1)
    bf16 = CostModel(wl, cl)
    fp8 = CostModel(wl.with_(gen_precision="fp8"), cl)
    gen = plan.placement("actor_generation")
    s16, s8 = bf16.shapes(gen.task, gen)[0], fp8.shapes(gen.task, gen)[0]
    assert s8.weight_bytes == s16.weight_bytes / 2
    assert s8.kv_bytes_per_token == s16.kv_bytes_per_token / 2
    hw = bf16.replica_hws(gen)[0].stages[0]
    assert s8.peak_flops(hw) == 1979e12 and s16.peak_flops(hw) == 989e12
    # training keeps bf16 unless precision says fp8
    train = plan.placement("actor_training")
    assert fp8.shapes(train.task, train)[0].peak_flops(hw) == 989e12
    a, b = bf16.estimate(plan), fp8.estimate(plan)
    assert b.tasks["actor_generation"] < a.tasks["actor_generation"]
    assert b.tasks["actor_training"] == a.tasks["actor_training"]


def test_fp8_on_a_gpu_without_fp8_units_is_a_violation_the_search_avoids():
    wl = workload_preset("qwen3-8b-grpo-sync").with_(precision="fp8")
    cl = cluster_preset("a100x8")
    est = CostModel(wl, cl).estimate(colocated_plan(workload_preset("qwen3-8b-grpo-sync"), cl,
                                                    tp=1), check=False)
    assert not est.feasible
    assert any("no FP8 tensor cores" in v for v in est.task_violations)


def test_expert_gradients_reduce_over_their_own_groups():
    wl = workload_preset("qwen3-30b-a3b-grpo-sync")
    cl = H100X16
    one, four = colocated_plan(wl, cl, tp=2), colocated_plan(wl, cl, tp=2, ep=4)
    m = CostModel(wl, cl)
    # every rank holds a quarter of the experts: their gradients and optimizer shards shrink
    e1, e4 = m.estimate(one), m.estimate(four)
    assert e4.parts["actor_training"]["dp"] < e1.parts["actor_training"]["dp"]
    peak1 = max(p.max() for _, p in e1.memory.peaks)
    peak4 = max(p.max() for _, p in e4.memory.peaks)
    assert peak4 < peak1
