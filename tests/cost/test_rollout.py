"""The rollout engine as configured: CUDA graphs or eager, vLLM's gpu_memory_utilization, the
co-located engine's sleep and wake, and the weight sync's NCCL calls."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hetrl.cost.model import CostModel
from hetrl.cost.params import DEFAULT_PARAMS, CostParams
from hetrl.cost.rollout import TENSORS_PER_LAYER, sync_calls
from hetrl.errors import SpecError
from hetrl.plan import Plan, TaskGroup, colocated_plan, make_placement
from hetrl.spec.presets import cluster_preset, workload_preset
from hetrl.spec.workload import WorkloadSpec


def split_plan(wl: WorkloadSpec, gen_devices: tuple[int, ...], rest: tuple[int, ...]) -> Plan:
    """Generation alone on ``gen_devices`` (tp 2), every other task on ``rest`` (tp 2)."""
    layers = wl.model("actor").layers
    others = tuple(t for t in wl.task_names if t != "actor_generation")
    pls = [make_placement("actor_generation", gen_devices, len(gen_devices) // 2, 1, 2, layers)]
    pls += [make_placement(t, rest, len(rest) // 2, 1, 2, wl.model(wl.task(t).role).layers)
            for t in others]
    return Plan((TaskGroup(("actor_generation",), gen_devices), TaskGroup(others, rest)),
                tuple(pls))


def test_an_eager_engine_pays_each_layers_launches_every_decode_step():
    wl, cl = workload_preset("qwen3-8b-grpo-sync"), cluster_preset("a100x8")
    plan = colocated_plan(wl, cl, tp=2)
    graphs = CostModel(wl, cl).estimate(plan)
    eager = CostModel(wl.with_(gen_cuda_graphs=False), cl).estimate(plan)
    per_step = DEFAULT_PARAMS.decode_step_overhead_s
    extra = DEFAULT_PARAMS.eager_launch_s_per_layer * wl.model("actor").layers
    g, e = graphs.parts["actor_generation"]["overhead"], eager.parts["actor_generation"]["overhead"]
    # (the overhead part also holds the engine's host work per generated token, the same in both)
    tokens = graphs.parts["actor_generation"]["overhead"] - per_step * graphs.generation_phases[2]
    assert e - tokens == pytest.approx((g - tokens) * (per_step + extra) / per_step, rel=1e-9)
    assert eager.tasks["actor_generation"] - graphs.tasks["actor_generation"] == pytest.approx(
        e - g, rel=1e-9)


def test_the_launch_term_is_zero_by_default_and_charged_per_layer_per_forward():
    """``launch_overhead_s_per_layer`` (0 by default: no estimate moves) adds layers x launch to
    each decode step, each prefill chunk and each micro-batch forward (x3 in training); the
    generation's prefill and decode phases sum to its time."""
    from hetrl.cost.framework import without_framework

    wl, cl = workload_preset("tiny-grpo-sync"), cluster_preset("tiny4-single-region")
    plan = colocated_plan(wl, cl)
    assert DEFAULT_PARAMS.launch_overhead_s_per_layer == 0.0
    own = without_framework(DEFAULT_PARAMS)  # (the framework's costs are a task's, not a phase's)
    base = CostModel(wl, cl, own).estimate(plan)
    zero = CostModel(wl, cl, replace(own, launch_overhead_s_per_layer=0.0)).estimate(plan)
    assert zero.to_dict() == base.to_dict()
    launch = 1e-4
    est = CostModel(wl, cl, replace(own, launch_overhead_s_per_layer=launch)).estimate(plan)
    pre0, dec0, steps = base.generation_phases
    pre1, dec1, steps1 = est.generation_phases
    assert pre0 + dec0 == pytest.approx(base.tasks["actor_generation"], rel=1e-12)
    assert pre1 + dec1 == pytest.approx(est.tasks["actor_generation"], rel=1e-12)
    layers = wl.model("actor").layers
    assert steps1 == steps > 0
    assert dec1 - dec0 == pytest.approx(steps * layers * launch, rel=1e-9)
    assert pre1 > pre0
    for task in ("reference_inference", "actor_training"):
        assert est.tasks[task] > base.tasks[task]
        assert est.parts[task]["overhead"] > 0 == base.parts[task]["overhead"]
    with pytest.raises(SpecError, match="launch_overhead_s_per_layer"):
        replace(DEFAULT_PARAMS, launch_overhead_s_per_layer=-1.0)


def test_gpu_memory_utilization_caps_the_kv_pool_of_a_dedicated_engine():
    """A dedicated engine's pool takes what is left unless vLLM is told a share: at 0.3 of an
    80 GB GPU (81,920 MiB), less its 8 GB weight shard, the pool (and so the concurrency) is
    smaller."""
    wl, cl = workload_preset("qwen3-8b-grpo-sync"), cluster_preset("a100x8")
    wl = wl.with_(gen_max_concurrency=4096)
    plan = split_plan(wl, (0, 1, 2, 3), (4, 5, 6, 7))
    free = CostModel(wl, cl)
    capped = CostModel(wl.with_(gen_gpu_memory_utilization=0.3), cl)
    shard = free.shapes("actor_generation", plan.placement("actor_generation"))[0].weight_bytes
    assert capped.kv_budgets(plan)[0] == pytest.approx(0.3 * 81920 * 2**20 - shard, rel=1e-9)
    assert free.kv_budgets(plan)[0] > capped.kv_budgets(plan)[0]
    assert capped.estimate(plan).generation_concurrency < free.estimate(plan).generation_concurrency
    with pytest.raises(SpecError, match="gen_gpu_memory_utilization"):
        wl.with_(gen_gpu_memory_utilization=1.5)


def test_a_colocated_engine_sleeps_and_wakes_each_iteration_a_dedicated_one_does_not():
    wl, cl = workload_preset("qwen3-8b-grpo-sync"), cluster_preset("a100x8")
    model = CostModel(wl, cl)
    colocated = model.estimate(colocated_plan(wl, cl, tp=2))
    split = model.estimate(split_plan(wl, (0, 1, 2, 3), (4, 5, 6, 7)))
    shard = model.shapes("actor_generation", colocated_plan(wl, cl, tp=2).placement(
        "actor_generation"))[0].weight_bytes
    switch = DEFAULT_PARAMS.engine_switch_s + 2 * shard / (DEFAULT_PARAMS.host_link_GBps * 1e9)
    # co-located in one layout: weights shared in place (no calls), only the switch
    assert colocated.parts["weight_sync"]["data"] == 0.0
    assert colocated.tasks["weight_sync"] == pytest.approx(switch, rel=1e-9)
    # split: weights move in per-tensor calls, no switch
    calls = sync_calls(model.shapes("actor_generation", split_plan(
        wl, (0, 1, 2, 3), (4, 5, 6, 7)).placement("actor_generation")), DEFAULT_PARAMS)
    assert split.parts["weight_sync"]["overhead"] == pytest.approx(
        calls * DEFAULT_PARAMS.sync_call_overhead_s, rel=1e-9)
    assert split.parts["weight_sync"]["data"] > 0


def test_sync_calls_per_tensor_or_per_bucket():
    wl, cl = workload_preset("qwen3-8b-grpo-sync"), cluster_preset("a100x8")
    model = CostModel(wl, cl)
    p = make_placement("actor_generation", (0, 1), 1, 1, 2, wl.model("actor").layers)
    shapes = model.shapes("actor_generation", p)
    assert sync_calls(shapes, DEFAULT_PARAMS) == 36 * TENSORS_PER_LAYER + 3  # + embedding, norm, head
    bucketed = replace(DEFAULT_PARAMS, sync_bucket_bytes=512e6)
    full = shapes[0].weight_bytes * 2  # both tp ranks' slices: the whole model
    assert sync_calls(shapes, bucketed) == -(-full // 512e6)
    with pytest.raises(SpecError, match="params.sync_call_overhead_s"):
        CostParams(sync_call_overhead_s=-1.0)


def test_the_simulator_replays_the_switch_and_the_calls():
    from sim.driver import simulate

    wl, cl = workload_preset("qwen3-4b-grpo-sync").with_(batch_prompts=32), cluster_preset("a100x8")
    for plan in (colocated_plan(wl, cl, tp=2), split_plan(wl, (0, 1, 2, 3), (4, 5, 6, 7))):
        est = CostModel(wl, cl).estimate(plan)
        sim = simulate(plan, wl, cl, iterations=2)
        assert sim.trace.task_seconds()["weight_sync"] == pytest.approx(
            est.tasks["weight_sync"], rel=0.05)


def test_sleep_level_2_drops_the_weights_host_round_trip():
    """vLLM sleep level 1 sends the engine's weight shard to host memory and back; level 2
    discards it (the weight sync reloads it): only the KV pool's free and re-allocate remains."""
    from hetrl.cost.rollout import switch_seconds

    wl, cl = workload_preset("qwen3-8b-grpo-sync"), cluster_preset("a100x8")
    plan = colocated_plan(wl, cl, tp=2)
    one = CostModel(wl, cl).estimate(plan).tasks["weight_sync"]
    two = CostModel(wl.with_(gen_sleep_level=2), cl).estimate(plan).tasks["weight_sync"]
    shard = CostModel(wl, cl).shapes("actor_generation", plan.placement("actor_generation"))[0]
    assert one - two == pytest.approx(2 * shard.weight_bytes / (
        DEFAULT_PARAMS.host_link_GBps * 1e9), rel=1e-9)
    assert switch_seconds(shard.weight_bytes, DEFAULT_PARAMS, 2) == DEFAULT_PARAMS.engine_switch_s
    for bad in (-1, 3, True, "2"):
        with pytest.raises(SpecError) as err:
            wl.with_(gen_sleep_level=bad)
        assert err.value.field == "gen_sleep_level"


def test_a_cold_restart_captures_the_cuda_graphs_again():
    """Without sleep mode (level 0: verl's free_cache_engine) the weights stay on the GPU and
    the engine captures its CUDA graphs on every rebuild (graph_capture_s); an eager engine has
    none to capture; a dedicated engine never restarts."""
    from hetrl.cost.rollout import switch_seconds

    wl, cl = workload_preset("qwen3-8b-grpo-sync"), cluster_preset("a100x8")
    plan = colocated_plan(wl, cl, tp=2)
    two = CostModel(wl.with_(gen_sleep_level=2), cl).estimate(plan).tasks["weight_sync"]
    cold = CostModel(wl.with_(gen_sleep_level=0), cl).estimate(plan).tasks["weight_sync"]
    eager = CostModel(wl.with_(gen_sleep_level=0, gen_cuda_graphs=False), cl)
    eager_two = CostModel(wl.with_(gen_sleep_level=2, gen_cuda_graphs=False), cl)
    assert cold - two == pytest.approx(DEFAULT_PARAMS.graph_capture_s, rel=1e-9)
    assert eager.estimate(plan).tasks["weight_sync"] == pytest.approx(
        eager_two.estimate(plan).tasks["weight_sync"], rel=1e-12)
    assert switch_seconds(1e9, DEFAULT_PARAMS, 0, cuda_graphs=True) == pytest.approx(
        DEFAULT_PARAMS.engine_switch_s + DEFAULT_PARAMS.graph_capture_s)
