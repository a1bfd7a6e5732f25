"""FSDP (ZeRO-3) placements: memory that makes verl's FSDP PPO recipe fit, time with the
weight gathers overlapped, offload, plan files and validation, and the simulator's agreement."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hetrl.cost.model import CostModel
from hetrl.errors import SpecError
from hetrl.plan import Plan, TaskGroup, TaskPlacement, make_placement, validate
from hetrl.spec.cluster import ClusterSpec, NodeSpec, RegionLink
from hetrl.spec.lengths import LengthDist
from hetrl.spec.model import model_preset
from hetrl.spec.presets import cluster_preset
from hetrl.spec.workload import WorkloadSpec


def verl_ppo_7b(**kw) -> WorkloadSpec:
    """verl's FSDP PPO example as its script sets it (examples/ppo_trainer/
    run_deepseek7b_llm.sh): a 7B actor and critic, 1024 prompts, prompts and responses up to 512
    tokens, mini-batch 256 (4 optimizer steps), micro-batch 16 per GPU, log-prob micro-batch
    32, gradient checkpointing, a rule reward; Qwen2.5-7B stands in for the 7B shape."""
    m = model_preset("Qwen2.5-7B")
    base = dict(name="verl-ppo-7b", algorithm="ppo", mode="sync", reward="rule",
                models=(("actor", m), ("reference", m), ("critic", m)), batch_prompts=1024,
                responses_per_prompt=1, prompt_length=LengthDist(mean=256, max=512, min=16, std=128),
                response_length=LengthDist(mean=256, max=512, min=1, std=128),
                recompute_logprobs=True, recompute=True, micro_batch_size=16,
                inference_micro_batch_size=32, optimizer_steps=4)
    return WorkloadSpec(**{**base, **kw})


def colocated(wl: WorkloadSpec, n: int, backend: str, gen_tp: int = 4,
              offload: tuple[str, ...] = ()) -> Plan:
    """verl's hybrid engine: every task on all n GPUs, rollout at tp ``gen_tp``, every other
    task data-parallel over all of them with ``backend``."""
    devs = tuple(range(n))
    layers = wl.model("actor").layers
    pls = [make_placement(t, devs, n // gen_tp, 1, gen_tp, layers) if t == "actor_generation"
           else make_placement(t, devs, n, 1, 1, layers, backend=backend, offload=t in offload)
           for t in wl.task_names]
    return Plan((TaskGroup(wl.task_names, devs),), tuple(pls))


def test_verl_fsdp_ppo_recipe_fits_and_generates_at_full_concurrency():
    """Megatron-style memory (full bf16 weights and fp32 gradients on every GPU) puts the recipe
    at ~131 GB per 80 GB GPU and its generation at concurrency 1; with FSDP it fits and vLLM
    decodes at its max_num_seqs."""
    wl, cl = verl_ppo_7b(), cluster_preset("a100x8")
    model = CostModel(wl, cl)
    megatron = model.estimate(colocated(wl, 8, "megatron"))
    assert not megatron.feasible and max(megatron.peak_memory_gb.values()) > 120
    assert megatron.generation_concurrency == 1
    fsdp = model.estimate(colocated(wl, 8, "fsdp"))
    assert fsdp.feasible and max(fsdp.peak_memory_gb.values()) < 0.92 * 80
    assert fsdp.generation_concurrency == wl.gen_max_concurrency
    assert fsdp.iteration_s < megatron.iteration_s / 3


def test_fsdp_shards_the_states_over_the_group():
    """A trained model's resident bytes per GPU fall as 1/dp: its fp32 parameters (the master
    copy: no bf16 shard besides them), gradients and Adam m and v are all sharded, 16 bytes per
    parameter in all."""
    wl, cl = verl_ppo_7b(), cluster_preset("paper24-a100-single-region")
    model = CostModel(wl, cl)
    layers = wl.model("actor").layers
    weights, states = {}, {}
    for n in (8, 16):
        p = make_placement("actor_training", tuple(range(n)), n, 1, 1, layers, backend="fsdp")
        weights[n] = float(model.placement_memory(p).weights.max())
        states[n] = float(model.placement_memory(p).states.max())
    shape = wl.model("actor")
    prm = model.params
    assert prm.grad_bytes + prm.optimizer_state_bytes == 16
    for n in (8, 16):
        assert weights[n] == pytest.approx(shape.params * 4 / n, rel=1e-6)
        assert states[n] == pytest.approx(shape.params * (4 + 8) / n, rel=1e-6)


def test_a_models_fsdp_tasks_share_its_shard_and_the_rollout_keeps_its_own(a100x8):
    """verl computes the actor's old log-probs with the FSDP module it trains: one fp32 shard
    on each GPU for both tasks; the co-located rollout engine holds its own bf16 weights beside
    it, in the generation phase (a sleeping rollout's weights leave while the trainer works)."""
    wl = verl_ppo_7b()
    model = CostModel(wl, a100x8)
    plan = colocated(wl, 8, "fsdp")
    mem = model.estimate(plan).memory.breakdown()
    shape = wl.model("actor")
    by_task = {p.task: model.placement_memory(p) for p in plan.placements}
    train, old = by_task["actor_training"], by_task["actor_inference"]
    assert old.weights[0] == pytest.approx(shape.params * 2 / 8, rel=1e-9)  # its bf16 view
    assert train.weights[0] == pytest.approx(shape.params * 4 / 8, rel=1e-9)
    # the plan's resident weights: the actor's fp32 shard once, the critic's, the reference's
    # bf16 one; the rollout's tp-4 copy only while it generates
    others = sum(float(by_task[t].weights[0]) for t in
                 ("actor_training", "critic_training", "reference_inference"))
    assert mem[0]["weights"] * 1e9 == pytest.approx(others, rel=1e-9)
    gen = float(by_task["actor_generation"].weights[0])
    assert mem[0]["rollout_weights"] * 1e9 == pytest.approx(gen, rel=1e-9)


def test_fsdp_gathers_hide_behind_compute_until_the_network_is_slow():
    """Inside a node the per-micro-batch weight gathers overlap compute (no exposed dp time);
    across two regions they take longer than the compute and the excess shows as ``dp``."""
    wl = verl_ppo_7b()
    near = cluster_preset("paper24-a100-single-region")
    far = ClusterSpec("two-regions", (NodeSpec("a", "A100-80GB", 8, "r0"),
                                       NodeSpec("b", "A100-80GB", 8, "r1")),
                      (RegionLink("r0", "r1", 20.0, 1.0),))
    layers = wl.model("actor").layers
    p = make_placement("actor_training", tuple(range(8)), 8, 1, 1, layers, backend="fsdp")
    inside = CostModel(wl, near).forward_task_cost(p)
    assert inside.parts["dp"] == 0.0
    wide = make_placement("actor_training", tuple(range(16)), 16, 1, 1, layers, backend="fsdp")
    across = CostModel(wl, far).forward_task_cost(wide)
    assert across.parts["dp"] > across.parts["compute"]
    assert across.seconds == pytest.approx(sum(across.parts.values()), rel=1e-12)


def test_offload_trades_memory_for_host_traffic():
    """Offload keeps only the gradient shard on the GPU and adds the shards' host round trip:
    2 x params x (the fp32 master copy and Adam m and v: optimizer state bytes) / dp over the
    host link, once per task call (verl onloads before ``update_actor`` and offloads after it,
    whatever its optimizer steps)."""
    wl, cl = verl_ppo_7b(), cluster_preset("a100x8")
    model = CostModel(wl, cl)
    layers = wl.model("actor").layers
    on = make_placement("actor_training", tuple(range(8)), 8, 1, 1, layers, backend="fsdp",
                        offload=True)
    off = replace(on, offload=False)
    prm, shape = model.params, wl.model("actor")
    kept = prm.grad_bytes / (prm.grad_bytes + prm.optimizer_state_bytes)
    resident = model.placement_memory(off)
    assert model.placement_memory(on).states.max() == pytest.approx(
        kept * (resident.states + resident.weights).max(), rel=1e-9)
    assert model.placement_memory(on).weights.max() == 0
    trip = 2 * shape.params * prm.optimizer_state_bytes / 8 / (prm.host_link_GBps * 1e9)
    assert wl.optimizer_steps > 1
    assert model.forward_task_cost(on).parts["offload"] == pytest.approx(trip, rel=1e-9)
    assert model.forward_task_cost(off).parts["offload"] == 0.0


def test_plan_files_keep_the_backend_and_validation_names_misuse():
    wl, cl = verl_ppo_7b(), cluster_preset("a100x8")
    plan = colocated(wl, 8, "fsdp", offload=("reference_inference",))
    again = Plan.from_dict(plan.to_dict())
    assert again == plan and again.placement("reference_inference").offload
    assert "backend" not in colocated(wl, 8, "megatron").to_dict()["placements"][1]
    train = plan.placement("actor_training")
    bad = [(replace(train, backend="deepspeed"), r"actor_training\]\.backend.*one of"),
           (TaskPlacement("actor_training", 4, 1, 2, tuple(((2 * i, 2 * i + 1),) for i in range(4)),
                          train.layers_per_stage, (1.0,) * 4, "fsdp"), r"needs pp = 1 and tp = 1"),
           (replace(plan.placement("actor_generation"), offload=True),
            r"offload.*inference and training"),
           (replace(plan.placement("actor_generation"), backend="fsdp"), r"rollout engine")]
    for p, message in bad:
        with pytest.raises(SpecError, match=message):
            validate(plan.with_placement(p), wl, cl)


def test_the_simulator_agrees_with_the_estimate_on_fsdp():
    """The simulator replays each micro-batch with its ring of gathers and reduce-scatters
    beside the ranks' compute, the sharded step, and the gather before the weight sync: its
    steady iteration is within 5% of the estimate."""
    from sim.driver import simulate

    wl = verl_ppo_7b(batch_prompts=128, optimizer_steps=1)
    cl = cluster_preset("a100x8")
    plan = colocated(wl, 8, "fsdp", offload=("reference_inference",))
    est = CostModel(wl, cl).estimate(plan)
    sim = simulate(plan, wl, cl, iterations=3)
    assert sim.iteration_s == pytest.approx(est.iteration_s, rel=0.05)
    assert sim.trace.task_seconds()["weight_sync"] > 0  # shards gathered, never shared in place


def test_megatron_offload_moves_the_states_to_the_call_and_prices_the_round_trip():
    """verl's Megatron workers offload too (param_offload, grad_offload, optimizer_offload):
    the weight shard and the trained states leave the resident memory (on the GPU only during
    the task's own call, in its working set), and the rank's shard crosses the host link there
    and back once per call; the simulator waits the same."""
    from sim.driver import simulate

    wl, cl = verl_ppo_7b(), cluster_preset("a100x8")
    layers = wl.model("actor").layers
    plan = colocated(wl, 8, "megatron")
    on = make_placement("actor_training", tuple(range(8)), 4, 1, 2, layers, offload=True)
    off = replace(on, offload=False)
    model = CostModel(wl, cl)
    mem_on, mem_off = model.placement_memory(on), model.placement_memory(off)
    assert mem_on.states.max() == 0.0 and mem_off.states.max() > 0
    assert mem_on.weights.max() == 0.0 and mem_off.weights.max() > 0
    assert mem_on.working.max() == pytest.approx(
        mem_off.working.max() + mem_off.states.max() + mem_off.weights.max(), rel=1e-9)
    prm, shape = model.params, model.shapes("actor_training", on)[0]
    trip = 2 * shape.params * (wl.bytes_per_value + prm.grad_bytes
                               + prm.optimizer_state_bytes / 4) / (prm.host_link_GBps * 1e9)
    assert model.forward_task_cost(on).parts["offload"] == pytest.approx(trip, rel=1e-9)
    assert model.forward_task_cost(on).seconds == pytest.approx(
        model.forward_task_cost(off).seconds + trip, rel=1e-9)
    with_off = plan.with_placement(on)
    sim = [simulate(p, wl, cl, 1).metrics["tasks"]["actor_training"] for p in (
        plan.with_placement(off), with_off)]
    assert sim[1] - sim[0] == pytest.approx(trip, rel=1e-6)
