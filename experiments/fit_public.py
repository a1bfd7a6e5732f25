"""Fit the cost model's kernel efficiencies on the public set's fit rows, then report both splits.

    PYTHONPATH=. python experiments/fit_public.py [--json] [--out PARAMS.yaml]

Each constant is fitted on the rows that measure it (the measurements file's "How to use",
step 4): ``train_flops`` on the training rows (T1-T4), ``infer_flops`` on the prefill row (F1),
``decode_hbm`` on the generation rows (G1-G4), and ``flops_half_hidden``, the size curve's
half-saturation hidden size, on the training and prefill rows, and the per-step framework
costs (``task_call_s``, ``driver_s_per_token``, ``rule_reward_s_per_sequence``,
``decode_s_per_token``, ``micro_batch_overhead_s``, ``eager_launch_s_per_layer``) on the fit
side's verl step logs (S12, S15-S18: every logged stage and the step). The H200 kernel runs of
experiments/results/gpu-h200 (training and inference forwards of Qwen3-4B and Qwen3-8B on one
GPU) join the fit as rows of their own: their matmul FLOPs at the fitted efficiency against the
measured seconds. (Their decode rows are not used: a Hugging Face decode loop, not a serving
engine.) The residuals are ln(estimate / measured), minimised together by
``scipy.optimize.least_squares`` in log space within bounds (a generation row's prefill also
depends on ``infer_flops``). A third phase (``profiles``) fits each framework profile's scale
on the framework's own fit rows (hetrl.cost.profiles; none but verl has any yet: each other
framework's rows are holdout), the per-step costs held. The holdout rows never enter the
fit: their error is what the fit generalises to. The fitted values replace the defaults; a
``per_gpu`` entry of the base params would still override them.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from scipy.optimize import least_squares

from experiments.validate_public import load_rows, summary, validate
from hetrl.cost.params import DEFAULT_PARAMS, CostParams
from hetrl.cost.profiles import FRAMEWORK_PROFILES
from hetrl.spec.model import model_preset

#: the fit's step rows: verl logs whose every stage (not only the step) enters the fit -- the
#: report family of S12 and S18 (8 x H100), TinyZero's S15 (one RTX 4090) and the MI300X logs
#: S16 and S17 (docs/validation.md, "Fit and holdout")
STEP_ROWS = ("S12", "S15", "S16", "S17", "S18")
#: constant -> the fit rows that measure it ("H200" : the gpu-h200 kernel runs)
FITTED = {"train_flops": ("T1", "T2", "T3", "T4", "H200"), "infer_flops": ("F1", "H200"),
          "decode_hbm": ("G1", "G2", "G3", "G4"),
          "flops_half_hidden": ("T1", "T2", "T3", "T4", "F1", "H200"),
          "task_call_s": STEP_ROWS, "driver_s_per_token": STEP_ROWS,
          "rule_reward_s_per_sequence": STEP_ROWS, "decode_s_per_token": STEP_ROWS,
          "micro_batch_overhead_s": STEP_ROWS, "eager_launch_s_per_layer": STEP_ROWS}
#: CostParams fields among FITTED (the rest are kernel efficiencies in ``defaults``)
FIELDS = ("flops_half_hidden", "task_call_s", "driver_s_per_token", "rule_reward_s_per_sequence",
          "decode_s_per_token", "micro_batch_overhead_s", "eager_launch_s_per_layer")
#: bounds of each constant in the fit (log space: every start must be > 0)
BOUNDS = {"train_flops": (0.05, 1.0), "infer_flops": (0.05, 1.0), "decode_hbm": (0.05, 1.0),
          "flops_half_hidden": (100.0, 50_000.0), "task_call_s": (1e-3, 30.0),
          "driver_s_per_token": (1e-10, 1e-4), "rule_reward_s_per_sequence": (1e-7, 0.1),
          "decode_s_per_token": (1e-9, 1e-3), "micro_batch_overhead_s": (1e-5, 1.0),
          "eager_launch_s_per_layer": (1e-6, 0.01)}
#: where a constant starts when its default is 0 (a log-space fit cannot move a 0)
FLOOR_START = {"task_call_s": 0.1, "driver_s_per_token": 1e-7, "rule_reward_s_per_sequence": 1e-4,
               "decode_s_per_token": 1e-6, "micro_batch_overhead_s": 0.01}
#: the H200 kernel runs (JSON files under experiments/results/gpu-h200)
KERNEL_RUNS = ("kernels.json", "kernels-qwen3-4b.json", "kernels-qwen3-8b-seq2048.json")
KERNEL_DIR = Path(__file__).resolve().parent / "results" / "gpu-h200"


def _with(params: CostParams, values: Sequence[float]) -> CostParams:
    values = dict(zip(FITTED, (float(v) for v in values), strict=True))
    defaults = dict(params.defaults)
    defaults.update({k: v for k, v in values.items() if k in defaults})
    return replace(params, defaults=tuple(defaults.items()),
                   **{k: values[k] for k in FIELDS})


def _start(params: CostParams) -> list[float]:
    return [(getattr(params, k) or FLOOR_START[k]) if k in FIELDS else params.efficiency("", k)
            for k in FITTED]


def kernel_rows(directory: Path = KERNEL_DIR) -> list[dict]:
    """The H200 runs' training and inference forwards: per row the GPU type, the kernel kind,
    the model's hidden size, its FLOPs and the measured seconds."""
    rows = []
    for name in KERNEL_RUNS:
        run = json.loads((directory / name).read_text())
        hidden = model_preset(run["model"]).hidden
        for kind in ("train_flops", "infer_flops"):
            r = run["rows"][kind]
            rows.append({"id": f"H200 {run['model']} {kind} {r['batch']}x{r['seq']}",
                         "gpu": run["gpu_type"], "kind": kind, "hidden": hidden,
                         "flops": r["flops"], "peak": run["bf16_tflops"] * 1e12,
                         "measured_s": r["measured_s"]})
    return rows


def kernel_log_ratios(params: CostParams, rows: list[dict]) -> np.ndarray:
    """ln(estimate / measured) of kernel rows: FLOPs / (peak x the sized efficiency)."""
    return np.array([math.log(r["flops"] / (r["peak"] * params.flops_efficiency(
        r["gpu"], r["kind"], r["hidden"])) / r["measured_s"]) for r in rows])


#: the two phases of the fit: the kernel constants on the component rows and kernel runs, then,
#: with those fixed, the framework costs on the fit step rows (each constant on the rows that
#: measure it: an exotic GPU's step row does not move an efficiency fitted on datasheet GPUs)
PHASES = (("train_flops", "infer_flops", "decode_hbm", "flops_half_hidden"),
          ("task_call_s", "driver_s_per_token", "rule_reward_s_per_sequence",
           "decode_s_per_token", "micro_batch_overhead_s", "eager_launch_s_per_layer"))


def _fit_phase(params: CostParams, names: tuple[str, ...], start_all: dict[str, float],
               kernels: list[dict]) -> tuple[CostParams, Any]:
    """Least squares in log space over ``names`` (the others held at ``params``' values)."""
    ids = {i for k in names for i in FITTED[k]}
    rows = [r for r in load_rows() if r.id in ids]
    use_kernels = "H200" in ids
    start = np.log([start_all[k] for k in names])
    lo, hi = np.log([BOUNDS[k][0] for k in names]), np.log([BOUNDS[k][1] for k in names])

    def moved(logs: np.ndarray) -> CostParams:
        values = dict(start_all)
        values.update(zip(names, np.exp(logs), strict=True))
        return _with(params, [values[k] for k in FITTED])

    def residuals(logs: np.ndarray) -> np.ndarray:
        cand = moved(logs)
        df = validate(cand, rows)
        # the component rows' primary comparisons, the fit step rows' every stage
        used = df[(df["primary"].astype(bool) | df["id"].isin(STEP_ROWS))
                  & (df["status"] == "estimated")]
        parts = [np.log(used["ratio"].to_numpy(dtype=float))]
        if use_kernels:
            parts.append(kernel_log_ratios(cand, kernels))
        return np.concatenate(parts)

    res = least_squares(residuals, start, bounds=(lo, hi), method="trf", diff_step=1e-3)
    res.rms_before = float(np.sqrt(np.mean(residuals(start) ** 2)))
    return moved(res.x), res


#: the phases by name (``--phase``); ``profiles`` (each framework profile's scale) runs last
PHASE_NAMES = ("kernels", "framework", "profiles")
#: bounds of a profile's scale in the fit
SCALE_BOUNDS = (0.01, 100.0)


def profile_fit_rows() -> dict[str, tuple[str, ...]]:
    """Per framework profile whose scale is fitted on rows of its own (verl's are the base fit,
    not a scale) those rows."""
    return {p.name: p.fit_rows for p in FRAMEWORK_PROFILES.values()
            if p.controller and p.fit_rows and p.name != "verl"}


def fit_profiles(params: CostParams) -> tuple[CostParams, dict[str, dict]]:
    """``params`` with each fitted profile's scale (``framework_scale``) fitted on its fit rows'
    every comparison (one constant per profile, least squares in log space), and per profile
    the fitted scale and the rms of ln(estimate / measured) before and after."""
    rows = load_rows()
    report = {}
    for name, ids in profile_fit_rows().items():
        used = [r for r in rows if r.id in ids]
        others = tuple(x for x in params.framework_scale if x[0] != name)

        def with_scale(log_scale: float, others=others, name=name,
                       base=params) -> CostParams:
            return replace(base, framework_scale=others + ((name, float(np.exp(log_scale))),))

        def residuals(x: np.ndarray, used=used, with_scale=with_scale) -> np.ndarray:
            df = validate(with_scale(x[0]), used)
            return np.log(df[df["status"] == "estimated"]["ratio"].to_numpy(dtype=float))

        start = np.log([FRAMEWORK_PROFILES[name].scale])
        res = least_squares(residuals, start, bounds=np.log(SCALE_BOUNDS), method="trf",
                            diff_step=1e-3)
        params = with_scale(res.x[0])
        report[name] = {"rows": list(ids), "scale": float(np.exp(res.x[0])),
                        "start": float(np.exp(start[0])),
                        "rms_log_before": float(np.sqrt(np.mean(residuals(start) ** 2))),
                        "rms_log_after": float(np.sqrt(np.mean(res.fun ** 2))),
                        "converged": bool(res.success)}
    return params, report


def fit(params: CostParams = DEFAULT_PARAMS,
        phases: Sequence[str] = PHASE_NAMES) -> tuple[CostParams, dict]:
    """(fitted params, a report of the fit): least squares over the fit rows and kernel runs,
    in :data:`PHASES` (``phases``: the names of those to run; the others' constants stay at
    ``params``' values)."""
    kernels = kernel_rows()
    start = dict(zip(FITTED, _start(params), strict=True))
    values = dict(start)
    fitted, report_phases = params, []
    for name, names in zip(PHASE_NAMES[:2], PHASES, strict=True):  # (profiles: below)
        if name not in phases:
            continue
        fitted, res = _fit_phase(fitted, names, values, kernels)
        values.update(zip(names, np.exp(res.x), strict=True))
        report_phases.append({"constants": list(names), "rms_log_before": res.rms_before,
                       "rms_log_after": float(np.sqrt(np.mean(res.fun ** 2))),
                       "converged": bool(res.success),
                       "at_bound": [k for k, x in zip(names, res.x, strict=True)
                                    if np.isclose(x, np.log(BOUNDS[k][0]), atol=1e-6)
                                    or np.isclose(x, np.log(BOUNDS[k][1]), atol=1e-6)]})
    profiles = {}
    if "profiles" in phases:
        fitted, profiles = fit_profiles(fitted)
    report = {"fitted": {k: float(values[k]) for k in FITTED},
              "profiles": profiles,
              "start": {k: float(start[k]) for k in FITTED},
              "rows": {k: list(v) for k, v in FITTED.items()},
              "kernel_rows": {r["id"]: {"before": float(b), "after": float(a)} for r, b, a in
                              zip(kernels, kernel_log_ratios(params, kernels),
                                  kernel_log_ratios(fitted, kernels), strict=True)},
              "phases": report_phases,
              "converged": all(p["converged"] for p in [*report_phases, *profiles.values()])}
    return fitted, report


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print machine-readable JSON")
    ap.add_argument("--out", type=Path, help="write the fitted CostParams here (YAML)")
    ap.add_argument("--phase", choices=PHASE_NAMES, action="append",
                    help="fit only this phase (repeatable; default: all three, in order): "
                    "'framework' fits the per-step costs with the kernel constants as shipped; "
                    "'profiles' each framework profile's scale on its own fit rows")
    args = ap.parse_args(argv)
    before = summary(validate(DEFAULT_PARAMS))
    fitted, report = fit(DEFAULT_PARAMS, args.phase or PHASE_NAMES)
    after = summary(validate(fitted))
    report["median_abs_log_ratio"] = {"before": before["median_abs_log_ratio"],
                                      "after": after["median_abs_log_ratio"]}
    report["within_band_share"] = {"before": before["within_band_share"],
                                   "after": after["within_band_share"]}
    if args.out:
        tmp = args.out.with_suffix(args.out.suffix + ".tmp")
        values = dict(report["fitted"])
        fields = {k: values.pop(k) for k in FIELDS}
        scales = {k: v["scale"] for k, v in report["profiles"].items()}
        tmp.write_text(yaml.safe_dump({"defaults": values, **fields,
                                       **({"framework_scale": scales} if scales else {})},
                                      sort_keys=False))
        tmp.replace(args.out)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    for k, v in report["fitted"].items():
        print(f"{k:26s} {report['start'][k]:.4g} -> {v:.4g}   (rows {', '.join(FITTED[k])})")
    for name, r in report["kernel_rows"].items():
        print(f"  {name:40s} ln(est/meas) {r['before']:+.3f} -> {r['after']:+.3f}")
    for phase in report["phases"]:
        bound = f"; at a bound: {', '.join(phase['at_bound'])}" if phase["at_bound"] else ""
        print(f"rms ln(est/meas), {', '.join(phase['constants'])}: "
              f"{phase['rms_log_before']:.3f} -> {phase['rms_log_after']:.3f}{bound}")
    for name, r in report["profiles"].items():
        print(f"profile {name}: scale {r['start']:.3g} -> {r['scale']:.3g} (rows "
              f"{', '.join(r['rows'])}); rms ln(est/meas) {r['rms_log_before']:.3f} -> "
              f"{r['rms_log_after']:.3f}")
    for split in ("fit", "holdout"):
        b, a = before["median_abs_log_ratio"][split], after["median_abs_log_ratio"][split]
        wb, wa = before["within_band_share"][split], after["within_band_share"][split]
        print(f"{split:8s} median |ln(est/meas)| {b:.3f} -> {a:.3f} (factor {math.exp(a):.2f}); "
              f"within +-30%: {wb:.0%} -> {wa:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
