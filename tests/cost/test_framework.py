"""The per-step framework costs (hetrl.cost.framework): every task call pays them, in the cost
model and the simulator alike, and they do not shrink with more GPUs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hetrl.cost.framework import task_framework_seconds
from hetrl.cost.lengths import length_stats
from hetrl.cost.model import CostModel
from hetrl.cost.params import DEFAULT_PARAMS
from hetrl.spec.presets import cluster_preset, workload_preset
from sim.driver import simulate
from tests.cost.plans import split_plan

NONE = replace(DEFAULT_PARAMS, task_call_s=0.0, driver_s_per_token=0.0,
               rule_reward_s_per_sequence=0.0, decode_s_per_token=0.0,
               micro_batch_overhead_s=0.0)


def test_each_term_of_one_call():
    p = replace(NONE, task_call_s=0.5, driver_s_per_token=1e-6, rule_reward_s_per_sequence=1e-3)
    assert task_framework_seconds("inference", 100, 2e5, True, p) == pytest.approx(0.5 + 0.2)
    # the rule reward is scored once, after generation
    assert task_framework_seconds("generation", 100, 2e5, True, p) == pytest.approx(0.8)
    assert task_framework_seconds("generation", 100, 2e5, False, p) == pytest.approx(0.7)


@pytest.mark.parametrize("field, value", [("task_call_s", -1.0), ("driver_s_per_token", -1e-9)])
def test_negative_costs_are_refused(field, value):
    from hetrl.errors import SpecError

    with pytest.raises(SpecError) as err:
        replace(NONE, **{field: value})
    assert err.value.field == f"params.{field}"


def test_a_colocated_sync_plan_pays_every_call_in_series_and_the_simulator_agrees():
    wl, cl = workload_preset("qwen3-8b-ppo-sync"), cluster_preset("a100x8")
    plan = split_plan(wl, cl, [(wl.task_names, range(8), 4)])
    per_call = replace(NONE, task_call_s=2.0, driver_s_per_token=1e-6)
    tokens = wl.samples * (wl.prompt_length.max + wl.response_length.max)  # padded
    base = CostModel(wl, cl, NONE).estimate(plan)
    with_fw = CostModel(wl, cl, per_call).estimate(plan)
    calls = len(wl.task_names)  # one group: the tasks run one after another
    expected = calls * (2.0 + 1e-6 * tokens)
    assert with_fw.iteration_s - base.iteration_s == pytest.approx(expected, rel=1e-9)
    assert with_fw.parts["actor_training"]["framework"] == pytest.approx(2.0 + 1e-6 * tokens)
    sim_base = simulate(plan, wl, cl, 2, params=NONE).iteration_s
    sim_fw = simulate(plan, wl, cl, 2, params=per_call).iteration_s
    # (the driver's padded batch is the same in the simulator, whatever lengths it draws)
    assert sim_fw - sim_base == pytest.approx(expected, rel=0.02)


def test_disjoint_groups_overlap_their_calls():
    """A task on its own GPUs pays its call in parallel with the tasks beside it."""
    wl, cl = workload_preset("qwen3-8b-grpo-sync"), cluster_preset("a100x8")
    names = wl.task_names
    rest = [t for t in names if t not in ("actor_generation", "reward_inference")]
    plan = split_plan(wl, cl, [(["actor_generation"], range(4), 4),
                               (["reward_inference"], range(4, 6), 2), (rest, range(6, 8), 2)])
    per_call = replace(NONE, task_call_s=3.0)
    grow = CostModel(wl, cl, per_call).estimate(plan).iteration_s - \
        CostModel(wl, cl, NONE).estimate(plan).iteration_s
    # generation, then the inference stage's calls, then training's: reward_inference beside
    # the reference's call, so fewer than one call per task is on the critical path
    assert grow < 3.0 * len(names) - 1.0
    assert grow >= 3.0 * 3 - 1e-9


def test_the_engines_host_work_per_generated_token():
    """``decode_s_per_token``: every running sequence costs it every decode step, so a replica
    pays it once per generated token; the simulator's decode steps pay the same."""
    wl, cl = workload_preset("qwen3-8b-grpo-sync"), cluster_preset("a100x8")
    plan = split_plan(wl, cl, [(wl.task_names, range(8), 4)])
    per_token = replace(NONE, decode_s_per_token=2e-5)
    base = CostModel(wl, cl, NONE).estimate(plan).tasks["actor_generation"]
    more = CostModel(wl, cl, per_token).estimate(plan).tasks["actor_generation"]
    replica_tokens = wl.samples / 2 * length_stats(wl).response_mean  # dp = 2 replicas
    assert more - base == pytest.approx(2e-5 * replica_tokens, rel=1e-9)
    sim = [simulate(plan, wl, cl, 1, params=p).metrics["tasks"]["actor_generation"]
           for p in (NONE, per_token)]
    assert sim[1] - sim[0] == pytest.approx(2e-5 * replica_tokens, rel=0.1)


@pytest.mark.parametrize("pp", [1, 2])
def test_a_fixed_cost_per_micro_batch_pass(pp):
    """``micro_batch_overhead_s``: each stage pays it per micro-batch pass (x3 for a training
    forward+backward), m + pp - 1 slots on a pipeline's critical path; the simulator's passes
    pay the same."""
    wl, cl = workload_preset("qwen3-8b-grpo-sync"), cluster_preset("a100x8")
    plan = split_plan(wl, cl, [(wl.task_names, range(8), 2)], pp=pp)
    fixed = replace(NONE, micro_batch_overhead_s=0.05)
    base = CostModel(wl, cl, NONE).estimate(plan).tasks
    more = CostModel(wl, cl, fixed).estimate(plan).tasks
    dp = 8 // (2 * pp)
    per_replica = wl.samples / dp
    m_inf = -(-per_replica // wl.inference_micro_batch_size)
    m_train = -(-per_replica / wl.optimizer_steps // wl.micro_batch_size)
    assert more["reference_inference"] - base["reference_inference"] == pytest.approx(
        (m_inf + pp - 1) * 0.05, rel=1e-9)
    assert more["actor_training"] - base["actor_training"] == pytest.approx(
        wl.optimizer_steps * (m_train + pp - 1) * 3 * 0.05, rel=1e-9)
    sim = [simulate(plan, wl, cl, 1, params=p).metrics["tasks"]["reference_inference"]
           for p in (NONE, fixed)]
    assert sim[1] - sim[0] == pytest.approx((m_inf + pp - 1) * 0.05, rel=0.15)
