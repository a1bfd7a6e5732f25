"""Megatron's communication overlap (``overlap_grad_reduce``, ``tp_comm_overlap``) and the matmul
efficiency's size curve (``CostParams.flops_efficiency``): the formulas of docs/cost-model.md,
the simulator's agreement, and the workload keys."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hetrl.cost.model import CostModel
from hetrl.cost.params import DEFAULT_PARAMS, SIZED_KINDS, CostParams
from hetrl.cost.tasks import exposed_grad_sync
from hetrl.errors import SpecError
from hetrl.plan import make_placement
from hetrl.spec.cluster import ClusterSpec, NodeSpec, RegionLink
from hetrl.spec.lengths import LengthDist
from hetrl.spec.model import model_preset
from hetrl.spec.presets import workload_preset
from hetrl.spec.workload import WorkloadSpec

#: two 4-GPU nodes in two regions 10 ms and 10 Gbit/s apart: DP rings that cross the regions
#: take about as long as a step's compute, TP groups stay inside a node
TWO_REGIONS = ClusterSpec("two-regions", (NodeSpec("a", "A100-80GB", 4, "r0"),
                                          NodeSpec("b", "A100-80GB", 4, "r1")),
                          (RegionLink("r0", "r1", 10.0, 10.0),))


def grpo(**kw) -> WorkloadSpec:
    """A small GRPO job on Qwen3-4B (hidden 2560): fixed lengths, 4 micro-batches per step."""
    return workload_preset("qwen3-4b-grpo-sync").with_(
        batch_prompts=16, prompt_length=LengthDist.fixed(256),
        response_length=LengthDist.fixed(256), micro_batch_size=2, **kw)


def training(wl: WorkloadSpec, tp: int = 4):
    """actor_training on all 8 GPUs: dp = 8 / tp, tp inside each node."""
    layers = wl.model("actor").layers
    return make_placement("actor_training", tuple(range(8)), 8 // tp, 1, tp, layers)


# --- overlap_grad_reduce ------------------------------------------------------------------------

def test_exposed_grad_sync_is_the_excess_over_the_last_backward():
    # a micro-batch's work 0.3 s: forward 0.1 s, backward 0.2 s (mult 3); with recomputation the
    # backward (with its recomputed forward) is 3/4 of 0.4 s
    assert exposed_grad_sync(0.5, 0.3, 3.0) == pytest.approx(0.3)
    assert exposed_grad_sync(0.1, 0.3, 3.0) == 0.0
    assert exposed_grad_sync(0.5, 0.4, 4.0) == pytest.approx(0.2)


def test_overlapped_dp_hides_behind_the_last_micro_batch():
    """The DP part drops by the last micro-batch's backward (2/3 of its work, 3/4 with
    recomputation), nothing else moves; the estimate's parts still add up."""
    plain, overlapped = grpo(), grpo(overlap_grad_reduce=True)
    p = training(plain)
    a = CostModel(plain, TWO_REGIONS).forward_task_cost(p)
    b = CostModel(overlapped, TWO_REGIONS).forward_task_cost(p)
    n = plain.samples / 2  # per replica (dp 2)
    micro = -(-n // plain.micro_batch_size)
    work = a.parts["compute"] / micro  # compute-bound ("hbm" here is the Adam step)
    assert a.parts["dp"] > work  # the cross-region ring outlasts one micro-batch
    backward = 3 / 4 if plain.recompute else 2 / 3
    assert b.parts["dp"] == pytest.approx(a.parts["dp"] - work * backward, rel=1e-9)
    for part in ("compute", "hbm", "tp", "bubble"):
        assert b.parts[part] == a.parts[part]
    assert b.seconds == pytest.approx(sum(b.parts.values()), rel=1e-12)


# --- tp_comm_overlap ----------------------------------------------------------------------------

def test_tp_overlap_shows_only_the_excess_over_compute():
    """Inside a node the TP all-reduces are shorter than the GEMMs: overlapped, none show."""
    plain, overlapped = grpo(), grpo(tp_comm_overlap=True)
    p = training(plain)
    a = CostModel(plain, TWO_REGIONS).forward_task_cost(p)
    b = CostModel(overlapped, TWO_REGIONS).forward_task_cost(p)
    assert 0 < a.parts["tp"] < a.parts["compute"]
    assert b.parts["tp"] == 0.0
    assert b.seconds == pytest.approx(a.seconds - a.parts["tp"], rel=1e-9)
    # inference tasks keep their TP time: the option is training's
    ref = make_placement("reference_inference", tuple(range(8)), 2, 1, 4,
                         plain.model("actor").layers)
    assert CostModel(overlapped, TWO_REGIONS).forward_task_cost(ref).parts["tp"] == \
        CostModel(plain, TWO_REGIONS).forward_task_cost(ref).parts["tp"] > 0


@pytest.mark.parametrize("keys", [{"overlap_grad_reduce": True}, {"tp_comm_overlap": True},
                                  {"overlap_grad_reduce": True, "tp_comm_overlap": True}])
def test_the_simulator_agrees_with_the_estimate_with_overlap(keys):
    """The simulator starts each stage's DP rings at every replica's last backward and takes the
    longer of an op's compute and its TP collectives: its training task is within 5% of the
    estimate's, and faster than without the overlap."""
    from hetrl.plan import Plan, TaskGroup, colocated_plan
    from sim.driver import simulate

    base = grpo()
    cl = TWO_REGIONS

    def plan_of(wl):
        co = colocated_plan(wl, cl, tp=4)
        pls = tuple(training(wl) if p.task == "actor_training" else p for p in co.placements)
        return Plan((TaskGroup(wl.task_names, tuple(range(8))),), pls)

    times = {}
    for name, wl in (("plain", base), ("overlap", base.with_(**keys))):
        plan = plan_of(wl)
        est = CostModel(wl, cl).estimate(plan)
        sim = simulate(plan, wl, cl, iterations=1)
        simulated = sim.trace.task_seconds()["actor_training"]
        assert simulated == pytest.approx(est.tasks["actor_training"], rel=0.05), name
        times[name] = (est.tasks["actor_training"], simulated)
    assert times["overlap"][0] < times["plain"][0] and times["overlap"][1] < times["plain"][1]


def test_workload_files_read_and_write_the_keys():
    wl = grpo(overlap_grad_reduce=True, tp_comm_overlap=True)
    d = wl.to_dict()
    assert d["overlap_grad_reduce"] is True and d["tp_comm_overlap"] is True
    assert WorkloadSpec.from_dict(d) == wl
    assert grpo().overlap_grad_reduce is False and grpo().tp_comm_overlap is False
    with pytest.raises(SpecError, match="overlap_grad_reduce"):
        grpo(overlap_grad_reduce="yes")
    with pytest.raises(SpecError, match="tp_comm_overlap"):
        grpo(tp_comm_overlap=1)


# --- the size curve -----------------------------------------------------------------------------

def test_flops_efficiency_saturates_in_the_hidden_size():
    p = DEFAULT_PARAMS
    for kind in SIZED_KINDS:
        at_ref = p.flops_efficiency("A100-80GB", kind, p.flops_reference_hidden)
        assert at_ref == p.efficiency("A100-80GB", kind)
        curve = [p.flops_efficiency("A100-80GB", kind, h) for h in (512, 2048, 4096, 8192, 16384)]
        assert curve == sorted(curve) and curve[0] < 0.3 * curve[2]
        h0 = p.flops_half_hidden
        assert curve[1] == pytest.approx(
            at_ref * 2048 / (2048 + h0) * (4096 + h0) / 4096, rel=1e-12)
    # other kinds do not scale; no half-size: no curve; never above 1
    assert p.flops_efficiency("A100-80GB", "decode_hbm", 512) == p.efficiency("A100-80GB",
                                                                              "decode_hbm")
    flat = replace(p, flops_half_hidden=0.0)
    assert flat.flops_efficiency("L4", "train_flops", 512) == flat.efficiency("L4", "train_flops")
    high = p.with_efficiency(None, "train_flops", 0.95)
    assert high.flops_efficiency("A100-80GB", "train_flops", 65536) == 1.0


def test_a_smaller_model_trains_at_a_lower_efficiency():
    """Qwen3-4B (h 2560) trains at e(2560) / e(4096) of the reference efficiency: its compute
    is 1 / that ratio slower than with the curve switched off."""
    wl = grpo()
    p = training(wl)
    curved = CostModel(wl, TWO_REGIONS).forward_task_cost(p).parts["compute"]
    flat = CostModel(wl, TWO_REGIONS, replace(DEFAULT_PARAMS, flops_half_hidden=0.0)
                     ).forward_task_cost(p).parts["compute"]
    h, h0 = 2560, DEFAULT_PARAMS.flops_half_hidden
    ratio = h / (h + h0) * (4096 + h0) / 4096
    assert model_preset("Qwen3-4B").hidden == h
    assert curved == pytest.approx(flat / ratio, rel=1e-9)


@pytest.mark.parametrize("data, field", [({"flops_half_hidden": -1.0}, "flops_half_hidden"),
                                         ({"flops_reference_hidden": 0}, "flops_reference_hidden"),
                                         ({"flops_half_hidden": "big"}, "flops_half_hidden")])
def test_bad_size_curve_params_name_the_field(data, field):
    with pytest.raises(SpecError, match=field):
        CostParams.from_dict(data)
