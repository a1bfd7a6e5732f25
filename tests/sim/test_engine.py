"""The simulator on tiny cases whose times are worked out by hand (see tests/sim/tiny.py for the
model's numbers, tests/hand_params.py for the efficiencies): generation with continuous batching, rollout-data and weight-sync transfers,
a 2-stage inference pipeline and a 1F1B training step."""

from __future__ import annotations

import pytest

from hetrl.cost.model import CostModel
from hetrl.plan import Plan, TaskGroup, colocated_plan, make_placement
from hetrl.spec.lengths import LengthDist
from sim import simulate
from sim.engine import Simulation, split_counts
from tests.hand_params import HAND_PARAMS
from tests.sim.tiny import (
    ACTOR_PARAMS,
    ACTOR_WEIGHT_BYTES,
    ATTN,
    HBM,
    HEAD,
    KV,
    LAYER_PARAMS,
    MATMUL,
    NVLINK,
    PEAK,
    one_node,
    tiny_workload,
    two_nodes,
)

OVERHEAD = HAND_PARAMS.decode_step_overhead_s  # 1 ms per decode step


def task_span(trace, task, iteration=0):
    (s,) = [s for s in trace.spans if s.kind == "task" and s.task == task
            and s.iteration == iteration]
    return s


def prefill_s(prompt_tokens, prompt_sq_sum, prompts):
    """One stage, tp = 1, one chunk: max(FLOPs / (312e12 x 0.5), weights / (2039e9 x 0.8)); the
    LM head runs for the last position of each prompt only."""
    fl = prompt_tokens * (MATMUL - HEAD) + prompts * HEAD + ATTN * prompt_sq_sum / 2
    return max(fl / (PEAK * 0.5), ACTOR_WEIGHT_BYTES / (HBM * 0.8))


def decode_s(batch, ctx_sum, steps):
    """Decode steps one at a time: step i reads the weights and the KV of ctx_sum + i * batch
    tokens (HBM at 0.7) or computes batch x dense + attention FLOPs (at 0.4), whichever is
    slower, plus the 1 ms step overhead."""
    total = 0.0
    for i in range(steps):
        ctx = ctx_sum + i * batch
        hbm = (ACTOR_WEIGHT_BYTES + ctx * KV) / (HBM * 0.7)
        flops = (batch * MATMUL + ATTN * ctx) / (PEAK * 0.4)
        total += max(hbm, flops) + OVERHEAD
    return total


# --- (a) generation on one GPU ------------------------------------------------------------------

def test_generation_prefill_then_decode_steps():
    # 2 prompts x 2 responses = 4 sequences, prompt 16 and response 8 tokens, all admitted at
    # once (concurrency 256 >= 4). Prefill of 64 tokens: FLOPs 64 x 2,871,296 + 2,048 x 4 x 16^2
    # / 2 = 184,811,520 -> 1.18 us at 156e12; weights 3,385,856 B / 1631.2e9 B/s = 2.076 us:
    # HBM-bound, 2.0757e-6 s. Decode: 8 steps of batch 4; step i attends 4 x (16 + 1 + i) tokens:
    # HBM (3,385,856 + 1,024 x 4 (17 + i)) / 1427.3e9 = 2.421 us .. 2.441 us, FLOPs ~0.09 us;
    # sum 19.448 us, plus 8 x 1 ms overhead.
    wl, cluster = tiny_workload(), one_node(1)
    trace = simulate(colocated_plan(wl, cluster), wl, cluster, 1, params=HAND_PARAMS).trace
    gen = task_span(trace, "actor_generation")
    assert gen.start_s == 0.0
    assert prefill_s(64, 4 * 16**2, 4) == pytest.approx(2.0756841589e-6, rel=1e-9)
    assert decode_s(4, 4 * 17, 8) == pytest.approx(19.448323408e-6 + 8e-3, rel=1e-9)
    assert gen.duration_s == pytest.approx(prefill_s(64, 4 * 16**2, 4) + decode_s(4, 4 * 17, 8),
                                           rel=1e-9)
    (tasklet,) = trace.spans_of("tasklet", "actor_generation")
    assert tasklet.meta["sequences"] == 4 and tasklet.meta["peak_batch"] == 4
    assert tasklet.meta["concurrency"] == 256  # the workload's cap; the KV cache allows more


def test_generation_decode_crosses_from_compute_to_memory_bound():
    # 256 sequences (64 prompts x 4): step i's FLOPs (256 x 2,871,296 + 2,048 x 256 (17 + i))
    # / 124.8e12 = 5.96 us + 0.004 us i; HBM (3,385,856 + 1,024 x 256 (17 + i)) / 1427.3e9 =
    # 5.49 us + 0.184 us i: compute-bound for i <= 2, memory-bound after.
    wl, cluster = tiny_workload(n_prompts=64, responses=4), one_node(1)
    trace = simulate(colocated_plan(wl, cluster), wl, cluster, 1, params=HAND_PARAMS).trace
    expected = prefill_s(256 * 16, 256 * 16**2, 256) + decode_s(256, 256 * 17, 8)
    assert task_span(trace, "actor_generation").duration_s == pytest.approx(expected, rel=1e-9)


def test_generation_admits_a_new_wave_when_the_batch_is_full():
    # Concurrency 2, 4 sequences of fixed lengths: two waves, each a prefill of 2 x 16 tokens
    # and 8 decode steps of batch 2 (every sequence of a wave ends at the same step).
    wl, cluster = tiny_workload(gen_max_concurrency=2), one_node(1)
    trace = simulate(colocated_plan(wl, cluster), wl, cluster, 1, params=HAND_PARAMS).trace
    wave = prefill_s(32, 2 * 16**2, 2) + decode_s(2, 2 * 17, 8)
    assert task_span(trace, "actor_generation").duration_s == pytest.approx(2 * wave, rel=1e-9)


def test_generation_one_at_a_time_follows_each_sampled_length():
    # Concurrency 1 and uniform response lengths in [4, 12]: each sequence alone, one after
    # another: prefill of its 16-token prompt, then r_s decode steps of batch 1.
    wl = tiny_workload(response=LengthDist(mean=8, max=12, min=4, kind="uniform"),
                       gen_max_concurrency=1)
    cluster = one_node(1)
    plan = colocated_plan(wl, cluster)
    responses = Simulation(plan, wl, cluster, HAND_PARAMS, seed=3).draw(0).response.tolist()
    assert len(set(responses)) > 1  # the lengths differ
    expected = sum(prefill_s(16, 16**2, 1) + decode_s(1, 17, r) for r in responses)
    trace = simulate(plan, wl, cluster, 1, seed=3, params=HAND_PARAMS).trace
    assert task_span(trace, "actor_generation").duration_s == pytest.approx(expected, rel=1e-9)


# --- (b) transfers between two GPUs -------------------------------------------------------------

def split_two(wl, cluster):
    """Generation alone on device 0, every other task on device 1 (tp = pp = dp = 1)."""
    rest = tuple(t for t in wl.task_names if t != "actor_generation")
    placements = [make_placement(t, [0 if t == "actor_generation" else 1], 1, 1, 1, 2)
                  for t in wl.task_names]
    return Plan((TaskGroup(("actor_generation",), (0,)), TaskGroup(rest, (1,))), tuple(placements))


def test_rollout_data_and_weight_sync_between_two_nodes():
    # Two nodes, one A100 each, NICs 8 Gbit/s = 1e9 B/s at link efficiency 0.8; 52 us one way.
    # Rollout data: 4 sequences x 24 tokens x 4 B (token ids) = 384 B to each inference task,
    # x 20 B (ids, log-probs, advantages...) = 1,920 B to training.
    # Weight sync: device 0 pulls the whole actor, 3,385,856 B, from device 1:
    # 52 us + 3,385,856 / 0.8e9 = 4.28432 ms, then the per-tensor calls' overhead: 2 layers x 9
    # + embedding, norm and head = 21 calls x 0.7 ms = 14.7 ms.
    wl, cluster = tiny_workload(), two_nodes()
    plan = split_two(wl, cluster)
    result = simulate(plan, wl, cluster, 1, params=HAND_PARAMS)
    trace = result.trace
    lat, bw = 52e-6, 1e9 * 0.8
    data = {s.task: s for s in trace.spans_of("transfer") if s.name == "rollout data"}
    assert set(data) == {"reward_inference", "reference_inference", "actor_training"}
    for task in ("reward_inference", "reference_inference"):
        assert data[task].bytes == 384 and data[task].devices == (0, 1)
        assert data[task].duration_s == pytest.approx(lat + 384 / bw, rel=1e-9)
    assert data["actor_training"].bytes == 1920
    assert data["actor_training"].duration_s == pytest.approx(lat + 1920 / bw, rel=1e-9)
    sync = task_span(trace, "weight_sync")
    (weights,) = trace.spans_of("transfer", "weight_sync")
    assert weights.devices == (1, 0) and weights.bytes == ACTOR_WEIGHT_BYTES
    calls = 21 * HAND_PARAMS.sync_call_overhead_s
    assert weights.duration_s == pytest.approx(lat + ACTOR_WEIGHT_BYTES / bw, rel=1e-9)
    assert sync.duration_s == pytest.approx(4.28432e-3 + calls, rel=1e-9)
    # the cost model prices the same pull and the same rollout-data message
    est = CostModel(wl, cluster, HAND_PARAMS).estimate(plan)
    assert est.tasks["weight_sync"] == pytest.approx(sync.duration_s, rel=1e-9)
    assert est.parts["reward_inference"]["data"] == pytest.approx(data["reward_inference"].duration_s,
                                                                  rel=1e-9)
    # the iteration is the chain: generation, two inferences, training, weight sync
    chain = sum(task_span(trace, t).duration_s for t in wl.task_names) + sync.duration_s
    assert result.iteration_s == pytest.approx(chain, rel=1e-9)
    assert result.metrics["bytes_between_nodes"] == {
        "a->b": pytest.approx(2 * 384 + 1920), "b->a": pytest.approx(ACTOR_WEIGHT_BYTES)}


# --- (c) pipelines --------------------------------------------------------------------------------

# Two stages of one layer each on the two A100s of one node (NVLink 300e9 B/s x 0.8, 2 us).
# Stage 0: one layer + embedding; stage 1: one layer + LM head + final norm (actor/reference).
W0 = 2 * (LAYER_PARAMS + 1000 * 256)  # 1,692,672 B
W1 = 2 * (LAYER_PARAMS + 1000 * 256 + 256)  # 1,693,184 B
M0 = 2 * (196_608 + 393_216)  # 1,179,648 FLOPs per token
M1 = M0 + 2 * 256 * 1000  # 1,691,648
A1 = 4 * 1 * 4 * 64  # 1,024 attention FLOPs per token per context token, per stage


def stage_s(matmul, weight_bytes, seqs, seq_len, flops_mult, eff):
    """One micro-batch on one stage: max(FLOPs / (312e12 x eff), weights / (2039e9 x 0.8))."""
    fl = flops_mult * (seqs * seq_len * matmul + A1 * seqs * seq_len**2 / 2)
    return max(fl / (PEAK * eff), weight_bytes / (HBM * 0.8))


def hop_s(tokens):
    """Activations of ``tokens`` tokens to the next stage: 2 us + tokens x 256 x 2 B / 240e9."""
    return 2e-6 + tokens * 256 * 2 / (NVLINK * 0.8)


def pipelined(wl):
    cluster = one_node(2)
    return simulate(colocated_plan(wl, cluster, pp=2), wl, cluster, 1, params=HAND_PARAMS).trace


def test_two_stage_inference_pipeline():
    # 4 sequences of 256 + 256 tokens, 1 sequence per inference micro-batch: m = 4.
    # c0 = (512 x 1,179,648 + 1,024 x 512^2 / 2) / 156e12 = 4.73 us (compute-bound; weights
    # 1.04 us), c1 = (512 x 1,691,648 + 1,024 x 512^2 / 2) / 156e12 = 6.41 us, hop x = 2 us +
    # 262,144 B / 240e9 = 3.09 us. A stage's send blocks it until delivered (Megatron's
    # blocking point-to-point), so stage 0 takes c0 + x = 7.82 us per micro-batch > c1:
    # T = sum_j (c_j + x_j) + (m - 1) max_j (c_j + x_j) = (c0 + x) + c1 + 3 (c0 + x).
    wl = tiny_workload(responses=2, prompt=256, response=256, inference_micro_batch_size=1)
    trace = pipelined(wl)
    c0 = stage_s(M0, W0, 1, 512, 1, 0.5)
    c1 = stage_s(M1, W1, 1, 512, 1, 0.5)
    x = hop_s(512)
    assert c0 == pytest.approx(4.7320e-6, rel=1e-4) and c1 == pytest.approx(6.4124e-6, rel=1e-4)
    assert x == pytest.approx(3.0923e-6, rel=1e-4) and c0 + x > c1
    m = 4
    ref = task_span(trace, "reference_inference")
    assert ref.duration_s == pytest.approx((c0 + x) + c1 + (m - 1) * (c0 + x), rel=1e-9)
    # stage 0's k-th forward starts at k (c0 + x), stage 1's when its input lands: (k + 1) (c0 + x)
    fwd = sorted((s for s in trace.spans_of("tasklet", "reference_inference")),
                 key=lambda s: (s.meta["stage"], s.meta["micro_batch"]))
    assert [(s.meta["stage"], s.meta["micro_batch"]) for s in fwd] == [
        (j, k) for j in range(2) for k in range(m)]
    for k in range(m):
        assert fwd[k].start_s - ref.start_s == pytest.approx(k * (c0 + x), rel=1e-9, abs=1e-15)
        assert fwd[m + k].start_s - ref.start_s == pytest.approx((k + 1) * (c0 + x), rel=1e-9)
    acts = [s for s in trace.spans_of("transfer", "reference_inference") if s.name == "activations"]
    assert len(acts) == m and all(s.devices == (0, 1) and s.bytes == 512 * 256 * 2 for s in acts)
    # the cost model's pipeline formula prices the same schedule
    est = CostModel(wl, one_node(2), HAND_PARAMS).estimate(colocated_plan(wl, one_node(2), pp=2))
    assert est.tasks["reference_inference"] == pytest.approx(ref.duration_s, rel=1e-9)


def test_inference_pipeline_bound_by_its_slowest_stage():
    # 4 sequences of 1024 + 1024 tokens, m = 4: now stage 1 (c1) is slower than stage 0 and its
    # send (c0 + x): T = (c0 + x) + m c1.
    # c0 = (2048 x 1,179,648 + 1,024 x 2048^2 / 2) / 156e12 = 29.253 us, c1 = 35.974 us,
    # x = 2 us + 1,048,576 B / 240e9 = 6.37 us.
    wl = tiny_workload(responses=2, prompt=1024, response=1024, inference_micro_batch_size=1)
    trace = pipelined(wl)
    c0 = stage_s(M0, W0, 1, 2048, 1, 0.5)
    c1 = stage_s(M1, W1, 1, 2048, 1, 0.5)
    x = hop_s(2048)
    assert (c0, c1, x) == pytest.approx((29.2526e-6, 35.9742e-6, 6.3691e-6), rel=1e-4)
    assert c1 > c0 + x
    ref = task_span(trace, "reference_inference")
    assert ref.duration_s == pytest.approx(c0 + x + 4 * c1, rel=1e-9)


def test_one_f_one_b_two_stage_training_step():
    # 4 sequences of 512 tokens, micro-batches of 2 sequences: m = 2, 1,024 tokens each.
    # Forward F_j = FLOPs / (312e12 x 0.4), backward B_j = 2 x that (all compute-bound):
    # F0 = 11.83 us, B0 = 23.66 us, F1 = 16.03 us, B1 = 32.06 us; hop x = 2 us + 524,288 B /
    # 240e9 = 4.18 us (activations forward, gradients back); a send blocks its stage until
    # delivered. 1F1B: stage 0 runs F0 F1 B0 B1, stage 1 F0 B0 F1 B1:
    #   s0.F0 [0, F0], send until F0 + x        s0.F1 [F0 + x, 2 F0 + x], send until 2 F0 + 2 x
    #   s1.F0 [F0 + x, e1 = F0 + x + F1]        s1.B0 [e1, e2 = e1 + B1], send until e2 + x
    #   s1.F1 [e2 + x, e2 + x + F1] (its input came at 2 F0 + 2 x < e2 + x)
    #   s1.B1 [e2 + x + F1, e5 = e2 + x + F1 + B1], send until e5 + x
    #   s0.B0 [e2 + x, e2 + x + B0]              s0.B1 [e5 + x, e5 + x + B0] (its gradient is later)
    # pipeline = F0 + B0 + 2 (F1 + B1) + 3 x; then the Adam step streams 32 B per parameter of
    # the larger stage: 846,592 x 32 / (2039e9 x 0.8) = 16.6 us.
    wl = tiny_workload(responses=2, prompt=256, response=256, micro_batch_size=2)
    trace = pipelined(wl)
    F0, F1 = stage_s(M0, W0, 2, 512, 1, 0.4), stage_s(M1, W1, 2, 512, 1, 0.4)
    B0, B1 = stage_s(M0, W0, 2, 512, 2, 0.4), stage_s(M1, W1, 2, 512, 2, 0.4)
    x = hop_s(1024)
    assert (F0, B0, F1, B1) == pytest.approx((11.830e-6, 23.660e-6, 16.031e-6, 32.062e-6),
                                             rel=1e-4)
    e1 = F0 + x + F1
    e2 = e1 + B1
    e5 = e2 + x + F1 + B1
    expected = {(0, "forward", 0): 0.0, (0, "forward", 1): F0 + x, (1, "forward", 0): F0 + x,
                (1, "backward", 0): e1, (1, "forward", 1): e2 + x, (1, "backward", 1): e2 + x + F1,
                (0, "backward", 0): e2 + x, (0, "backward", 1): e5 + x}
    train = task_span(trace, "actor_training")
    spans = trace.spans_of("tasklet", "actor_training")
    assert len(spans) == 8
    for s in spans:
        key = (s.meta["stage"], s.name, s.meta["micro_batch"])
        assert s.start_s - train.start_s == pytest.approx(expected[key], rel=1e-9, abs=1e-15), key
    optimizer = (LAYER_PARAMS + 1000 * 256 + 256) * 32 / (HBM * 0.8)
    assert train.duration_s == pytest.approx(F0 + B0 + 2 * (F1 + B1) + 3 * x + optimizer, rel=1e-9)
    grads = [s for s in trace.spans_of("transfer", "actor_training") if s.name == "gradients"]
    assert len(grads) == 2 and all(s.devices == (1, 0) for s in grads)


def test_split_counts_is_largest_remainder():
    # 10 over shares 1/2, 1/3, 1/6: 5, 3.33, 1.67 -> floors 5, 3, 1 and the one left to the
    # largest remainder (1.67)
    assert split_counts(10, [0.5, 1 / 3, 1 / 6]) == [5, 3, 2]
    assert split_counts(3, [0.25] * 4) == [1, 1, 1, 0]
    assert sum(split_counts(7, [0.2, 0.3, 0.5])) == 7


def test_actor_params_of_the_tiny_model():
    # the model's own count agrees with the hand count used above
    from tests.sim.tiny import TINY

    assert TINY.params == ACTOR_PARAMS
