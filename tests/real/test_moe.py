"""A real expert-parallel MoE layer (real/moe.py: transformers' Qwen3-MoE experts split over gloo
ranks) against the cost model: the bytes its all-to-alls move equal what
hetrl.cost.expert_parallel counts for the same layout, its output equals the whole layer's in one
process, and the gathered experts are the whole layer's."""

from __future__ import annotations

import pytest
import torch

from hetrl.cost.expert_parallel import dispatch_bytes
from hetrl.cost.flops import collectives_per_layer, stage_shapes
from hetrl.spec.model import ModelShape
from hetrl.spec.moe import MoE
from tests.real.moe_ranks import EXPERTS, FFN, HIDDEN, TOP_K, run_ranks


def _shape(ep: int):
    """One MoE layer of the test's shape, as the cost model sees one rank of it (fp32 on CPU:
    4 bytes per value; the busiest rank's load 1: the routing is balanced)."""
    model = ModelShape("tiny-moe", 1, HIDDEN, FFN, 2, 2, 8, 64,
                       moe=MoE(EXPERTS, TOP_K, FFN))
    return stage_shapes(model, (1,), 1, True, 4, ep=ep, expert_load=1.0)[0]


def test_alltoall_bytes_equal_the_cost_models_and_outputs_match(tmp_path):
    tokens = 64
    results = run_ranks(2, tokens, tmp_path)
    # dispatch and combine of one forward pass: collectives_per_layer("inference") of them
    expected = collectives_per_layer("inference", False) * dispatch_bytes(_shape(2), tokens)
    for r in results:
        assert r["forward_bytes"] == expected
        torch.testing.assert_close(r["y"], r["reference"], rtol=1e-5, atol=1e-6)
        assert r["x_grad_finite"] and r["expert_grad"] > 0 and r["gathered_equal"]


def test_learned_routing_moves_about_the_expected_bytes(tmp_path):
    """With the router's own (random) choice the bytes are a sample: within 20% of the uniform
    expectation the cost model uses, and the outputs still match a single process's."""
    tokens = 512
    results = run_ranks(2, tokens, tmp_path, balanced=False)
    expected = 2 * dispatch_bytes(_shape(2), tokens)
    total = sum(r["forward_bytes"] for r in results)
    assert total == pytest.approx(2 * expected, rel=0.2)
    for r in results:
        torch.testing.assert_close(r["y"], r["reference"], rtol=1e-5, atol=1e-6)
