"""Mixture-of-experts RL iterations on the real backend (CPU, gloo): tiny-qwen3-moe's GRPO and
PPO trainers with expert parallelism 2, on the torch trainer and on megatron-core's MoE layer,
against the cost model's count of the all-to-all bytes and against the same run without expert
parallelism.

Each run costs ~25 s on 2 cores, so runs are module-scoped and each test reads several facts.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("ray")

from hetrl.cost.expert_parallel import dispatch_bytes  # noqa: E402
from hetrl.cost.flops import collectives_per_layer, stage_shapes  # noqa: E402
from hetrl.errors import SpecError  # noqa: E402
from hetrl.io import load_plan  # noqa: E402
from hetrl.spec.presets import cluster_preset, workload_preset  # noqa: E402
from real.placement import check_supported  # noqa: E402
from real.runner import RunConfig, run_plan  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
GRPO_PLAN = "plan-tiny-moe-grpo-tiny4.yaml"
PPO_PLAN = "plan-tiny-moe-ppo-tiny4.yaml"


def _without_ep(plan):
    return replace(plan, placements=tuple(replace(p, ep=1) for p in plan.placements))


@pytest.fixture(scope="module")
def grpo():
    """The GRPO plan (actor training dp 4, ep 2, uneven data shares) on two regions, and the
    same plan with ep 1 (every replica holds every expert) on the same seed."""
    wl, cl = workload_preset("tiny-moe-grpo-sync"), cluster_preset("tiny4-two-region")
    plan = load_plan(EXAMPLES / GRPO_PLAN)
    config = RunConfig(iterations=2, seed=3)
    return wl, plan, {"ep2": run_plan(wl, cl, plan, config),
                      "ep1": run_plan(wl, cl, _without_ep(plan), config)}


def _spans(res, suffix: str):
    return [s for s in res.trace.spans if s.name.endswith(suffix)]


def test_alltoall_bytes_equal_the_cost_models_count(grpo):
    """Per expert-parallel group and iteration, the bytes the real all-to-alls sent equal the
    cost model's count for the tokens the MoE layers routed (collectives_per_layer x
    dispatch_bytes per MoE layer, balanced load): exactly in expectation, here within 5% (the
    router's own choice of experts is a sample)."""
    wl, plan, runs = grpo
    shape = stage_shapes(wl.model("actor"), (4,), 1, True, 4, ep=2, expert_load=1.0)[0]
    real, counted = defaultdict(float), defaultdict(float)
    spans = _spans(runs["ep2"], "expert all-to-all")
    assert len(spans) == 2 * 4  # every replica, every iteration
    for s in spans:
        key = (tuple(s.devices), s.iteration)
        real[key] += s.bytes
        counted[key] += (shape.moe_layers * collectives_per_layer("training", False)
                         * dispatch_bytes(shape, s.meta["tokens"]))
    assert {k[0] for k in real} == {(0, 1), (2, 3)}
    for key, nbytes in real.items():
        assert nbytes == pytest.approx(counted[key], rel=0.05), key


def test_expert_groups_exchange_alike_and_sum_expert_gradients(grpo):
    """Replicas of one expert group run as many all-to-alls (replica 0's double share is
    matched by padding micro-batches on replica 1); experts' gradients are summed over the
    replicas holding the same experts (0 and 2, 1 and 3), the dense ones over all four; the
    experts are gathered before every verified weight sync."""
    _, plan, runs = grpo
    res = runs["ep2"]
    calls = defaultdict(set)
    for s in _spans(res, "expert all-to-all"):
        calls[(tuple(s.devices), s.iteration)].add(s.meta["calls"])
    assert all(len(c) == 1 for c in calls.values())
    assert calls[((0, 1), 0)] == {2 * calls[((2, 3), 0)].pop()}  # 2 micro-batches against 1
    assert {tuple(s.devices) for s in _spans(res, "expert grad all-reduce")} == {(0, 2), (1, 3)}
    assert {tuple(s.devices) for s in _spans(res, "actor_training grad all-reduce")} == {
        (0, 1, 2, 3)}
    assert len(_spans(res, "expert gather")) == 2 * 4
    assert res.weights_verified == 2 * 4


def test_expert_parallel_training_equals_whole_experts(grpo):
    """Iteration 0 trains on the same rollouts from the same weights: with ep 2 the losses are
    those of the run whose replicas hold every expert (the all-to-alls change only the order of
    the sums), and the rewards of both iterations agree."""
    _, _, runs = grpo
    ep2, ep1 = runs["ep2"].stats[0], runs["ep1"].stats[0]
    assert ep2.keys() == ep1.keys() and ep2
    for k in ep2:
        assert ep2[k] == pytest.approx(ep1[k], rel=1e-4, abs=1e-6), k
    assert runs["ep2"].rewards[0] == runs["ep1"].rewards[0]


@pytest.fixture(scope="module")
def ppo(tmp_path_factory):
    """PPO with both trainers ep 2 (the critic is the MoE with a value head) on the torch
    trainer: one iteration and a checkpoint, then a resumed second one; and one iteration on
    megatron-core's MoE layer (--engines training=megatron), the same seed."""
    wl, cl = workload_preset("tiny-moe-ppo-sync"), cluster_preset("tiny4-single-region")
    plan = load_plan(EXAMPLES / PPO_PLAN)
    ckpt = str(tmp_path_factory.mktemp("ckpt"))
    first = run_plan(wl, cl, plan, RunConfig(iterations=1, checkpoint_dir=ckpt))
    second = run_plan(wl, cl, plan, RunConfig(iterations=2, checkpoint_dir=ckpt, resume=True))
    megatron = run_plan(wl, cl, plan, RunConfig(iterations=1,
                                                engines=(("training", "megatron"),)))
    return wl, first, second, megatron


def test_ppo_with_expert_parallel_actor_and_critic_resumes(ppo):
    """The resumed run's generators and critic inference start from the restored trainers'
    gathered experts (verified by digest)."""
    _, first, second, _ = ppo
    assert {tuple(s.devices) for s in _spans(first, "expert all-to-all")} == {(0, 1), (2, 3)}
    assert second.resumed_from == 1
    # the count goes on from the checkpoint's: the resume's syncs (2 generators + 2 critic
    # inference) and iteration 1's (as many)
    assert second.weights_verified == first.weights_verified + 8
    # the trace goes on from the checkpoint's too
    assert {s.iteration for s in _spans(second, "expert all-to-all")} == {0, 1}


def test_megatron_moe_layer_trains_as_the_torch_trainer(ppo):
    """megatron-core's MoELayer (router, all-to-all token dispatcher, experts over ep 2) in
    both trainers: iteration 0's losses and statistics equal the torch trainer's to 1e-4, and
    its all-to-all bytes (hidden states and routing probabilities, counted at megatron-core's
    dispatcher) are within 5% of the cost model's count for the tokens routed."""
    wl, first, _, megatron = ppo
    assert megatron.stats[0].keys() == first.stats[0].keys()
    for k, v in first.stats[0].items():
        assert megatron.stats[0][k] == pytest.approx(v, rel=1e-4, abs=1e-6), k
    assert megatron.weights_verified == first.weights_verified
    for task, role in (("actor_training", "actor"), ("critic_training", "critic")):
        shape = stage_shapes(wl.model(role), (4,), 1, role == "actor", 4, ep=2,
                             expert_load=1.0)[0]
        spans = [s for s in _spans(megatron, "expert all-to-all") if s.task == task]
        assert len(spans) == 2  # one per replica
        counted = sum(shape.moe_layers * collectives_per_layer("training", False)
                      * dispatch_bytes(shape, s.meta["tokens"]) for s in spans)
        assert sum(s.bytes for s in spans) == pytest.approx(counted, rel=0.05), task


@pytest.mark.parametrize("task, change, message", [
    ("actor_generation", {"ep": 2}, "training tasks only"),
    ("actor_training", {"ep": 2, "pp": 2}, "pp = 1"),
])
def test_unsupported_expert_parallel_layouts_are_refused(task, change, message):
    wl = workload_preset("tiny-moe-grpo-sync")
    plan = load_plan(EXAMPLES / GRPO_PLAN)
    p = plan.placement(task)
    if "pp" in change:  # two replicas of two stages on the four devices
        change = dict(change, dp=2, devices=(((0,), (1,)), ((2,), (3,))),
                      layers_per_stage=(2, 2), data_weights=(1.0, 1.0))
    bad = replace(plan, placements=tuple(replace(q, **change) if q is p else q
                                         for q in plan.placements))
    with pytest.raises(SpecError, match=message):
        check_supported(bad, wl)


def test_megatron_engine_moe_with_tp_is_refused():
    wl = workload_preset("tiny-moe-grpo-sync")
    plan = load_plan(EXAMPLES / GRPO_PLAN)
    p = plan.placement("actor_training")
    bad = replace(plan, placements=tuple(
        replace(q, dp=2, tp=2, devices=(((0, 1),), ((2, 3),)), data_weights=(1.0, 1.0))
        if q is p else q for q in plan.placements))
    with pytest.raises(SpecError, match="sequence parallelism"):
        check_supported(bad, wl, {"training": "megatron"})
