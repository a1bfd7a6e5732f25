"""Calibration recovers known efficiencies from synthetic traces (the simulator run with
TRUE_PARAMS), keeps the factors the traces do not determine at their base values, and
``hetrl calibrate`` round-trips into ``hetrl estimate --params``."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from hetrl.calibrate import (
    CPU_LAUNCH_BASE_S,
    EFFICIENCY_BOUNDS,
    IDENTIFIED_SD_RATIO,
    CalibrationRun,
    Parameter,
    apply_values,
    candidate_parameters,
    fit_params,
)
from hetrl.cli import main
from hetrl.cli_cost import load_params
from hetrl.cost.framework import without_framework
from hetrl.cost.model import CostModel
from hetrl.cost.params import DEFAULT_PARAMS, CostParams
from hetrl.errors import SpecError
from hetrl.io import load_plan, save_plan
from hetrl.plan import colocated_plan
from hetrl.spec.presets import cluster_preset, workload_preset
from hetrl.trace import Trace
from sim import simulate

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
A100 = "A100-80GB"
#: The "real" hardware of the synthetic traces: efficiencies well off the defaults
#: (defaults: train 0.40, infer 0.50, decode_hbm 0.70, hbm 0.80, link 0.80, overhead 1 ms).
#: The trainer sends its weights in 1 GB buckets (as verl's checkpoint engine does), in the
#: traces and in the fit's base alike: then the bytes, not the per-call overhead, set the
#: sync's time, and the traces can pin the link down.
BUCKETED = dataclasses.replace(DEFAULT_PARAMS, sync_bucket_bytes=1e9)
TRUE_PARAMS = CostParams(per_gpu=((A100, "train_flops", 0.25), (A100, "infer_flops", 0.30),
                                  (A100, "decode_hbm", 0.45), (A100, "hbm", 0.60),
                                  (A100, "link", 0.50)), decode_step_overhead_s=4e-3,
                         sync_bucket_bytes=1e9)


def _trace(plan, workload, cluster, params=TRUE_PARAMS, iterations=2) -> Trace:
    trace = simulate(plan, workload, cluster, iterations, params=params).trace
    return dataclasses.replace(trace, meta={**trace.meta, "workload_spec": workload.to_dict(),
                                            "cluster_spec": cluster.to_dict(),
                                            "plan": plan.to_dict()})


@pytest.fixture(scope="module")
def specs():
    workload, cluster = workload_preset("qwen3-4b-grpo-sync"), cluster_preset("a100x8")
    plans = [load_plan(EXAMPLES / "plan-qwen3-4b-grpo-a100x8.yaml"),
             colocated_plan(workload, cluster, tp=2)]
    return workload, cluster, plans


@pytest.fixture(scope="module")
def traces(specs):
    workload, cluster, plans = specs
    return [_trace(p, workload, cluster) for p in plans]


@pytest.fixture(scope="module")
def fitted(traces):
    return fit_params([CalibrationRun.from_trace(t) for t in traces], base=BUCKETED, max_sweeps=5)


def test_fit_recovers_the_true_efficiencies(fitted):
    r = fitted
    # iteration time: ~40 % off with the defaults, within 2 % after the fit
    assert r.error_before > 0.3
    assert r.error_after < 0.02
    assert r.error_after < r.error_before / 10
    assert r.objective_after < r.objective_before / 100
    p = r.params
    # the kinds each trace pins down come back within 5 %
    assert p.efficiency(A100, "train_flops") == pytest.approx(0.25, rel=0.05)
    assert p.efficiency(A100, "infer_flops") == pytest.approx(0.30, rel=0.05)
    assert p.efficiency(A100, "link") == pytest.approx(0.50, rel=0.05)
    # every fitted value within its bounds; the generation task still matches
    for name, _, value in r.fitted:
        lo, hi = (0.0, 1.0) if name == "decode_step_overhead_s" else EFFICIENCY_BOUNDS
        assert lo <= value <= hi, name
    # (the simulator prefills in admission waves, each reading the weights; the cost model in
    # one batch: their prefill times differ by ~4 %)
    for run in r.runs:
        for t in run.tasks:
            rel = 0.05 if t.task == "actor_generation:prefill" else 0.03
            assert t.after_s == pytest.approx(t.measured_s, rel=rel), t
    # the simulator's trace has the generation's phase spans: they stand for its task time
    assert {t.task for t in r.runs[0].tasks} == {"actor_generation:prefill",
                                                 "actor_generation:decode", "reward_inference",
                                                 "reference_inference", "actor_training",
                                                 "weight_sync"}


def test_a_factor_the_traces_do_not_constrain_stays_at_its_default(specs, fitted):
    """A100 hbm (the Adam step and weight reads): 0.60 in the traces, but setting it to 0.60 or
    0.80 moves no task estimate by 0.1 % -- the traces cannot tell. The fit reports it
    unidentified and keeps the base value exactly (a bare least-squares fit drifts it to absorb
    the simulator's mismatch with the cost model)."""
    workload, cluster, plans = specs
    for plan in plans:
        a = CostModel(workload, cluster, TRUE_PARAMS).estimate(plan).tasks
        b = CostModel(workload, cluster, TRUE_PARAMS.with_efficiency(A100, "hbm", 0.8)
                      ).estimate(plan).tasks
        assert all(b[t] == pytest.approx(a[t], rel=1e-3) for t in a if a[t] > 0)
    r = fitted
    name = f"{A100}.hbm"
    assert name in r.unidentified and name not in r.moved
    assert dict(r.sd_ratio)[name] > 0.9  # the traces shrink its prior sd by < 10 %
    assert r.params.efficiency(A100, "hbm") == DEFAULT_PARAMS.efficiency(A100, "hbm") == 0.8
    assert {n: v for n, _, v in r.fitted}[name] == 0.8
    assert all(k != "hbm" for _, k, _ in r.params.per_gpu)  # not written: base value stays
    # every unidentified parameter is at its base value in the fitted params
    for n, b, v in r.fitted:
        if n in r.unidentified:
            assert v == b
            assert (r.params.decode_step_overhead_s if n == "decode_step_overhead_s" else
                    r.params.efficiency(A100, n.split(".")[1])) == b


def test_identified_factors_are_recovered(fitted):
    """train_flops, infer_flops and link: identified (posterior sd < 10 % of the prior's) and
    within 2 % of the truth. decode_hbm is identified only given the overhead's prior (one
    generation time per run cannot split them): the truth is within 2 posterior sd, not 2 %."""
    r = fitted
    ratio, sd, got = dict(r.sd_ratio), dict(r.sd_log), {n: v for n, _, v in r.fitted}
    for kind in ("train_flops", "infer_flops", "link"):
        name = f"{A100}.{kind}"
        assert name not in r.unidentified and name in r.moved, name
        assert ratio[name] < 0.1, name
        assert got[name] == pytest.approx(TRUE_PARAMS.efficiency(A100, kind), rel=0.02), name
    for name in set(got) - set(r.unidentified):
        assert ratio[name] <= IDENTIFIED_SD_RATIO
        kind = name.split(".")[1]
        assert abs(math.log(got[name] / TRUE_PARAMS.efficiency(A100, kind))) < 2 * sd[name], name
    assert f"{A100}.decode_hbm" not in r.unidentified
    assert r.converged and r.iterations >= 1
    assert r.residual_after < r.residual_before / 10  # rms ln error of the task times


def test_bad_fit_settings_name_field_value_and_limit(traces):
    runs = [CalibrationRun.from_trace(traces[0])]
    for kwargs, field, limit in (({"prior_weight": 0.0}, "prior_weight", "> 0"),
                                 ({"prior_weight": math.inf}, "prior_weight", "finite"),
                                 ({"max_sweeps": 0}, "max_sweeps", ">= 1"),
                                 ({"tol_log": 0.0}, "tol_log", "(0, 1)")):
        with pytest.raises(SpecError) as info:
            fit_params(runs, **kwargs)
        assert info.value.field == field and limit in info.value.problem
        assert info.value.value == next(iter(kwargs.values()))
    with pytest.raises(SpecError, match="runs"):
        fit_params([])


def test_fit_from_true_params_stays_put(specs, traces):
    """Starting at the truth, one sweep cannot make the objective worse, and the fit is
    deterministic (same input, same parameters)."""
    workload, cluster, plans = specs
    runs = [CalibrationRun.from_trace(traces[0])]
    a = fit_params(runs, base=TRUE_PARAMS, max_sweeps=1)
    b = fit_params(runs, base=TRUE_PARAMS, max_sweeps=1)
    assert a.params == b.params and a.objective_after == b.objective_after
    assert a.objective_after <= a.objective_before
    assert a.error_before < 0.02


def test_unused_kinds_are_not_fitted(traces):
    """Training and inference never read decode efficiencies: a trace whose generation span is
    missing fits no decode parameter."""
    t = traces[0]
    no_gen = dataclasses.replace(t, spans=tuple(s for s in t.spans
                                                if s.task != "actor_generation"))
    r = fit_params([CalibrationRun.from_trace(no_gen)], max_sweeps=1)
    names = {n for n, _, _ in r.fitted}
    assert f"{A100}.train_flops" in names
    assert not names & {f"{A100}.decode_hbm", f"{A100}.decode_flops", "decode_step_overhead_s"}


def test_candidates_per_gpu_type():
    workload, cluster = workload_preset("qwen3-4b-grpo-sync"), cluster_preset("hetero8-two-region")
    plan = colocated_plan(workload, cluster)
    trace = Trace("sim", workload.name, cluster.name, (), ((0.0, 1.0),),
                  {"workload_spec": workload.to_dict(), "cluster_spec": cluster.to_dict(),
                   "plan": plan.to_dict()})
    run = CalibrationRun.from_trace(trace)
    got = candidate_parameters(run, ["actor_training"])
    assert got == {Parameter(g, k) for g in (A100, "L40S") for k in ("train_flops", "hbm", "link")}
    gen = candidate_parameters(run, ["actor_generation"])
    assert Parameter("", "decode_step_overhead_s") in gen
    assert Parameter("L40S", "decode_hbm") in gen
    p = apply_values(DEFAULT_PARAMS, sorted(got), [0.5] * len(got))
    assert p.efficiency("L40S", "link") == 0.5 and p.efficiency("L4", "link") == 0.8


def test_from_trace_names_the_missing_or_bad_field(traces):
    t = traces[0]
    with pytest.raises(SpecError, match=r"trace\.meta\.plan"):
        CalibrationRun.from_trace(dataclasses.replace(
            t, meta={k: v for k, v in t.meta.items() if k != "plan"}))
    bad = {**t.meta["workload_spec"], "batch_prompts": 0}
    with pytest.raises(SpecError, match=r"trace\.meta\.workload_spec\.batch_prompts"):
        CalibrationRun.from_trace(dataclasses.replace(t, meta={**t.meta, "workload_spec": bad}))
    plan = dict(t.meta["plan"])
    plan["placements"] = plan["placements"][:-1]
    with pytest.raises(SpecError, match=r"trace\.meta\.plan"):
        CalibrationRun.from_trace(dataclasses.replace(t, meta={**t.meta, "plan": plan}))


# --- the command --------------------------------------------------------------------------------

def _one_line_error(code, err, *fragments):
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("hetrl calibrate: error: ") and "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_calibrate_cli_round_trip(tmp_path, capsys, specs, traces):
    workload, cluster, plans = specs
    paths = []
    for i, t in enumerate(traces):
        paths.append(tmp_path / f"t{i}.json")
        paths[-1].write_text(json.dumps(t.to_dict()))
    out = tmp_path / "params.yaml"
    code = main(["calibrate", "--traces", *map(str, paths), "--out", str(out), "--sweeps", "2",
                 "--json"])
    stdout, err = capsys.readouterr()
    assert code == 0, err
    data = json.loads(stdout)
    assert data["params_out"] == str(out)
    assert data["error_after"] < data["error_before"] / 5
    run0 = data["runs"][0]
    assert {"workload", "cluster", "measured_iteration_s", "estimate_before_s", "estimate_after_s",
            "error_before", "error_after", "tasks"} <= set(run0)
    assert set(run0["tasks"]["actor_training"]) == {"measured_s", "estimate_before_s",
                                                    "estimate_after_s"}
    assert {"objective_before", "objective_after", "sweeps", "evaluations", "fitted", "unused",
            "params", "unidentified", "residual_before", "residual_after"} <= set(data)
    hbm = data["fitted"][f"{A100}.hbm"]
    assert {"base", "fitted"} <= set(hbm)
    assert hbm["identified"] is False and hbm["moved"] is False and hbm["fitted"] == hbm["base"]
    assert f"{A100}.hbm" in data["unidentified"]
    assert data["fitted"][f"{A100}.train_flops"]["moved"] is True
    params = load_params(str(out))
    assert params.efficiency(A100, "train_flops") != DEFAULT_PARAMS.efficiency(A100, "train_flops")
    plan_file = tmp_path / "plan.json"
    save_plan(plans[0], plan_file)
    code = main(["estimate", "-w", "qwen3-4b-grpo-sync", "-c", "a100x8", "--plan", str(plan_file),
                 "--params", str(out), "--json"])
    stdout, _ = capsys.readouterr()
    assert code == 0
    est = json.loads(stdout)["iteration_s"]
    assert est == pytest.approx(run0["estimate_after_s"])
    default = CostModel(workload, cluster).estimate(plans[0]).iteration_s
    measured = run0["measured_iteration_s"]
    assert abs(est - measured) < abs(default - measured) / 5


def test_calibrate_cli_bad_input(tmp_path, capsys, traces):
    out = str(tmp_path / "p.yaml")
    code = main(["calibrate", "--traces", str(tmp_path / "missing.json"), "--out", out])
    _one_line_error(code, capsys.readouterr()[1], "trace", "missing.json", "cannot read")
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(dataclasses.replace(traces[0], meta={}).to_dict()))
    code = main(["calibrate", "--traces", str(bare), "--out", out])
    _one_line_error(code, capsys.readouterr()[1], "bare.json", "meta.workload_spec", "required")
    code = main(["calibrate", "--traces", "--out", out])
    _one_line_error(code, capsys.readouterr()[1], "--traces")
    code = main(["calibrate", "--out", out])
    _one_line_error(code, capsys.readouterr()[1], "--traces")
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"source": "real"}))
    code = main(["calibrate", "--traces", str(broken), "--out", out])
    _one_line_error(code, capsys.readouterr()[1], "broken.json", "trace.workload")
    assert not Path(out).exists()


def test_traces_without_phase_spans_calibrate_as_before(specs, traces):
    """A version-1 trace (no phase spans): the generation task's time is the measurement, as
    before phases existed; the launch term is not a candidate off a CPU."""
    old = []
    for t in traces:
        d = t.to_dict()
        d["schema_version"] = 1
        d["spans"] = [s for s in d["spans"] if s["kind"] != "phase"]
        old.append(CalibrationRun.from_trace(Trace.from_dict(d)))
    r = fit_params(old, base=BUCKETED, max_sweeps=5)
    assert {t.task for t in r.runs[0].tasks} == {"actor_generation", "reward_inference",
                                                 "reference_inference", "actor_training",
                                                 "weight_sync"}
    assert r.error_after < 0.02 < 0.3 < r.error_before
    assert "launch_overhead_s_per_layer" not in {n for n, _, _ in r.fitted} | set(r.unused)
    assert r.params.launch_overhead_s_per_layer == 0.0


def test_the_launch_term_is_fitted_on_cpu_traces():
    """A trace whose meta says it ran on a CPU gets the launch term as a candidate (its base,
    when the base parameters have none, CPU_LAUNCH_BASE_S); a simulated tiny-model trace with
    1 ms of launches per layer, which swamps its FLOPs, gets it back."""
    workload, cluster = workload_preset("tiny-grpo-sync"), cluster_preset("tiny4-single-region")
    plan = load_plan(EXAMPLES / "plan-tiny-grpo-cross-region.yaml")
    per = tuple((g, k, v) for g in ("A100-80GB", "L4") for k, v in (
        ("train_flops", 0.02), ("infer_flops", 0.03), ("decode_flops", 0.03), ("decode_hbm", 0.05)))
    # (a CPU trace is fitted without the GPU framework's per-step costs: so is its truth)
    truth = dataclasses.replace(without_framework(DEFAULT_PARAMS), per_gpu=per,
                                decode_step_overhead_s=2e-3, launch_overhead_s_per_layer=1e-3)
    trace = _trace(plan, workload, cluster, params=truth, iterations=3)
    run = CalibrationRun.from_trace(dataclasses.replace(trace, meta={**trace.meta,
                                                                     "device": "cpu"}))
    assert run.on_cpu() and not CalibrationRun.from_trace(trace).on_cpu()
    assert Parameter("", "launch_overhead_s_per_layer") in candidate_parameters(
        run, ["actor_training"])
    r = fit_params([run])
    base = {n: b for n, b, _ in r.fitted}
    got = {n: v for n, _, v in r.fitted}
    assert base["launch_overhead_s_per_layer"] == CPU_LAUNCH_BASE_S
    assert "launch_overhead_s_per_layer" not in r.unidentified
    assert dict(r.sd_ratio)["launch_overhead_s_per_layer"] < 0.1
    assert got["launch_overhead_s_per_layer"] == pytest.approx(1e-3, rel=0.3)
    assert r.error_after < 0.01
