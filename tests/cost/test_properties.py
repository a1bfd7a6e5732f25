"""Invariants of the cost model over random small clusters and random valid plans (hypothesis)."""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import replace

from hypothesis import event, given, settings
from hypothesis import strategies as st

from hetrl.cost import CostModel
from hetrl.cost.lengths import length_stats
from hetrl.cost.params import DEFAULT_PARAMS
from hetrl.cost.tasks import generation_replica, inference_replica, training_replica
from hetrl.plan import Plan, TaskGroup, make_placement
from hetrl.spec.cluster import ClusterSpec, NodeSpec
from hetrl.spec.hardware import gpu_type
from hetrl.spec.lengths import LengthDist
from hetrl.spec.model import ModelShape, model_preset
from hetrl.spec.random_cluster import random_cluster
from hetrl.spec.workload import WorkloadSpec
from tests.cost.plans import random_plans

# Small shapes (Qwen3-0.6B and -1.7B from their config.json files) so that many random plans
# fit, and preset ones that often do not.
SMALL = {
    "Qwen3-0.6B": ModelShape("Qwen3-0.6B", 28, 1024, 3072, 16, 8, 128, 151936, True),
    "Qwen3-1.7B": ModelShape("Qwen3-1.7B", 28, 2048, 6144, 16, 8, 128, 151936, True),
}
#: Multiplies every test's example count: HETRL_PROPERTY_SCALE=50 HYPOTHESIS_PROFILE=dev hunts
#: for counterexamples (the default keeps the file at a few seconds).
SCALE = float(os.environ.get("HETRL_PROPERTY_SCALE", "1"))


def examples(n: int) -> settings:
    return settings(max_examples=max(1, int(n * SCALE)))


MODELS = ("Qwen3-0.6B", "Qwen3-1.7B", "Qwen3-0.6B", "Qwen3-4B", "Qwen3-8B", "Qwen3-14B",
          "Llama-3.2-3B")


def small_workload(model: str, algorithm: str, mode: str) -> WorkloadSpec:
    shape = SMALL[model] if model in SMALL else model_preset(model)
    roles = ("actor", "reference", "reward", "critic") if algorithm == "ppo" else (
        "actor", "reference", "reward")
    return WorkloadSpec(
        name=f"small-{model}-{algorithm}-{mode}", algorithm=algorithm, mode=mode,
        staleness=1 if mode == "async" else 0, models=tuple((r, shape) for r in roles),
        batch_prompts=8, responses_per_prompt=4,
        prompt_length=LengthDist(mean=96, max=256, min=8, std=48),
        response_length=LengthDist(mean=128, max=384, min=8, std=96))


workloads = st.builds(small_workload, st.sampled_from(MODELS), st.sampled_from(["ppo", "grpo"]),
                      st.sampled_from(["sync", "async"]))
clusters = st.builds(lambda seed, nodes, regions, edge: random_cluster(
    seed, num_nodes=nodes, num_regions=regions, gpus_per_node=(1, 2, 4), edge_probability=edge),
    st.integers(0, 10_000), st.integers(1, 4), st.integers(1, 3), st.sampled_from([0.0, 0.5]))


@st.composite
def cases(draw):
    wl, cluster = draw(workloads), draw(clusters)
    return wl, cluster, draw(random_plans(wl, cluster))


def faster_gpus(cluster: ClusterSpec, factor: float) -> ClusterSpec:
    """The same cluster with every GPU type's bf16 TFLOPS multiplied by ``factor``."""
    names = {n.gpu for n in cluster.nodes}
    types = tuple(replace(gpu_type(n, cluster.gpu_types), bf16_tflops=gpu_type(
        n, cluster.gpu_types).bf16_tflops * factor) for n in sorted(names))
    return replace(cluster, gpu_types=types)


def wider_network(cluster: ClusterSpec, factor: float, intra: bool = False) -> ClusterSpec:
    """Every network bandwidth (region links, NICs, inter-zone, edge uplinks; with ``intra`` also
    NVLink/PCIe inside nodes) multiplied by ``factor``."""
    net = cluster.network
    out = replace(
        cluster,
        region_links=tuple(replace(lk, bandwidth_gbps=lk.bandwidth_gbps * factor)
                           for lk in cluster.region_links),
        nodes=tuple(replace(n, nic_gbps=cluster.node_nic_gbps(n) * factor) for n in cluster.nodes),
        network=replace(net, inter_zone_bandwidth_gbps=net.inter_zone_bandwidth_gbps * factor,
                        edge_bandwidth_gbps=net.edge_bandwidth_gbps * factor))
    if intra:
        names = sorted({n.gpu for n in cluster.nodes})
        out = replace(out, gpu_types=tuple(
            replace(gpu_type(n), intra_link_gbps=gpu_type(n).intra_link_gbps * factor)
            for n in names))
    return out


def leq(a: float, b: float) -> bool:
    return a <= b * (1 + 1e-9) + 1e-12


# --- determinism and finiteness -----------------------------------------------------------------

@examples(40)
@given(case=cases())
def test_estimate_is_deterministic_and_finite(case):
    wl, cluster, plan = case
    a = CostModel(wl, cluster).estimate(plan)
    b = CostModel(wl, cluster).estimate(plan)
    assert json.dumps(a.to_dict()) == json.dumps(b.to_dict())
    assert math.isfinite(a.iteration_s) and a.iteration_s > 0
    assert all(math.isfinite(t) and t >= 0 for t in a.tasks.values())
    assert all(math.isfinite(g) and g >= 0 for g in a.peak_memory_gb.values())
    assert a.feasible == (a.violations == ())
    event("feasible" if a.feasible else "infeasible")


# --- monotonicity in hardware -------------------------------------------------------------------

@examples(30)
@given(case=cases(), factor=st.sampled_from([1.5, 2.0, 10.0]))
def test_faster_gpus_never_slow_an_iteration_down(case, factor):
    wl, cluster, plan = case
    base = CostModel(wl, cluster).estimate(plan)
    fast = CostModel(wl, faster_gpus(cluster, factor)).estimate(plan)
    assert leq(fast.iteration_s, base.iteration_s)
    for task in base.tasks:
        assert leq(fast.tasks[task], base.tasks[task]), task


@examples(30)
@given(case=cases(), factor=st.sampled_from([1.5, 2.0, 10.0]), intra=st.booleans())
def test_wider_network_never_slows_an_iteration_down(case, factor, intra):
    wl, cluster, plan = case
    base = CostModel(wl, cluster).estimate(plan)
    wide = CostModel(wl, wider_network(cluster, factor, intra)).estimate(plan)
    assert leq(wide.iteration_s, base.iteration_s)


# --- one more data-parallel replica -------------------------------------------------------------

@examples(40)
@given(wl=workloads, cluster=clusters, data=st.data())
def test_one_more_replica_never_adds_work_to_the_others(wl, cluster, data):
    task = data.draw(st.sampled_from(wl.task_names))
    info = wl.task(task)
    model = wl.model(info.role)
    n_dev = cluster.num_devices
    tps = [d for d in (1, 2, 4) if model.heads % d == 0 and d <= n_dev
           and (model.kv_heads % d == 0 or d % model.kv_heads == 0)]
    tp = data.draw(st.sampled_from(tps))
    pp = data.draw(st.integers(1, max(1, min(2, n_dev // tp))))
    if n_dev < 2 * tp * pp:
        return  # no room for a second replica
    dp = data.draw(st.integers(1, n_dev // (tp * pp) - 1))
    order = data.draw(st.permutations(range(n_dev)))
    before = make_placement(task, order[:dp * pp * tp], dp, pp, tp, model.layers)
    after = make_placement(task, order[:(dp + 1) * pp * tp], dp + 1, pp, tp, model.layers)
    assert after.devices[:dp] == before.devices  # same replicas, one more at the end
    cm = CostModel(wl, cluster)
    shapes = cm.shapes(task, before)
    L = length_stats(wl)
    steps = wl.optimizer_steps if info.kind == "training" else 1

    def replica_seconds(replica, dp_size):
        hw = cm.hw(replica)
        n = wl.samples / dp_size / steps
        if info.kind == "generation":
            return generation_replica(shapes, hw, n, (8e9,) * pp, L, wl.gen_max_concurrency,
                                      DEFAULT_PARAMS).seconds
        if info.kind == "inference":
            return inference_replica(shapes, hw, n, wl.inference_micro_batch_size, L,
                                     DEFAULT_PARAMS).seconds
        return training_replica(shapes, hw, n, wl.micro_batch_size, L, DEFAULT_PARAMS,
                                wl.recompute).seconds

    for replica in before.devices:
        assert leq(replica_seconds(replica, dp + 1), replica_seconds(replica, dp))
    # Per-device memory of the old replicas never grows either (smaller share, Adam states
    # sharded over one more replica).
    m0, m1 = cm.placement_memory(before), cm.placement_memory(after)
    for d in before.device_ids:
        assert leq(m1.weights[d] + m1.states[d] + m1.working[d],
                   m0.weights[d] + m0.states[d] + m0.working[d])


# --- infeasible plans are flagged ---------------------------------------------------------------

def resident_lower_bound(wl: WorkloadSpec, plan: Plan) -> dict[int, float]:
    """Per device, bytes that must be resident: the transformer layers' matrices of each model
    copy held there (bf16; embeddings, norms and heads left out) plus the gradients and Adam
    states of the trained ones (per CostParams: 4 + 12 / dp bytes per parameter)."""
    copies: dict[tuple[int, str], float] = {}
    states: dict[int, float] = {}
    for p in plan.placements:
        info = wl.task(p.task)
        model = wl.model(info.role)
        copy = "actor@gen" if (info.kind == "generation" and wl.mode == "async") else info.role
        for replica in p.devices:
            for layers, stage in zip(p.layers_per_stage, replica, strict=True):
                params = layers * model.params_per_layer / p.tp
                for d in stage:
                    copies[(d, copy)] = max(copies.get((d, copy), 0.0), 2 * params)
                    if info.kind == "training":
                        states[d] = states.get(d, 0.0) + params * (4 + 12 / p.dp)
    out = dict(states)
    for (d, _), b in copies.items():
        out[d] = out.get(d, 0.0) + b
    return out


@examples(50)
@given(case=cases())
def test_plans_that_cannot_fit_are_flagged(case):
    wl, cluster, plan = case
    est = CostModel(wl, cluster).estimate(plan)
    usable = {d.id: d.gpu.memory_bytes * 0.92 for d in cluster.devices}
    over = {d for d, b in resident_lower_bound(wl, plan).items() if b > usable[d]}
    if over:
        assert not est.feasible and est.violations
    flagged = {int(m.group(1)) for v in est.violations
               if (m := re.match(r"device (\d+) \(", v))}
    assert over <= flagged
    # A device is flagged exactly when its peak exceeds the usable memory.
    for d, gb in est.peak_memory_gb.items():
        assert (d in flagged) == (gb * 1e9 > usable[d] * (1 + 1e-12)), d
    event("flagged" if flagged else "fits")


def test_a_plan_that_cannot_fit_is_flagged_on_every_gpu_type():
    # Qwen3-14B training alone (tp = 1) needs 29.5 GB of bf16 weights: more than any 24 GB GPU.
    wl = small_workload("Qwen3-14B", "grpo", "sync")
    for gpu in ("L4", "A10G"):
        cluster = ClusterSpec(f"one-{gpu}", (NodeSpec("n0", gpu, 2, "r0"),))
        pl = [make_placement(t, [0] if t != "actor_training" else [1], 1, 1, 1, 40)
              for t in wl.task_names]
        plan = Plan((TaskGroup(tuple(t for t in wl.task_names if t != "actor_training"), (0,)),
                     TaskGroup(("actor_training",), (1,))), tuple(pl))
        est = CostModel(wl, cluster).estimate(plan)
        assert not est.feasible
        assert any(v.startswith(f"device 1 ({gpu}): needs ") for v in est.violations)
