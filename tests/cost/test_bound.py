"""The model bound (``hetrl.cost.bound``): hand-checked terms, and no plan -- random, built by
hand or evaluated by any scheduler's search -- estimated below it."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetrl.cost import CostModel, CostParams, lower_bound
from hetrl.cost.bound import decode_steps_lower_bound, generation_tail
from hetrl.cost.flops import stage_shapes
from hetrl.cost.lengths import length_stats
from hetrl.cost.model import CostModel as _CostModel
from hetrl.plan import colocated_plan
from hetrl.search import Budget, get_scheduler, load_all
from hetrl.spec.cluster import ClusterSpec, NodeSpec, RegionLink, homogeneous
from hetrl.spec.lengths import LengthDist
from hetrl.spec.presets import cluster_preset, workload_preset
from hetrl.spec.random_cluster import nested_random_cluster
from tests.cost.plans import random_plans
from tests.hand_params import HAND_PARAMS

MIXED = ClusterSpec("a100+l4", (NodeSpec("a", "A100-80GB", 4, "r0"), NodeSpec("l", "L4", 4, "r1")),
                    region_links=(RegionLink("r0", "r1", 20.0, 2.0),))
#: two regions, nodes of 2 and 4 GPUs of three types (H100 and L4 drawn for seed 1)
NESTED = nested_random_cluster(1, 4, num_regions=2, gpus=("A100-80GB", "L4", "H100"),
                               gpus_per_node=(2, 4))


def fixed_lengths(name: str, prompts: int, response: int = 100, prompt: int = 50):
    wl = workload_preset(name)
    return wl.with_(batch_prompts=prompts, prompt_length=LengthDist.fixed(prompt),
                    response_length=LengthDist.fixed(response))


# --- hand-checked terms -------------------------------------------------------------------------

def test_decode_steps_with_fixed_lengths():
    """Fixed response length R: n <= B sequences decode in R steps; n > B in n R / B (B at most
    the concurrency cap); a fractional replica still decodes one sequence's R steps."""
    L = length_stats(fixed_lengths("qwen3-8b-ppo-sync", 4))
    assert decode_steps_lower_bound(L, 10, 256) == pytest.approx(100)
    assert decode_steps_lower_bound(L, 512, 256) == pytest.approx(200)
    assert decode_steps_lower_bound(L, 1000, 100) == pytest.approx(1000)
    assert decode_steps_lower_bound(L, 0.25, 256) == pytest.approx(100)
    assert decode_steps_lower_bound(L, 0, 256) == 0


def test_decode_steps_grow_with_sequences():
    L = length_stats(workload_preset("qwen3-8b-ppo-sync"))
    steps = [decode_steps_lower_bound(L, n, 256) for n in (1, 2, 8, 64, 256, 512, 3072)]
    assert steps == sorted(steps)
    assert steps[0] == pytest.approx(L.response_mean)  # one sequence: E[R]
    # 256 sequences at once: the expected longest of 256 responses (1008.5 tokens, docs)
    assert steps[4] == pytest.approx(workload_preset("qwen3-8b-ppo-sync").response_length
                                     .expected_max(256), rel=1e-9)


def test_generation_tail_on_one_gpu():
    """One H100, 4 x 8 sequences of fixed response length 100: tp = 1, 100 steps of 1 ms
    overhead + the weights (Qwen3-8B, 8.19e9 parameters, bf16) at 3,350 GB/s x 0.70."""
    wl = fixed_lengths("qwen3-8b-ppo-sync", 4)
    model = wl.model("actor")
    weights = stage_shapes(model, (model.layers,), 1, True, 2)[0].weight_bytes
    assert weights == pytest.approx(16.38e9, rel=1e-3)
    tail = generation_tail(wl, homogeneous("H100", 1, 1), HAND_PARAMS)
    step = 1e-3 + weights / (3350e9 * 0.70)
    assert tail == {"generation_tail_s": pytest.approx(100 * step), "generation_tail_tp": 1.0,
                    "decode_steps": pytest.approx(100), "decode_step_s": pytest.approx(step)}
    assert step == pytest.approx(7.985e-3, rel=1e-3)


def test_generation_tail_prefers_tp_when_weights_dominate():
    """Eight H100s in one node: tp = 8 reads 1/8 of the weights per step and pays 2 x 36
    all-reduces, each at least 2 ceil(log2 8) x 2 us (two 1 us GPU-host hops): 0.864 ms."""
    wl = fixed_lengths("qwen3-8b-ppo-sync", 1)  # 8 sequences: one per replica at tp = 1
    tail = generation_tail(wl, homogeneous("H100", 1), HAND_PARAMS)
    model = wl.model("actor")
    weights = stage_shapes(model, (model.layers,), 1, True, 2)[0].weight_bytes
    assert tail["generation_tail_tp"] == 8
    assert tail["decode_step_s"] == pytest.approx(
        1e-3 + weights / 8 / (3350e9 * 0.7) + 2 * 36 * 2 * 3 * 2e-6)


def test_model_bound_terms_and_physical_bound():
    """Qwen3-8B PPO on 8 A100s (the worked example of docs/cost-model.md): one forward of a
    sequence with the LM head is 4.727e13 FLOPs per 16 sequences per tp-4 rank, 1.1818e13 per
    sequence; with a scalar head 768 tokens x 2 h (V - 1) = 9.559e11 fewer. Efficiencies of
    tests/hand_params.py."""
    wl, cluster = workload_preset("qwen3-8b-ppo-sync"), cluster_preset("a100x8")
    b = lower_bound(wl, cluster, HAND_PARAMS)
    # the physical bound as before: 3.47e17 FLOPs at 8 x 312 TFLOP/s (docs: 139.2 s)
    assert b["iteration_s_lower_bound"] == pytest.approx(139.17, abs=0.01)
    lm, scalar, peak = 1.1818e13, 1.1818e13 - 9.559e11, 8 * 312e12
    # inference: reference (LM head), reward and critic (scalar) at 0.5 of peak
    assert b["model_inference_s"] == pytest.approx(3072 * (lm + 2 * scalar) / (peak * 0.5),
                                                   rel=1e-3)
    assert b["model_inference_s"] == pytest.approx(82.56, abs=0.01)
    # training: actor and critic, 3 forwards each, at 0.4 of peak
    assert b["model_training_s"] == pytest.approx(3 * 3072 * (lm + scalar) / (peak * 0.4),
                                                  rel=1e-3)
    # sync: the three stages in sequence
    assert b["iteration_s_model_bound"] == pytest.approx(
        b["model_generation_s"] + b["model_inference_s"] + b["model_training_s"])
    assert b["iteration_s_model_bound"] >= b["compute_bound_s"]
    # the colocated tp-4 plan of the worked example, at these efficiencies, is above it
    est = CostModel(wl, cluster, HAND_PARAMS).estimate(colocated_plan(wl, cluster, tp=4))
    assert b["iteration_s_model_bound"] == pytest.approx(325.07, abs=0.01)
    assert b["iteration_s_model_bound"] < est.iteration_s


@pytest.mark.parametrize("prompts", [384, 8])
def test_async_bound_overlaps_the_stages(prompts):
    """Async: the stages overlap; with few prompts the serial decode tail exceeds the
    generation's share of the FLOPs, so the chain is longer than the total work."""
    wl = workload_preset("qwen3-8b-ppo-async").with_(batch_prompts=prompts)
    b = lower_bound(wl, cluster_preset("a100x8"))
    chain = b["model_generation_s"] + b["model_inference_s"] + b["model_training_s"]
    assert b["iteration_s_model_bound"] == pytest.approx(
        max(chain / (wl.staleness + 1), b["model_work_s"], b["model_training_s"],
            b["model_generation_s"]))
    assert b["iteration_s_model_bound"] <= chain * (1 + 1e-12)  # (sums in another order)
    if prompts == 8:
        assert b["iteration_s_model_bound"] < chain


def test_eta_prices_a_stage_as_the_paper_does():
    wl, cluster = workload_preset("qwen3-8b-ppo-sync"), cluster_preset("a100x8")
    free = lower_bound(wl, cluster, HAND_PARAMS)
    parallel = lower_bound(wl, cluster, replace(HAND_PARAMS, eta=1.0))
    # eta = 1: the three inference tasks overlap completely: the largest one's time, the
    # reference's (LM head: 1.1818e13 FLOPs per sequence, as above)
    assert parallel["model_inference_s"] == pytest.approx(3072 * 1.1818e13 / (8 * 312e12 * 0.5),
                                                          rel=1e-3)
    assert parallel["iteration_s_model_bound"] < free["iteration_s_model_bound"]


def test_nested_clusters_never_raise_the_bound():
    """Every plan of a cluster is a plan of a cluster that contains it, so the bound cannot
    grow with the cluster."""
    wl = workload_preset("qwen3-8b-ppo-sync")
    gpus = ("A100-80GB", "H100", "L40S", "L4")
    bounds = [lower_bound(wl, nested_random_cluster(0, n, gpus=gpus, gpus_per_node=(8,)))
              ["iteration_s_model_bound"] for n in (1, 2, 4, 8, 16)]
    assert bounds == sorted(bounds, reverse=True)
    assert bounds[-1] < bounds[0]


# --- no plan beats it ---------------------------------------------------------------------------

JOBS = {
    "ppo-sync-8b": workload_preset("qwen3-8b-ppo-sync").with_(batch_prompts=8),
    "grpo-sync-4b": workload_preset("qwen3-4b-grpo-sync").with_(batch_prompts=2),
    "ppo-async-8b": workload_preset("qwen3-8b-ppo-async").with_(batch_prompts=16),
    "grpo-async-recompute": workload_preset("qwen3-4b-grpo-async").with_(batch_prompts=4,
                                                                        recompute=True),
    "tiny-grpo-sync": workload_preset("tiny-grpo-sync"),  # the tail is ~all of it: tight
    "fixed-ppo-sync": fixed_lengths("qwen3-4b-ppo-sync", 2),
}
CLUSTERS = {"mixed": MIXED, "nested": NESTED, "h100x8": homogeneous("H100", 1),
            "tiny4-two-region": cluster_preset("tiny4-two-region")}
PARAMS = {"default": CostParams(), "eta": CostParams(eta=0.5),
          "per-gpu": CostParams(per_gpu=(("L4", "decode_hbm", 1.0), ("H100", "train_flops", 0.9)),
                                decode_step_overhead_s=0.0)}


@settings(max_examples=120)
@given(data=st.data(), job=st.sampled_from(sorted(JOBS)), cluster=st.sampled_from(sorted(CLUSTERS)),
       params=st.sampled_from(sorted(PARAMS)))
def test_model_bound_below_random_plans(data, job, cluster, params):
    wl, cl, pr = JOBS[job], CLUSTERS[cluster], PARAMS[params]
    plan = data.draw(random_plans(wl, cl))
    est = CostModel(wl, cl, pr).estimate(plan)
    assert lower_bound(wl, cl, pr)["iteration_s_model_bound"] <= est.iteration_s


@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (4, 1), (8, 1), (2, 2), (4, 2)])
@pytest.mark.parametrize("job", ["ppo-sync-8b", "tiny-grpo-sync", "ppo-async-8b"])
def test_model_bound_below_colocated_plans(job, tp, pp):
    wl, cl = JOBS[job], CLUSTERS["h100x8"]
    if wl.model("actor").heads % tp:
        pytest.skip("tp does not divide the heads")
    est = CostModel(wl, cl).estimate(colocated_plan(wl, cl, tp=tp, pp=pp))
    assert lower_bound(wl, cl)["iteration_s_model_bound"] <= est.iteration_s


@pytest.mark.parametrize("scheduler", ["hetrl", "hetrl-simple", "random", "deap", "verl",
                                       "verl-async", "streamrl"])
@pytest.mark.parametrize("job", ["grpo-sync-4b", "grpo-async-recompute"])
def test_model_bound_below_every_plan_a_search_evaluates(monkeypatch, scheduler, job):
    """Every estimate any scheduler asks for during its search is at or above the bound."""
    load_all()
    wl, cl = JOBS[job], NESTED
    bound = lower_bound(wl, cl)["iteration_s_model_bound"]
    seen: list[float] = []
    original = _CostModel.estimate

    def checked(self, plan, check=True):
        est = original(self, plan, check)
        if self.workload is wl and self.params == CostParams():
            seen.append(est.iteration_s)
        return est

    monkeypatch.setattr(_CostModel, "estimate", checked)
    get_scheduler(scheduler).search(wl, cl, Budget(evaluations=60, seed=0))
    assert len(seen) >= 10 and min(seen) >= bound


@pytest.mark.parametrize("workload_name,changes,cluster_name", [
    ("qwen3-30b-a3b-grpo-sync", {}, "a100x8"),
    # two sequences: the decode tail is the iteration (tp 1 x ep 8 at 2.94 s beat the
    # bound's 3.22 s when it read every expert each step)
    ("qwen3-30b-a3b-grpo-sync", {"batch_prompts": 1, "responses_per_prompt": 2}, "h100x8"),
    ("examples/workload-qwen3-30b-a3b-grpo-fp8.yaml", {}, "h100x8")])
def test_bounds_hold_for_expert_parallel_and_fp8_plans(workload_name, changes, cluster_name):
    """A mixture of experts decodes only the experts its tokens use, fewer per rank with more
    expert parallelism, and an FP8 rollout reads one byte per weight at the FP8 peak: both
    bounds stay below every co-located (tp, ep) plan."""
    from hetrl.errors import SpecError
    from hetrl.io import load_cluster, load_workload

    wl = load_workload(workload_name).with_(**changes)
    cl = CLUSTERS[cluster_name] if cluster_name in CLUSTERS else load_cluster(cluster_name)
    b = lower_bound(wl, cl)
    priced = 0
    for tp in (1, 2, 4, 8):
        for ep in (1, 2, 4, 8, 16):
            try:
                plan = colocated_plan(wl, cl, tp=tp, ep=ep)
            except SpecError:
                continue  # (ep not dividing the replicas, tp not the heads)
            est = CostModel(wl, cl).estimate(plan, check=False)
            priced += 1
            assert b["iteration_s_model_bound"] <= est.iteration_s, (tp, ep)
            assert b["iteration_s_lower_bound"] <= est.iteration_s, (tp, ep)
            assert b["generation_tail_s"] <= est.tasks["actor_generation"], (tp, ep)
    assert priced >= 6
