"""The optimizer's precision (``optimizer_precision``): ``fp32`` -- mixed precision, fp32
gradients, master weights and Adam states, the default and what Megatron, DeepSpeed and verl
keep -- or ``bf16``: a bf16 model stepped in place by torch.optim.Adam (NeMo AutoModel's MoE
benchmarks), bf16 gradients, m and v and no master copy. Public T6 (DeepSeek-V3 on 256 H100)
fits only when it is priced."""

from __future__ import annotations

import pytest
import yaml

from hetrl.cost import CostModel
from hetrl.cost.params import DEFAULT_PARAMS, OPTIMIZER_PRECISIONS, CostParams, optimizer_params
from hetrl.errors import SpecError
from hetrl.export import openrlhf as orl
from hetrl.export.launchable import check_workload as check_launchable
from hetrl.export.verl_keys import check_workload as check_verl
from hetrl.plan import colocated_plan
from hetrl.search.feasibility import minimum_memory_bytes
from hetrl.spec.presets import cluster_preset, workload_preset
from hetrl.spec.workload import OPTIMIZER_PRECISIONS as SPEC_PRECISIONS
from hetrl.spec.workload import WorkloadSpec
from sim.driver import simulate
from tests.cost.test_fsdp import colocated, verl_ppo_7b


def test_one_table_of_precisions_and_fp32_is_the_cost_models_own():
    assert tuple(OPTIMIZER_PRECISIONS) == SPEC_PRECISIONS
    assert optimizer_params(DEFAULT_PARAMS, "fp32") is DEFAULT_PARAMS
    bf16 = optimizer_params(DEFAULT_PARAMS, "bf16")
    assert bf16 is optimizer_params(DEFAULT_PARAMS, "bf16")  # (shared tables)
    # per parameter: a bf16 gradient, bf16 m and v, no master copy; torch's multi-tensor Adam
    # step reads 11 and writes 7 values of 2 bytes
    assert (bf16.grad_bytes, bf16.optimizer_state_bytes, bf16.master_weight_bytes,
            bf16.optimizer_step_hbm_bytes) == (2, 4, 0, (11 + 7) * 2)
    wl = workload_preset("qwen3-8b-grpo-sync")
    assert CostModel(wl, cluster_preset("a100x8")).params is DEFAULT_PARAMS
    assert CostModel(wl.with_(optimizer_precision="bf16"),
                     cluster_preset("a100x8")).params is bf16


def test_megatron_states_by_hand():
    """A Megatron rank keeps its bf16 weights either way; its gradients (fp32: 4 bytes, bf16:
    2) and its 1/dp of the optimizer states (12 bytes: master, m, v; bf16: 4: m, v)."""
    cl = cluster_preset("a100x8")
    wl = workload_preset("qwen3-8b-grpo-sync")
    plan = colocated_plan(wl, cl, tp=2)
    p = plan.placement("actor_training")
    mem = {prec: CostModel(wl.with_(optimizer_precision=prec), cl).placement_memory(p)
           for prec in ("fp32", "bf16")}
    d = p.device_ids[0]
    assert mem["fp32"].weights[d] == mem["bf16"].weights[d]
    assert mem["fp32"].working[d] == mem["bf16"].working[d]
    params = mem["fp32"].states[d] / (4 + 12 / p.dp)  # the rank's parameters
    assert mem["bf16"].states[d] == pytest.approx(params * (2 + 4 / p.dp), rel=1e-12)


def test_fsdp_shards_by_hand():
    """An FSDP rank's weight shard is the fp32 master copy (4 bytes) or, with no master, the
    bf16 values (2); its states the gradient and m and v shards: 4 + 8 or 2 + 4 bytes."""
    wl = verl_ppo_7b()
    cl = cluster_preset("a100x8")
    plan = colocated(wl, 8, "fsdp")
    p = plan.placement("actor_training")
    mem = {prec: CostModel(wl.with_(optimizer_precision=prec), cl).placement_memory(p)
           for prec in ("fp32", "bf16")}
    d = p.device_ids[0]
    shard = mem["fp32"].weights[d] / 4  # parameters per rank
    assert mem["bf16"].weights[d] == pytest.approx(shard * 2, rel=1e-12)
    assert mem["fp32"].states[d] == pytest.approx(shard * (4 + 8), rel=1e-12)
    assert mem["bf16"].states[d] == pytest.approx(shard * (2 + 4), rel=1e-12)


def test_bf16_needs_less_memory_and_moves_half_the_gradients_and_the_simulator_follows():
    """Less memory; half the gradient bytes over the DP group; an Adam step of 36 bytes per
    parameter where the fused fp32 one streams 32."""
    cl = cluster_preset("a100x8")
    wl = workload_preset("qwen3-8b-grpo-sync")
    plan = colocated_plan(wl, cl, tp=2)
    fp32, bf16 = (wl.with_(optimizer_precision=p) for p in ("fp32", "bf16"))
    est = [CostModel(w, cl).estimate(plan) for w in (fp32, bf16)]
    assert max(est[1].peak_memory_gb.values()) < max(est[0].peak_memory_gb.values())
    dp = [e.parts["actor_training"]["dp"] for e in est]
    assert 0 < dp[1] < dp[0]
    # every parameter's weight (2), gradient and the other states once: fp32 16 (as FSDP holds
    # them: master 4 + 4 + 8), bf16 8
    actor = wl.model("actor").params
    assert minimum_memory_bytes(fp32) - minimum_memory_bytes(bf16) == pytest.approx(actor * 8)
    sim = [sum(s.duration_s for s in simulate(plan, w, cl, iterations=1).trace.spans_of(
        "task", "actor_training")) for w in (fp32, bf16)]
    assert sim[1] < sim[0]
    assert sim[1] / sim[0] == pytest.approx(est[1].tasks["actor_training"]
                                            / est[0].tasks["actor_training"], rel=0.05)


def test_round_trip_and_old_files_read_as_before():
    wl = workload_preset("qwen3-8b-grpo-sync")
    assert "optimizer_precision" not in wl.to_dict()  # (the default is not written)
    bf16 = wl.with_(optimizer_precision="bf16")
    data = yaml.safe_load(yaml.safe_dump(bf16.to_dict()))
    assert data["optimizer_precision"] == "bf16"
    assert WorkloadSpec.from_dict(data) == bf16


@pytest.mark.parametrize("value", ["fp16", "BF16", "", 2, None])
def test_bad_optimizer_precision_names_the_field_and_the_choices(value):
    with pytest.raises(SpecError) as err:
        workload_preset("qwen3-8b-grpo-sync").with_(optimizer_precision=value)
    assert "optimizer_precision" in str(err.value)


def test_a_master_copy_larger_than_the_states_is_refused():
    with pytest.raises(SpecError, match="master_weight_bytes"):
        CostParams(optimizer_state_bytes=2)


def test_the_exports_refuse_a_bf16_optimizer():
    """verl's export writes fp32 master weights and states (Megatron's distributed optimizer,
    FSDP's fp32 model_dtype), OpenRLHF trains with DeepSpeed's bf16 mixed precision: neither
    runs a bf16 optimizer, and ``--launch-with`` refuses it before a search."""
    wl = workload_preset("qwen3-8b-grpo-sync").with_(optimizer_precision="bf16")
    for check in (check_verl, orl.check_optimizer, lambda w: check_launchable("verl", w),
                  lambda w: check_launchable("openrlhf", w)):
        with pytest.raises(SpecError, match="optimizer_precision"):
            check(wl)
    check_verl(wl.with_(optimizer_precision="fp32"))


def test_a_bf16_optimizer_needs_two_byte_weights():
    wl = workload_preset("qwen3-8b-grpo-sync")
    with pytest.raises(SpecError, match="optimizer_precision.*2-byte precision"):
        wl.with_(precision="fp32", optimizer_precision="bf16")
    wl.with_(precision="fp8", optimizer_precision="bf16")  # (FP8 training keeps bf16 weights)


def test_fsdp_offload_moves_what_the_rank_holds():
    """An offloaded FSDP trainer's round trip per call carries its master copy (fp32: 4 bytes)
    and Adam m and v (8): 12 bytes per parameter of its shard; bf16: the weights, m and v, 6."""
    from hetrl.cost.flops import stage_shapes
    from hetrl.cost.fsdp import offload_seconds

    m = workload_preset("qwen3-8b-grpo-sync").model("actor")
    (whole,) = stage_shapes(m, (m.layers,), 1, True, 2)
    for prec, per_param in (("fp32", 12), ("bf16", 6)):
        prm = optimizer_params(DEFAULT_PARAMS, prec)
        assert offload_seconds("training", whole, 8, prm) == pytest.approx(
            2 * whole.dp_sharded_params * per_param / 8 / (prm.host_link_GBps * 1e9))
    assert offload_seconds("inference", whole, 8, DEFAULT_PARAMS) == pytest.approx(
        2 * whole.dp_sharded_params * 2 / 8 / (DEFAULT_PARAMS.host_link_GBps * 1e9))
