"""Framework profiles (hetrl.cost.profiles): each workload pays the per-step costs of the
framework that runs it -- verl's fitted ones, a fitted multiple of them, or none."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from hetrl.cost.framework import FRAMEWORK_FIELDS, without_framework
from hetrl.cost.model import CostModel
from hetrl.cost.params import DEFAULT_PARAMS, CostParams
from hetrl.cost.profiles import FRAMEWORK_PROFILES, framework_params, framework_scale
from hetrl.errors import SpecError
from hetrl.spec.presets import cluster_preset, workload_preset
from hetrl.spec.workload import FRAMEWORKS, WorkloadSpec
from sim.engine import Simulation
from tests.cost.plans import split_plan

WL = workload_preset("qwen3-8b-grpo-sync")
CL = cluster_preset("a100x8")
PLAN = split_plan(WL, CL, [(WL.task_names, range(8), 4)])


def _iteration(framework: str, params: CostParams = DEFAULT_PARAMS) -> float:
    return CostModel(WL.with_(framework=framework), CL, params).estimate(PLAN).iteration_s


def test_verl_is_the_default_and_prices_exactly_as_the_fitted_params():
    assert WL.framework == "verl"
    assert framework_params(DEFAULT_PARAMS, "verl") is DEFAULT_PARAMS
    assert CostModel(WL, CL).params is DEFAULT_PARAMS


@pytest.mark.parametrize("name", ["megatron-lm", "none"])
def test_a_run_without_an_rl_controller_pays_no_framework_cost(name):
    assert not FRAMEWORK_PROFILES[name].controller
    params = CostModel(WL.with_(framework=name), CL).params
    assert all(getattr(params, f) == 0 for f in FRAMEWORK_FIELDS)
    assert _iteration(name) == _iteration("verl", without_framework(DEFAULT_PARAMS))
    assert _iteration(name) < _iteration("verl")


def test_a_scaled_profile_pays_its_multiple_of_every_framework_cost():
    params = replace(DEFAULT_PARAMS, framework_scale=(("deepspeed-chat", 1.8),))
    scaled = CostModel(WL.with_(framework="deepspeed-chat"), CL, params).params
    for f in FRAMEWORK_FIELDS:
        assert getattr(scaled, f) == pytest.approx(getattr(DEFAULT_PARAMS, f) * 1.8)
    # the GPUs' work is the same: only the framework's costs moved, in proportion
    base, verl = _iteration("none"), _iteration("verl")
    assert _iteration("deepspeed-chat", params) - base == pytest.approx(1.8 * (verl - base),
                                                                        rel=1e-6)


def test_params_scale_overrides_the_profile_and_resolves_once():
    params = replace(DEFAULT_PARAMS, framework_scale=(("openrlhf", 2.0),))
    assert framework_scale(params, "openrlhf") == 2.0
    assert framework_scale(params, "nemo-rl") == FRAMEWORK_PROFILES["nemo-rl"].scale
    assert framework_scale(params, "megatron-lm") == 0.0  # no controller: no scale applies
    model = CostModel(WL.with_(framework="openrlhf"), CL, params)
    assert model.params.task_call_s == 2.0 * params.task_call_s
    # a cost model built on the resolved params (the simulator, an export) does not scale again
    again = CostModel(WL.with_(framework="openrlhf"), CL, model.params)
    assert again.params.driver_s_per_token == model.params.driver_s_per_token


def test_the_simulator_charges_the_profile_the_cost_model_does():
    sim = Simulation(PLAN, WL.with_(framework="megatron-lm"), CL)
    assert sim.params is sim.model.params and sim.params.micro_batch_overhead_s == 0


def test_profiles_match_the_workload_names_and_say_where_they_come_from():
    assert tuple(FRAMEWORK_PROFILES) == FRAMEWORKS
    for prof in FRAMEWORK_PROFILES.values():
        assert prof.source and (prof.controller or prof.scale == 0)
        # a scale other than verl's is a fitted one (or 0: no controller at all)
        assert prof.scale == 1.0 or prof.fitted or not prof.controller


def test_bad_framework_and_scales_name_field_value_and_limit():
    doc = WL.to_dict() | {"framework": "trl"}
    with pytest.raises(SpecError) as err:
        WorkloadSpec.from_dict(doc)
    assert err.value.field == "framework" and "verl" in str(err.value)
    for scale, field in (({"verll": 1.0}, "params.framework_scale.verll"),
                         ({"verl": -1.0}, "params.framework_scale.verl"),
                         ({"verl": True}, "params.framework_scale.verl"),
                         ([1.0], "params.framework_scale")):
        with pytest.raises(SpecError) as err:
            CostParams.from_dict({"framework_scale": scale})
        assert err.value.field == field


def test_the_framework_round_trips_and_verl_is_not_written():
    assert "framework" not in WL.to_dict()  # (files and fingerprints written before it read alike)
    w = WL.with_(framework="nemo-rl")
    assert WorkloadSpec.from_dict(w.to_dict()) == w
    p = replace(DEFAULT_PARAMS, framework_scale=(("openrlhf", 0.5),))
    assert CostParams.from_dict(json.loads(json.dumps(p.to_dict()))) == p
