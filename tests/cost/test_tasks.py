"""Per-replica task costs (generation, inference, training) on tiny cases computed by hand.

Hardware: A100-80GB from the catalog: 312e12 FLOP/s bf16 dense, 2039e9 B/s HBM, NVLink 300e9 B/s
per direction inside a node, 1 us per GPU<->host hop (2 us GPU to GPU). Efficiencies
(tests/hand_params.py): infer_flops 0.5, train_flops 0.4, decode_flops 0.4, decode_hbm 0.7, hbm 0.8, link 0.8; decode step
overhead 1 ms; prefill chunk 8192 tokens.

Model: Qwen3-8B (36 layers, hidden 4096, ffn 12288, 32 heads, 8 KV heads, head_dim 128, vocab
151936, untied embeddings). Per layer: attention 2*4096*4096 + 2*4096*1024 = 41,943,040 params;
SwiGLU MLP 3*4096*12288 = 150,994,944; plus two RMSNorm vectors 2*4096.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from hetrl.cost.flops import stage_shapes
from hetrl.cost.lengths import length_stats
from hetrl.cost.model import CostModel
from hetrl.cost.params import CostParams
from hetrl.cost.replica import replica_hw
from hetrl.cost.tasks import PARTS, generation_replica, inference_replica, training_replica
from hetrl.plan import colocated_plan
from hetrl.spec.lengths import LengthDist
from hetrl.spec.model import model_preset
from hetrl.spec.workload import WorkloadSpec
from tests.hand_params import HAND_PARAMS

PEAK = 312e12  # A100 bf16 FLOP/s
HBM = 2039e9  # A100 B/s
MATRIX_PER_LAYER = 41_943_040 + 150_994_944  # attention + MLP weights of one Qwen3-8B layer
# Dense forward FLOPs per token: 2 per weight; the actor ends in a 4096 x 151936 LM head.
HEAD = 2 * 4096 * 151_936  # the LM head's FLOPs per token: 1,244,659,712
MATMUL = 2 * 36 * MATRIX_PER_LAYER + HEAD  # = 15,136,194,560
# Attention scores (QK^T and AV): 4 x heads x head_dim per layer per context token.
ATTN = 4 * 36 * 32 * 128  # = 589,824
# Parameters: 36 layers x (matrices + 2 norms) + embedding + LM head + final norm.
PARAMS = 36 * (MATRIX_PER_LAYER + 2 * 4096) + 2 * 151_936 * 4096 + 4096  # = 8,190,726,144
WEIGHTS = 2 * PARAMS  # bf16 bytes
KV = 2 * 36 * 8 * 128 * 2  # K and V, 8 KV heads x 128, bf16: 147,456 bytes per token
P = R = 256  # fixed prompt and response lengths
S = P + R  # 512


def fixed_workload(n_prompts: int = 4, responses: int = 4, **kw) -> WorkloadSpec:
    q8 = model_preset("Qwen3-8B")
    return WorkloadSpec(
        name="fixed", algorithm="grpo", mode="sync",
        models=(("actor", q8), ("reference", q8), ("reward", q8)),
        batch_prompts=n_prompts, responses_per_prompt=responses,
        prompt_length=LengthDist.fixed(P), response_length=LengthDist.fixed(R), **kw)


@pytest.fixture(scope="module")
def L():
    return length_stats(fixed_workload())


@pytest.fixture(scope="module")
def one_gpu(a100x8):
    return replica_hw(a100x8, ((0,),))


def actor(layers=(36,), tp=1):
    return stage_shapes(model_preset("Qwen3-8B"), layers, tp, True, 2)


def test_shape_numbers_match_the_hand_count():
    (s,) = actor()
    assert s.params == PARAMS == 8_190_726_144
    assert s.weight_bytes == WEIGHTS
    assert s.matmul_flops_per_token == MATMUL == 15_136_194_560
    assert s.attn_flops_per_token_ctx == ATTN
    assert s.kv_bytes_per_token == KV == 147_456
    # Scalar head instead of the LM head (reward, critic): 2 x 4096 FLOPs per token.
    (r,) = stage_shapes(model_preset("Qwen3-8B"), (36,), 1, False, 2)
    assert r.matmul_flops_per_token == 2 * 36 * MATRIX_PER_LAYER + 2 * 4096
    # tp = 4 splits FLOPs and weights by 4; 8 KV heads / 4 = 2 per rank.
    (t,) = actor(tp=4)
    assert t.params == PARAMS / 4 and t.kv_bytes_per_token == KV / 4


# --- inference ----------------------------------------------------------------------------------

def test_inference_one_gpu_fixed_lengths(L, one_gpu):
    # 16 sequences of 512 tokens in one micro-batch of 16:
    # FLOPs = 16 x 512 x MATMUL + ATTN x 16 x 512^2 / 2 (causal: half the S x S scores)
    flops = 16 * S * MATMUL + ATTN * 16 * S**2 / 2  # = 1.2523e14
    compute = flops / (PEAK * 0.5)  # about 0.8028 s
    weights = WEIGHTS / (HBM * 0.8)  # one read of the weights, about 0.0100 s: hidden by compute
    assert compute > weights
    rc = inference_replica(actor(), one_gpu, 16, 16, L, HAND_PARAMS)
    assert rc.seconds == pytest.approx(compute, rel=1e-12)
    assert rc.parts["compute"] == pytest.approx(compute, rel=1e-12)
    # Two micro-batches of 8: twice 8/16 of the FLOPs, the same total.
    rc2 = inference_replica(actor(), one_gpu, 16, 8, L, HAND_PARAMS)
    assert rc2.seconds == pytest.approx(compute, rel=1e-12)


def test_inference_is_weight_bound_for_a_tiny_batch(L, one_gpu):
    # One sequence of 512 tokens: 7.83e12 FLOPs -> 0.0502 s of compute vs 0.0100 s to read the
    # weights. With an hbm efficiency of 0.008 (16.3 GB/s) the weight read dominates:
    params = HAND_PARAMS.with_efficiency(None, "hbm", 0.008)  # 2039e9 x 0.008 = 16.3 GB/s
    weights = WEIGHTS / (HBM * 0.008)  # about 1.004 s
    rc = inference_replica(actor(), one_gpu, 1, 16, L, params)
    assert rc.seconds == pytest.approx(weights, rel=1e-12)
    assert rc.parts["hbm"] == pytest.approx(weights) and rc.parts["compute"] == 0.0


# --- training -----------------------------------------------------------------------------------

def test_training_one_gpu_fixed_lengths(L, one_gpu):
    # 16 sequences, micro-batch 4 -> m = 4 micro-batches of 4 x 512 tokens, pp = 1.
    # Forward + backward = 3 x the forward FLOPs, at 0.4 of peak.
    micro_flops = 3 * (4 * S * MATMUL + ATTN * 4 * S**2 / 2)
    per_micro = micro_flops / (PEAK * 0.4)  # about 0.5018 s (> 2 weight reads, 0.0201 s)
    rc = training_replica(actor(), one_gpu, 16, 4, L, HAND_PARAMS, recompute=False)
    assert rc.seconds == pytest.approx(4 * per_micro, rel=1e-12)  # (m + pp - 1) = 4 slots
    assert rc.parts["bubble"] == 0.0
    # Full recomputation: 4 x forward FLOPs instead of 3.
    rc_re = training_replica(actor(), one_gpu, 16, 4, L, HAND_PARAMS, recompute=True)
    assert rc_re.seconds == pytest.approx(4 * per_micro * 4 / 3, rel=1e-12)


def test_training_task_adds_the_optimizer_step(a100x8):
    # Through the CostModel: one optimizer step over 16 sequences on device 0 alone (dp = 1).
    wl = fixed_workload()
    plan = colocated_plan(wl, a100x8, devices=[0])
    est = CostModel(wl, a100x8, HAND_PARAMS).estimate(plan)
    per_micro = 3 * (4 * S * MATMUL + ATTN * 4 * S**2 / 2) / (PEAK * 0.4)
    # Adam step: 32 bytes of HBM traffic per parameter at 0.8 of 2039 GB/s.
    adam = PARAMS * 32 / (HBM * 0.8)  # about 0.1607 s
    assert est.tasks["actor_training"] == pytest.approx(4 * per_micro + adam, rel=1e-12)
    assert est.parts["actor_training"]["dp"] == 0.0
    # The reference forward over all 16 sequences (micro-batch 16) as above.
    ref = (16 * S * MATMUL + ATTN * 16 * S**2 / 2) / (PEAK * 0.5)
    assert est.tasks["reference_inference"] == pytest.approx(ref, rel=1e-12)


def test_1f1b_two_stages_is_m_plus_one_slowest_slots(L, a100x8):
    hw = replica_hw(a100x8, ((0,), (1,)))
    shapes = actor(layers=(20, 16))
    tokens = 4 * S  # micro-batch of 4 sequences
    # Stage 0: 20 layers and the embedding, no head; stage 1: 16 layers and the LM head.
    f0 = 3 * (tokens * 2 * 20 * MATRIX_PER_LAYER + 4 * 20 * 32 * 128 * 4 * S**2 / 2)
    f1 = 3 * (tokens * (2 * 16 * MATRIX_PER_LAYER + 2 * 4096 * 151_936)
              + 4 * 16 * 32 * 128 * 4 * S**2 / 2)
    # Boundary: stage 0 sends activations forward, stage 1 sends their gradients back,
    # tokens x hidden x 2 bytes each, over NVLink (2 us, 300e9 B/s x 0.8): each pays one send.
    send = 2 * (2e-6 + tokens * 4096 * 2 / (300e9 * 0.8))
    stage0 = f0 / (PEAK * 0.4) + send / 2
    stage1 = f1 / (PEAK * 0.4) + send / 2
    slow = max(stage0, stage1)
    assert slow == stage0  # 20 layers outweigh 16 layers + the LM head
    for m in (1, 4, 8):
        rc = training_replica(shapes, hw, 4 * m, 4, L, HAND_PARAMS, recompute=False)
        assert rc.seconds == pytest.approx((m + 2 - 1) * slow, rel=1e-12)
        assert rc.parts["bubble"] == pytest.approx(slow, rel=1e-12)  # (pp - 1) slots
    # Inference over the same pipeline: fill once, then one slowest slot per extra micro-batch.
    i0 = f0 / 3 / (PEAK * 0.5) + send / 2
    i1 = f1 / 3 / (PEAK * 0.5)
    rc = inference_replica(shapes, hw, 4 * 8, 4, L, HAND_PARAMS)
    assert rc.seconds == pytest.approx(i0 + i1 + 7 * max(i0, i1), rel=1e-12)


# --- generation ---------------------------------------------------------------------------------

def hand_generation(n: int, prompt: int, steps: np.ndarray, batch: np.ndarray,
                    ctx: np.ndarray) -> tuple[float, float]:
    """(prefill seconds, decode seconds) of Qwen3-8B on one A100: decode step s costs
    max(weights + KV bytes / (0.7 HBM), FLOPs / (0.4 peak)) + 1 ms, weighted by ``steps``."""
    ptoks = n * prompt
    chunks = -(-ptoks // 8192)
    pre_flops = ptoks * (MATMUL - HEAD) + n * HEAD + ATTN * n * prompt**2 / 2  # head: last position
    prefill = max(pre_flops / (PEAK * 0.5), chunks * WEIGHTS / (HBM * 0.8))
    hbm = (WEIGHTS + batch * ctx * KV) / (HBM * 0.7)
    fl = batch * (MATMUL + ATTN * ctx) / (PEAK * 0.4)
    return prefill, float(steps @ (np.maximum(hbm, fl) + 1e-3))


@pytest.mark.parametrize("n", [1, 64, 256])
def test_generation_fixed_length_within_concurrency(L, one_gpu, n):
    # n <= concurrency (256, the KV budget allows 50e9 // (147,456 x 512) = 662): every sequence
    # runs from the start; R = 256 decode steps, step s at batch n and context P + s.
    s = np.arange(1, R + 1)
    prefill, decode = hand_generation(n, P, np.ones(R), np.full(R, float(n)), P + s)
    rc = generation_replica(actor(), one_gpu, n, (50e9,), L, 256, HAND_PARAMS)
    assert rc.concurrency == 256
    assert rc.seconds == pytest.approx(prefill + decode, rel=1e-9)
    assert rc.parts["overhead"] == pytest.approx(R * 1e-3)
    assert rc.violations == ()


def test_generation_memory_bound_at_64_compute_bound_at_256(L, one_gpu):
    # Every decode step (context 257..512) is
    #  - memory-bound at 64 sequences: HBM (16.38e9 + 64 x 512 x 147,456 B) / 1427e9 = 14.9 ms at
    #    most vs FLOPs 64 x (15.14e9 + 589,824 x 512) / 124.8e12 = 7.9 ms;
    #  - compute-bound at 256: HBM at most (16.38e9 + 19.33e9) / 1427e9 = 25.0 ms vs FLOPs at
    #    least 256 x (15.14e9 + 589,824 x 257) / 124.8e12 = 31.4 ms.
    # Prefill (compute-bound, 2.3e14 FLOPs at 64 sequences: the LM head for one position per
    # sequence) is the only compute of the first.
    small = generation_replica(actor(), one_gpu, 64, (50e9,), L, 256, HAND_PARAMS)
    big = generation_replica(actor(), one_gpu, 256, (50e9,), L, 256, HAND_PARAMS)
    prefill64 = (64 * P * (MATMUL - HEAD) + 64 * HEAD + ATTN * 64 * P**2 / 2) / (PEAK * 0.5)
    assert small.parts["compute"] == pytest.approx(prefill64, rel=1e-12)
    assert small.parts["hbm"] > 3.0
    assert big.parts["hbm"] == 0.0 and big.parts["compute"] > 8.0


def test_generation_saturated_then_drain(L, one_gpu):
    # 512 sequences, at most 128 at once: the first 128 prompts prefilled on their own, then
    # (512 - 128) x 256 / 128 = 768 saturated steps at batch 128 and the mean running context
    # P + E[r^2] / (2 E[r]) = 256 + 128, carrying the chunked prefill of the 128 / 256 = 0.5
    # prompts admitted per step (their FLOPs at the prefill rate) in whole prompts: a share
    # w = 1 - e^-0.5 of the steps carries 0.5 / w prompts; then R = 256 drain steps of the last
    # 128 (fixed lengths: all alive to the end).
    w = -math.expm1(-0.5)
    pre_step = 0.5 / w * (P * (MATMUL - HEAD) + HEAD + ATTN * P**2 / 2) / (PEAK * 0.5)
    hbm = (WEIGHTS + 128 * 384 * KV) / (HBM * 0.7)
    fl = 128 * (MATMUL + ATTN * 384) / (PEAK * 0.4)
    sat = 768 * ((1 - w) * max(hbm, fl) + w * max(hbm, fl + pre_step) + 1e-3)
    s = np.arange(1, R + 1)
    prefill, drain = hand_generation(128, P, np.ones(R), np.full(R, 128.0), P + s)
    rc = generation_replica(actor(), one_gpu, 512, (50e9,), L, 128, HAND_PARAMS)
    assert rc.concurrency == 128
    assert rc.seconds == pytest.approx(prefill + sat + drain, rel=1e-9)
    assert rc.parts["overhead"] == pytest.approx((768 + 256) * 1e-3)


def test_generation_concurrency_limited_by_kv_budget(L, one_gpu):
    # KV on demand: a running sequence holds its prompt and, at the mean, E[r^2] / (2 E[r]) = 128
    # generated tokens: 1e9 B // (147,456 B x 384) = 17 sequences at once in the saturated
    # phase; 64 sequences started together peak at 512 tokens each, so the drain runs
    # 1e9 // (147,456 x 512) = 13 and the other 51 pass through the saturated phase:
    # (64 - 13) x 256 / 17 = 768 steps, then the drain's 256.
    rc = generation_replica(actor(), one_gpu, 64, (1e9,), L, 256, HAND_PARAMS)
    assert rc.concurrency == 17 and rc.violations == ()
    assert rc.phases[2] == pytest.approx((64 - 13) * 256 / 17 + 256)
    # A budget below one max-length sequence (75.5 MB) is a violation naming the stage.
    bad = generation_replica(actor(), one_gpu, 64, (5e7,), L, 256, HAND_PARAMS)
    assert bad.concurrency == 1
    assert len(bad.violations) == 1 and "stage 0 (A100-80GB)" in bad.violations[0]


def test_generation_decode_variable_lengths_matches_numpy(one_gpu):
    # Uniform response lengths over [1, 64]: the drain of m = 32 sequences steps while any is
    # alive, P(any alive at s) = 1 - ((s - 1) / 64)^32, at the expected batch 32 x P(len >= s) /
    # P(any alive).
    wl = fixed_workload().with_(response_length=LengthDist(mean=32.5, max=64, min=1,
                                                           kind="uniform"))
    L = length_stats(wl)
    s = np.arange(1, 65)
    survive = 1 - (s - 1) / 64
    alive = 1 - ((s - 1) / 64) ** 32
    prefill, decode = hand_generation(32, P, alive, 32 * survive / alive, P + s)
    rc = generation_replica(actor(), one_gpu, 32, (50e9,), L, 256, HAND_PARAMS)
    assert rc.seconds == pytest.approx(prefill + decode, rel=1e-9)
    assert rc.parts["overhead"] == pytest.approx(alive.sum() * 1e-3, rel=1e-9)


# --- parts always add up ------------------------------------------------------------------------

def test_parts_sum_to_seconds(L, a100x8):
    params = CostParams(decode_step_overhead_s=2e-3)
    for layout in (((0,),), ((0, 1),), ((0,), (1,)), ((0, 1), (2, 3)), ((0, 1, 2, 3),)):
        hw = replica_hw(a100x8, layout)
        pp, tp = len(layout), len(layout[0])
        layers = (36,) if pp == 1 else (18, 18)
        for lm_head in (True, False):
            shapes = stage_shapes(model_preset("Qwen3-8B"), layers, tp, lm_head, 2)
            for n in (1, 5, 64, 300):
                costs = [generation_replica(shapes, hw, n, (30e9,) * pp, L, 64, params),
                         inference_replica(shapes, hw, n, 16, L, params),
                         training_replica(shapes, hw, n, 4, L, params, recompute=n % 2 == 0)]
                for rc in costs:
                    assert set(rc.parts) == set(PARTS)
                    assert sum(rc.parts.values()) == pytest.approx(rc.seconds, rel=1e-12)
                    assert all(v >= 0 for v in rc.parts.values())


def test_task_parts_sum_to_task_seconds(ppo8b, paper_clusters):
    cluster = paper_clusters["multi-country"]
    plan = colocated_plan(ppo8b, cluster, tp=4, pp=2)
    est = CostModel(ppo8b, cluster, HAND_PARAMS).estimate(plan)
    for task, seconds in est.tasks.items():
        assert sum(est.parts[task].values()) == pytest.approx(seconds, rel=1e-12), task
