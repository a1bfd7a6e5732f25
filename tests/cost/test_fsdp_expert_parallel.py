"""FSDP with expert parallelism (``backend: fsdp`` with ``ep`` > 1), as torchtitan and NeMo
AutoModel train mixture-of-experts models: the non-expert weights, gradients and Adam states
are sharded over the dp ranks, each rank's experts (experts / ep of them) over the dp / ep ranks
holding the same ones; tokens go to their experts by all-to-all. Public T5 (Qwen3-30B-A3B,
FSDP 8 x EP 8 on 8 H100) ran so, and was infeasible while the plan had to be Megatron's."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hetrl.cost import CostModel
from hetrl.cost.flops import stage_shapes
from hetrl.export.verl import verl_layout
from hetrl.plan import colocated_plan, validate
from hetrl.spec.cluster import ClusterSpec, NodeSpec
from hetrl.spec.model import resolve_model
from hetrl.spec.presets import workload_preset
from sim.driver import simulate

H100X16 = ClusterSpec("h100x16", (NodeSpec("n0", "H100", 8, "us-east-1"),
                                  NodeSpec("n1", "H100", 8, "us-east-1")))


def _fsdp(wl, ep: int):
    """Every task on the 16 GPUs; the actor's training and reference as FSDP with ``ep``."""
    plan = colocated_plan(wl, H100X16, tp=1, ep=ep)
    for task in ("actor_training", "reference_inference"):
        plan = plan.with_placement(replace(plan.placement(task), backend="fsdp"))
    return plan


def test_a_rank_shards_as_many_parameters_with_expert_parallelism_as_without():
    """FSDP over 16 ranks keeps 1/16 of every parameter; with ep 4 a rank holds a quarter of
    the experts, sharded over the 4 ranks holding the same quarter: 1/16 of the experts again."""
    m = resolve_model("Qwen3-30B-A3B")
    (whole,) = stage_shapes(m, (m.layers,), 1, True, 2)
    (ep4,) = stage_shapes(m, (m.layers,), 1, True, 2, 4)
    assert ep4.params < whole.params
    assert ep4.dp_sharded_params == pytest.approx(whole.params, rel=1e-12)
    assert whole.dp_sharded_params == whole.params


def test_fsdp_with_expert_parallelism_validates_fits_and_pays_its_all_to_alls():
    wl = workload_preset("qwen3-30b-a3b-grpo-sync")
    plain, expert = _fsdp(wl, 1), _fsdp(wl, 4)
    validate(expert, wl, H100X16)
    model = CostModel(wl, H100X16)
    a, b = model.estimate(plain), model.estimate(expert)
    assert b.feasible
    assert b.parts["actor_training"]["ep"] > 0 == a.parts["actor_training"]["ep"]
    train = expert.placement("actor_training")
    # the states are the same shard; each gathered layer holds a quarter of the experts
    mem_a = model.placement_memory(plain.placement("actor_training"))
    mem_b = model.placement_memory(train)
    assert mem_b.states[0] == pytest.approx(mem_a.states[0], rel=1e-12)
    assert mem_b.weights[0] == pytest.approx(mem_a.weights[0], rel=1e-12)


def test_the_simulator_replays_fsdp_with_expert_parallelism_near_its_estimate():
    wl = workload_preset("qwen3-30b-a3b-grpo-sync")
    plan = _fsdp(wl, 4)
    est = CostModel(wl, H100X16).estimate(plan)
    result = simulate(plan, wl, H100X16, iterations=2)
    assert result.iteration_s == pytest.approx(est.iteration_s, rel=0.15)
    trained = [s for s in result.trace.spans
               if s.name == "all-to-all" and s.task == "actor_training"]
    assert trained and all(s.bytes > 0 for s in trained)


def test_verl_runs_it_without_expert_parallelism_and_says_so():
    """verl's FSDP workers have no expert parallelism: the export's closest plan has ep 1."""
    wl = workload_preset("qwen3-30b-a3b-grpo-sync")
    layout = verl_layout(_fsdp(wl, 4), wl, H100X16)
    assert any("verl's FSDP workers have no expert parallelism" in n for n in layout.notes)
    assert "actor" not in layout.expert


def test_the_search_space_has_fsdp_layouts_with_expert_parallelism_and_they_validate():
    """With fsdp among the workload's backends, an MoE task's FSDP layouts come with every
    expert parallelism the Megatron ones have; each decodes to a placement that validates."""
    from hetrl.plan import make_placement
    from hetrl.search.space import layout_key, layouts, placement_fields, with_backends

    wl = workload_preset("qwen3-30b-a3b-grpo-sync").with_(backends=("megatron", "fsdp"))
    model = wl.model("actor")
    options = with_backends("training", layouts(model, 16), wl.backends, model)
    fsdp_ep = [x for x in options if placement_fields(x)[3] == "fsdp" and placement_fields(x)[5] > 1]
    assert {placement_fields(x)[5] for x in fsdp_ep} == {2, 4, 8, 16}
    assert sorted(options, key=layout_key)  # one order over every kind of layout
    plan = colocated_plan(wl, H100X16, tp=1)
    for lay in fsdp_ep:
        dp, pp, tp, backend, offload, ep = placement_fields(lay)
        p = make_placement("actor_training", range(16), dp, pp, tp, model.layers,
                           backend=backend, offload=offload, ep=ep)
        validate(plan.with_placement(p), wl, H100X16)


def test_a_search_that_may_use_fsdp_returns_a_valid_plan():
    from hetrl.search import Budget, get_scheduler

    wl = workload_preset("qwen3-30b-a3b-grpo-sync").with_(backends=("megatron", "fsdp"))
    found = get_scheduler("hetrl").search(wl, H100X16, Budget(evaluations=300, seed=0))
    validate(found.plan, wl, H100X16)
    assert found.estimate.feasible
