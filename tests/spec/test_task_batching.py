"""Per-task micro-batching and padding (``task_batching``): verl sets each role's micro-batch
and ``use_remove_padding`` apart, and a critic at micro-batch 1 without remove-padding costs a
multiple of the actor's passes."""

from __future__ import annotations

import pytest
import yaml

from hetrl.cost.batching import Batching, micro_batching
from hetrl.cost.model import CostModel
from hetrl.errors import SpecError
from hetrl.spec.presets import cluster_preset
from hetrl.spec.workload import WorkloadSpec
from tests.cost.plans import split_plan

BASE = {"algorithm": "ppo", "reward": "rule", "model": "Qwen2.5-7B", "batch_prompts": 64,
        "responses_per_prompt": 4, "prompt_length": {"mean": 128, "max": 256, "std": 64},
        "response_length": {"mean": 300, "max": 1024, "std": 200},
        "micro_batch_size": 16, "inference_micro_batch_size": 32}
#: verl without remove-padding runs the rollout's padded tensors (prompt max + response max)
SLOW_CRITIC = {"critic_inference": {"micro_batch_size": 1, "remove_padding": False,
                                    "pad_to": "max"},
               "critic_training": {"micro_batch_size": 1, "remove_padding": False,
                                   "pad_to": "max"}}


def test_a_task_of_its_own_overrides_the_workload_and_round_trips():
    wl = WorkloadSpec.from_dict({**BASE, "task_batching": SLOW_CRITIC})
    assert wl.task_batching_of("critic_training").micro_batch_size == 1
    assert wl.task_batching_of("actor_training") is None
    assert micro_batching(wl, "training", "actor_training") == 16
    own = micro_batching(wl, "training", "critic_training")
    assert isinstance(own, Batching) and (own.sequences, own.padding) == (1, "max")
    assert micro_batching(wl, "inference", "actor_inference") == 32
    again = WorkloadSpec.from_dict(yaml.safe_load(yaml.safe_dump(wl.to_dict())))
    assert again == wl
    # a token budget of the workload gives way to a task's own count
    tok = WorkloadSpec.from_dict({**BASE, "micro_batch_tokens": 8192,
                                  "task_batching": {"critic_training": {"micro_batch_size": 2}}})
    assert micro_batching(tok, "training", "critic_training") == 2
    assert micro_batching(tok, "training", "actor_training").tokens == 8192


def test_the_unpadded_critic_at_micro_batch_1_costs_a_multiple_of_the_actor():
    cl = cluster_preset("a100x8")
    same = WorkloadSpec.from_dict(BASE)
    slow = WorkloadSpec.from_dict({**BASE, "task_batching": SLOW_CRITIC})
    times = {}
    for name, wl in (("same", same), ("slow", slow)):
        plan = split_plan(wl, cl, [(wl.task_names, range(8), 1)])
        times[name] = CostModel(wl, cl).estimate(plan).tasks
    # the actor's and the reference's passes do not move; the critic's grow
    for task in ("actor_training", "actor_inference"):
        assert times["slow"][task] == pytest.approx(times["same"][task], rel=1e-12)
    assert times["slow"]["critic_training"] > 1.5 * times["same"]["critic_training"]
    assert times["slow"]["critic_inference"] > 1.5 * times["same"]["critic_inference"]


@pytest.mark.parametrize("change, field", [
    ({"actor_generation": {"micro_batch_size": 2}}, "task_batching.actor_generation"),
    ({"reward_inference": {"micro_batch_size": 2}}, "task_batching.reward_inference"),
    ({"critic_training": {"micro_batch_size": 0}}, "task_batching.critic_training.micro_batch_size"),
    ({"critic_training": {"remove_padding": "no"}}, "task_batching.critic_training.remove_padding"),
    ({"critic_training": {"micro_batch_tokens": 100}},
     "task_batching.critic_training.micro_batch_tokens"),
    ({"critic_training": {"pad_to": "max"}}, "task_batching.critic_training.pad_to"),
    ({"critic_training": {"remove_padding": False, "pad_to": "most"}},
     "task_batching.critic_training.pad_to"),
    ({"critic_training": {"mbs": 2}}, "task_batching.critic_training.mbs"),
    ({"critic_training": {"recompute": "yes"}}, "task_batching.critic_training.recompute"),
    ({"critic_inference": {"recompute": True}}, "task_batching.critic_inference.recompute"),
    ({"critic_training": 2}, "task_batching.critic_training"),
])
def test_bad_task_batching_names_the_field(change, field):
    with pytest.raises(SpecError) as err:
        WorkloadSpec.from_dict({**BASE, "task_batching": change})
    assert err.value.field == field


def test_a_training_task_recomputes_activations_on_its_own():
    """verl sets gradient checkpointing per model (TinyZero's run, public S15: the critic's on,
    the actor's off): the critic pays a fourth forward pass and keeps one tensor per layer, the
    actor is priced as before."""
    cl = cluster_preset("a100x8")
    plain = WorkloadSpec.from_dict(BASE)
    own = WorkloadSpec.from_dict({**BASE, "task_batching": {"critic_training": {"recompute": True}}})
    assert (own.task_recompute("critic_training"), own.task_recompute("actor_training")) == \
        (True, False)
    assert WorkloadSpec.from_dict(yaml.safe_load(yaml.safe_dump(own.to_dict()))) == own
    plan = split_plan(plain, cl, [(plain.task_names, range(8), 1)])
    before, after = CostModel(plain, cl), CostModel(own, cl)
    est0, est1 = before.estimate(plan), after.estimate(plan)
    assert est1.tasks["actor_training"] == est0.tasks["actor_training"]
    assert est1.tasks["critic_training"] > est0.tasks["critic_training"]
    critic = plan.placement("critic_training")
    assert after.placement_memory(critic).working[0] < before.placement_memory(critic).working[0]
    actor = plan.placement("actor_training")
    assert after.placement_memory(actor).working[0] == before.placement_memory(actor).working[0]
