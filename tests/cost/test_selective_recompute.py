"""Selective activation recomputation (``recompute: selective``, torchtitan's op policy): a
layer keeps its matmul outputs except every second one and the attention's output, and runs
the matmuls it dropped again in the backward pass -- less memory than none, more time; more
memory than full recomputation, less time. Public T4 (torchtitan, Llama 3.1 8B on 8 H100 at 16K
tokens per GPU) ran with it and is feasible only when it is priced."""

from __future__ import annotations

import pytest
import yaml

from hetrl.cost import CostModel
from hetrl.cost.flops import (
    activation_coeff,
    selective_activation_coeff,
    selective_recompute_share,
    stage_shapes,
    training_flops_mult,
)
from hetrl.errors import SpecError
from hetrl.export import openrlhf as orl
from hetrl.export.verl_keys import check_workload as check_verl
from hetrl.plan import colocated_plan
from hetrl.spec.model import resolve_model
from hetrl.spec.presets import cluster_preset, workload_preset
from hetrl.spec.workload import WorkloadSpec
from sim.driver import simulate


def test_the_selective_inventory_of_a_llama_layer():
    """Llama-3.1-8B (h 4096, 32 heads of 128, 8 KV heads, f 14336): the layer input (h), the
    kept matmul outputs q, v, gate, down (4096 + 1024 + 14336 + 4096), the attention's output
    (4096), 2 bytes each, and a 4-byte log-sum-exp per head; the k, o and up projections run
    again: (1024 + 4096 + 14336) / (2 x 4096 + 2 x 1024 + 3 x 14336) of the matmul FLOPs."""
    m = resolve_model("Llama-3.1-8B")
    values = 4096 + (4096 + 1024 + 14336 + 4096) + 4096
    assert selective_activation_coeff(m) == (2 * values + 4 * 32) / 4096 == 15.53125
    assert selective_recompute_share(m) == 19456 / 53248
    assert activation_coeff(m, 34.0) == 38.0  # none keeps 2.4x as much
    assert (training_flops_mult(m, False), training_flops_mult(m, True)) == (3.0, 4.0)
    assert training_flops_mult(m, "selective") == 3.0 + 19456 / 53248
    (shape,) = stage_shapes(m, (32,), 1, True, 2)
    tokens = 16384.0
    assert shape.activation_bytes(tokens, "selective", 34.0) == 32 * 15.53125 * tokens * 4096
    assert shape.activation_bytes(tokens, "none", 34.0) == shape.activation_bytes(tokens, False,
                                                                                  34.0)


def _three(preset: str) -> list[WorkloadSpec]:
    wl = workload_preset(preset)
    return [wl.with_(recompute=r) for r in (False, "selective", True)]


def test_selective_lies_between_none_and_full_in_memory_and_time():
    cl = cluster_preset("a100x8")
    none, selective, full = _three("qwen3-8b-grpo-sync")
    plan = colocated_plan(none, cl, tp=2)
    placement = plan.placement("actor_training")
    working = [CostModel(w, cl).placement_memory(placement).working[0]
               for w in (none, selective, full)]
    seconds = [CostModel(w, cl).estimate(plan).tasks["actor_training"]
               for w in (none, selective, full)]
    assert working[0] > working[1] > working[2]
    assert seconds[0] < seconds[1] < seconds[2]


def test_the_simulator_replays_selective_recomputation_as_the_model_prices_it():
    """The training task's simulated time moves from none to selective as its estimate does."""
    cl = cluster_preset("a100x8")
    none, selective, _ = _three("qwen3-8b-grpo-sync")
    plan = colocated_plan(none, cl, tp=2)
    est = [CostModel(w, cl).estimate(plan).tasks["actor_training"] for w in (none, selective)]
    sim = []
    for w in (none, selective):
        trace = simulate(plan, w, cl, iterations=1).trace
        spans = trace.spans_of("task", "actor_training")
        sim.append(sum(s.duration_s for s in spans))
    assert sim[1] > sim[0]
    assert sim[1] / sim[0] == pytest.approx(est[1] / est[0], rel=0.05)


def test_selective_round_trips_and_a_task_may_set_it_alone():
    wl = workload_preset("qwen3-8b-ppo-sync")
    own = WorkloadSpec.from_dict({**wl.to_dict(),
                                  "task_batching": {"critic_training": {"recompute": "selective"}}})
    assert (own.task_recompute_mode("critic_training"), own.task_recompute_mode("actor_training"),
            own.task_recompute("critic_training")) == ("selective", "none", False)
    assert WorkloadSpec.from_dict(yaml.safe_load(yaml.safe_dump(own.to_dict()))) == own
    assert own.selective_recompute_task() == "critic_training"


@pytest.mark.parametrize("change, field, words", [
    ({"recompute": "partial"}, "recompute", "true or false"),
    ({"recompute": "Selective"}, "recompute", "selective"),
    ({"task_batching": {"actor_training": {"recompute": "ops"}}},
     "task_batching.actor_training.recompute", "true or false"),
])
def test_bad_recompute_names_the_field(change, field, words):
    base = workload_preset("qwen3-8b-grpo-sync").to_dict()
    with pytest.raises(SpecError) as err:
        WorkloadSpec.from_dict({**base, **change})
    assert err.value.field == field
    assert words in str(err.value)


def test_selective_is_refused_for_a_mixture_of_experts():
    """The op policy's inventory is a dense layer's; an MoE layer's grouped expert matmuls are
    another inventory, not priced."""
    base = workload_preset("qwen3-30b-a3b-grpo-sync").to_dict()
    change, field, words = {"recompute": "selective"}, "recompute", "mixture of experts"
    with pytest.raises(SpecError) as err:
        WorkloadSpec.from_dict({**base, **change})
    assert err.value.field == field
    assert words in str(err.value)


def test_the_exports_refuse_what_their_framework_cannot_run():
    wl = workload_preset("qwen3-8b-grpo-sync").with_(recompute="selective")
    with pytest.raises(SpecError, match="verl 0.9.1 has no op-level selective") as err:
        check_verl(wl)
    assert err.value.field == "recompute"
    with pytest.raises(SpecError, match="OpenRLHF 0.11.2 has no selective") as err:
        orl.check_workload(wl, None, None)
    assert err.value.field == "recompute"


@pytest.mark.parametrize("framework", ["verl", "openrlhf"])
def test_a_search_kept_to_a_framework_refuses_selective_before_it_starts(framework):
    """`hetrl plan --launch-with` checks the workload once, before the search: a workload the
    framework cannot run whatever the plan is refused naming the field, not searched until
    every proposal has been refused."""
    from hetrl.export.launchable import check_workload

    wl = workload_preset("qwen3-8b-grpo-sync").with_(recompute="selective")
    with pytest.raises(SpecError) as err:
        check_workload(framework, wl)
    assert err.value.field == "recompute"
