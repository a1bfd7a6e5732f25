"""Memory per device: resident weights and trained states, working sets, violations, async copies.

Qwen3-8B: 8,190,726,144 parameters (see test_tasks.py for the count), bf16 weights.
"""

from __future__ import annotations

import dataclasses

import pytest

from hetrl.cost.flops import activation_coeff, stage_shapes
from hetrl.cost.lengths import length_stats
from hetrl.cost.memory import task_memory
from hetrl.cost.model import CostModel
from hetrl.cost.params import DEFAULT_PARAMS, CostParams
from hetrl.plan import colocated_plan, make_placement
from hetrl.spec.cluster import homogeneous
from hetrl.spec.model import model_preset
from hetrl.spec.presets import workload_preset
from tests.cost.test_tasks import fixed_workload

PARAMS_8B = 8_190_726_144
# The reward model: the LM head replaced by a scalar head (hidden values):
# 36 x 192,946,176 (layers) + 151,936 x 4096 (embedding) + 4096 (head) + 4096 (final norm)
PARAMS_8B_REWARD = 36 * 192_946_176 + 151_936 * 4096 + 4096 + 4096  # = 7,568,400,384
GB = 1e9


def test_training_states_follow_cost_params(a100x8):
    wl = fixed_workload()
    model = CostModel(wl, a100x8)
    one = model.placement_memory(make_placement("actor_training", [0], 1, 1, 1, 36))
    assert one.weights[0] == 2 * PARAMS_8B  # bf16: 2 bytes per parameter
    # fp32 gradients (4 B) + fp32 master weights and Adam m, v (12 B) on one device: 16 B/param
    assert one.states[0] == PARAMS_8B * (4 + 12)
    assert one.weights[1:].sum() == 0 and one.states[1:].sum() == 0
    # dp = 2: Adam states sharded over the 2 replicas (ZeRO-1), gradients kept whole: 4 + 12/2
    two = model.placement_memory(make_placement("actor_training", [0, 1], 2, 1, 1, 36))
    assert two.states[0] == two.states[1] == PARAMS_8B * (4 + 6)
    # tp = 2: every per-device quantity halves.
    tp2 = model.placement_memory(make_placement("actor_training", [0, 1], 1, 1, 2, 36))
    assert tp2.states[1] == PARAMS_8B * 16 / 2 and tp2.weights[1] == PARAMS_8B
    # Other byte counts in CostParams: bf16 grads and 8 bytes of optimizer state.
    custom = CostModel(wl, a100x8, CostParams(grad_bytes=2, optimizer_state_bytes=8))
    m = custom.placement_memory(make_placement("actor_training", [0, 1], 2, 1, 1, 36))
    assert m.states[0] == PARAMS_8B * (2 + 8 / 2)
    # Inference and generation hold weights only.
    ref = model.placement_memory(make_placement("reference_inference", [0], 1, 1, 1, 36))
    gen = model.placement_memory(make_placement("actor_generation", [0], 1, 1, 1, 36))
    rew = model.placement_memory(make_placement("reward_inference", [0], 1, 1, 1, 36))
    assert ref.states[0] == gen.states[0] == 0.0
    assert ref.weights[0] == gen.weights[0] == 2 * PARAMS_8B
    assert rew.weights[0] == 2 * PARAMS_8B_REWARD


def test_working_sets_by_hand():
    L = length_stats(fixed_workload())  # every sequence 256 + 256 = 512 tokens
    (s,) = stage_shapes(model_preset("Qwen3-8B"), (36,), 1, True, 2)
    # Training, 16 sequences in micro-batches of 4 (2048 tokens), pp = 1: one micro-batch in
    # flight: 36 layers x 35 B x 2048 tokens x 4096 hidden (Korthikanti et al., flash attention:
    # a GPT layer's 34 B with its 4h GeLU MLP's 19 B swapped for SwiGLU's 2 + 6 x 12288 / 4096 = 20)
    # + the bf16 logits 2048 x 151,936 x 2 B.
    tr = task_memory("training", "actor", s, 0, 1, 1, 16, 4, L, DEFAULT_PARAMS, recompute=False)
    assert tr.working_bytes == 36 * 35 * 2048 * 4096 + 2048 * 151_936 * 2  # 11.19 GB
    # Full recomputation keeps only each layer's input: 2 B per token x hidden.
    re = task_memory("training", "actor", s, 0, 1, 1, 16, 4, L, DEFAULT_PARAMS, recompute=True)
    assert re.working_bytes == 36 * 2 * 2048 * 4096 + 2048 * 151_936 * 2
    # pp = 4, first stage, 16 micro-batches: 1F1B holds pp - j = 4 of them.
    (s0, *_) = stage_shapes(model_preset("Qwen3-8B"), (9, 9, 9, 9), 1, True, 2)
    pp4 = task_memory("training", "actor", s0, 0, 4, 1, 64, 4, L, DEFAULT_PARAMS, recompute=False)
    assert pp4.working_bytes == 4 * 9 * 35 * 2048 * 4096  # no logits on the first stage
    # Inference, micro-batch 16 (8192 tokens): a forward without gradients frees each layer's
    # tensors, so the peak is the larger of one layer's live tensors (16 B per token x hidden)
    # and the final hidden states (2 B) with the logits they make -- here the logits.
    inf = task_memory("inference", "reference", s, 0, 1, 1, 16, 16, L, DEFAULT_PARAMS, False)
    assert inf.working_bytes == 2 * 8192 * 4096 + 8192 * 151_936 * 2  # 2.56 GB, not 3.03
    # A stage without the head holds one layer's live tensors only.
    inf0 = task_memory("inference", "reference", s0, 0, 4, 1, 16, 16, L, DEFAULT_PARAMS, False)
    assert inf0.working_bytes == 16 * 8192 * 4096
    # Generation's working set is its KV cache, handled by the estimate (it takes what is left).
    gen = task_memory("generation", "actor", s, 0, 1, 1, 16, 16, L, DEFAULT_PARAMS, False)
    assert gen.working_bytes == 0.0


def test_everything_on_one_gpu_is_flagged_with_numbers(a100x8):
    wl = fixed_workload()  # GRPO, Qwen3-8B everywhere, 16 sequences of 512 tokens
    plan = colocated_plan(wl, a100x8, devices=[3])
    est = CostModel(wl, a100x8).estimate(plan)
    # Weights: actor (shared by generation and training) + reference + reward.
    weights = (2 * PARAMS_8B + 2 * PARAMS_8B + 2 * PARAMS_8B_REWARD) / GB  # 47.90 GB
    states = 16 * PARAMS_8B / GB  # 131.05 GB
    working = (36 * 35 * 2048 * 4096 + 2048 * 151_936 * 2) / GB  # training is the largest
    need = weights + states + working  # 190.14 GB
    total = 81920 * 2**20 / GB  # the A100-80GB's 81,920 MiB: 85.9 GB
    usable = 0.92 * total  # 79.0 GB
    assert not est.feasible
    expected = (f"device 3 (A100-80GB): needs {need:.1f} GB (weights {weights:.1f}, "
                f"grads+optimizer {states:.1f}, working {working:.1f}) > usable {usable:.1f} GB "
                f"of {total:.1f} GB, over by {need - usable:.1f} GB")
    assert est.violations[0] == expected
    # Nothing is left for the KV cache: generation reports it too.
    assert any("KV cache budget" in v and "stage 0 (A100-80GB)" in v for v in est.violations)
    assert list(est.peak_memory_gb) == [3]
    assert est.peak_memory_gb[3] == pytest.approx(need)


def test_qwen3_14b_ppo_on_eight_l4_is_infeasible():
    wl = workload_preset("qwen3-14b-ppo-sync")
    cluster = homogeneous("L4", 1, 8)
    est = CostModel(wl, cluster).estimate(colocated_plan(wl, cluster, tp=1))
    assert not est.feasible
    memory = [v for v in est.violations if v.startswith("device ")]
    assert len(memory) == 8  # every L4
    assert memory[0].startswith("device 0 (L4): needs ")
    assert "> usable 22.2 GB of 24.2 GB" in memory[0]  # 0.92 x 23,034 MiB
    assert all(gb > 0.92 * 23034 * 2**20 / GB for gb in est.peak_memory_gb.values())


def test_feasible_plan_fits_usable_memory(ppo8b, a100x8):
    est = CostModel(ppo8b, a100x8).estimate(colocated_plan(ppo8b, a100x8, tp=4))
    assert est.feasible and est.violations == ()
    assert sorted(est.peak_memory_gb) == list(range(8))
    assert all(0 < gb <= 0.92 * 80 + 1e-9 for gb in est.peak_memory_gb.values())


def test_async_keeps_a_separate_generation_copy_of_the_actor(a100x8):
    sync = workload_preset("qwen3-8b-ppo-sync")
    asyn = workload_preset("qwen3-8b-ppo-async")
    est_s = CostModel(sync, a100x8).estimate(colocated_plan(sync, a100x8, tp=4))
    est_a = CostModel(asyn, a100x8).estimate(colocated_plan(asyn, a100x8, tp=4))
    # Sync shares one actor copy between generation and training; async holds a second one: the
    # generation shard, 2 B x 8,190,726,144 / 4 (tp) = 4.10 GB more on every device (the KV
    # cache is capped by max_num_seqs = 256 in both, so it is the same).
    assert est_a.generation_concurrency == est_s.generation_concurrency == 256
    for d in range(8):
        assert est_a.peak_memory_gb[d] - est_s.peak_memory_gb[d] == pytest.approx(
            2 * PARAMS_8B / 4 / GB, rel=1e-9)


def test_async_copy_on_one_device(a100x8):
    # Everything on one device (infeasible, so no KV cache fits and peak = resident + working):
    # sync counts the actor once for generation and training, async twice (16.38 GB more).
    wl = fixed_workload()
    asyn = wl.with_(mode="async", staleness=1)
    est_s = CostModel(wl, a100x8).estimate(colocated_plan(wl, a100x8, devices=[0]))
    est_a = CostModel(asyn, a100x8).estimate(colocated_plan(asyn, a100x8, devices=[0]))
    assert est_a.peak_memory_gb[0] - est_s.peak_memory_gb[0] == pytest.approx(
        2 * PARAMS_8B / GB, rel=1e-9)
    assert "weights 64.3," in est_a.violations[0]  # 47.90 + 16.38


def test_activation_coefficient_follows_the_swiglu_width():
    # 34 - 19 (GPT's 4h GeLU MLP) + 2 + 6 f / h: Qwen3-8B f = 3 h -> 35; Qwen2.5-7B
    # f / h = 18944 / 3584 -> 15 + 2 + 31.71 = 48.71; Llama-3.1-8B f / h = 3.5 -> 38.
    assert activation_coeff(model_preset("Qwen3-8B"), 34.0) == 35.0
    assert activation_coeff(model_preset("Qwen2.5-7B"), 34.0) == pytest.approx(17 + 6 * 18944 / 3584)
    assert activation_coeff(model_preset("Llama-3.1-8B"), 34.0) == 38.0
    # the parameter still shifts every model's coefficient one for one
    assert activation_coeff(model_preset("Qwen3-8B"), 30.0) == 31.0


def _rollout_at_tp1_beside_tp4(wl, cluster):
    """Every task at tp 4 on the 8 GPUs but the rollout at tp 1: its shard (the whole model) is
    three quarters of the model more than the trainer's tp-4 shard of the same copy."""
    plan = colocated_plan(wl, cluster, tp=4)
    gen = make_placement("actor_generation", list(range(8)), 8, 1, 1, 36)
    return dataclasses.replace(plan, placements=tuple(
        gen if p.task == "actor_generation" else p for p in plan.placements))


def test_a_sleeping_rollout_holds_its_weights_only_while_it_generates(a100x8):
    asleep = workload_preset("qwen3-8b-grpo-sync")  # gen_sleep_level 1, vLLM's sleep mode
    awake = asleep.with_(gen_sleep_level=0)  # no sleep mode: the weights stay
    plan = _rollout_at_tp1_beside_tp4(asleep, a100x8)
    est_s = CostModel(asleep, a100x8).estimate(plan)
    est_a = CostModel(awake, a100x8).estimate(plan)
    extra = 2 * PARAMS_8B * (1 - 1 / 4) / GB  # the rollout's shard beyond the trainer's
    for d in range(8):
        s, a = est_s.memory.breakdown()[d], est_a.memory.breakdown()[d]
        assert s["rollout_weights"] == pytest.approx(extra, rel=1e-12) and a["rollout_weights"] == 0
        assert s["weights"] + s["rollout_weights"] == pytest.approx(a["weights"], rel=1e-12)
        assert s["states"] == a["states"] and s["working"] == a["working"]
        # the other phases without the rollout's weights, the generation phase with them
        assert s["need"] == pytest.approx(max(s["weights"] + s["states"] + s["working"],
                                              a["weights"] + a["states"]), rel=1e-12)
        assert a["need"] == pytest.approx(a["weights"] + a["states"] + a["working"], rel=1e-12)
        assert s["need"] < a["need"]
        # the rollout's KV pool is what it was: generation is priced as before
        assert s["kv_pool"] == a["kv_pool"] > 0
    assert est_s.tasks["actor_generation"] == est_a.tasks["actor_generation"]


def test_a_device_over_its_memory_names_the_sleeping_rollouts_weights():
    wl = workload_preset("qwen3-8b-grpo-sync")
    l4 = homogeneous("L4", 1, 8)
    est = CostModel(wl, l4).estimate(_rollout_at_tp1_beside_tp4(wl, l4))
    assert not est.feasible
    first = est.violations[0]
    row = est.memory.breakdown()[0]
    assert first.startswith(f"device 0 (L4): needs {row['need']:.1f} GB (weights "
                            f"{row['weights']:.1f}, grads+optimizer {row['states']:.1f}, then the "
                            f"larger of working {row['working']:.1f} and the sleeping rollout's "
                            f"weights {row['rollout_weights']:.1f} while it generates) > usable "
                            "22.2 GB of 24.2 GB, over by ")
    assert row["over"] == pytest.approx(row["need"] - row["usable"])


def test_tensor_parallelism_without_sequence_parallelism_keeps_ten_bytes_whole():
    """Korthikanti et al. 2022: tensor parallelism alone splits sbh x 24 of a GPT layer's
    sbh x 34 over its t ranks and keeps sbh x 10 (norm inputs, dropout masks, the first linear
    layers' inputs) on every rank; with sequence parallelism all 34 are split; under full
    recomputation the layer input (2 bytes) is split or not the same way."""
    m = model_preset("Qwen3-8B")
    coeff = activation_coeff(m, DEFAULT_PARAMS.activation_bytes_per_token_hidden)
    sp, whole = (stage_shapes(m, (36,), 4, True, 2, sequence_parallel=flag)[0]
                 for flag in (True, False))
    tokens, h = 8192, m.hidden
    assert sp.activation_bytes(tokens, False, 34.0) == pytest.approx(36 * coeff * tokens * h / 4)
    assert whole.activation_bytes(tokens, False, 34.0) == pytest.approx(
        36 * (10 + (coeff - 10) / 4) * tokens * h)
    assert sp.activation_bytes(tokens, True, 34.0) == pytest.approx(36 * 2 * tokens * h / 4)
    assert whole.activation_bytes(tokens, True, 34.0) == pytest.approx(36 * 2 * tokens * h)
    one = stage_shapes(m, (36,), 1, True, 2, sequence_parallel=False)[0]  # tp 1: nothing to split
    assert one.activation_bytes(tokens, False, 34.0) == pytest.approx(36 * coeff * tokens * h)
    # a workload says it; the file keeps it only when off
    wl = workload_preset("qwen3-8b-ppo-sync")
    assert wl.sequence_parallel and "sequence_parallel" not in wl.to_dict()
    off = wl.with_(sequence_parallel=False)
    assert off.to_dict()["sequence_parallel"] is False
    plan = colocated_plan(off, homogeneous("A100-80GB", 1, 8), tp=4)
    train = plan.placement("actor_training")
    working = {flag: CostModel(w, homogeneous("A100-80GB", 1, 8)).placement_memory(train).working[0]
               for flag, w in ((True, wl), (False, off))}
    assert working[False] > working[True]
