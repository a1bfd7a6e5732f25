"""Fit the cost model's kernel efficiencies on the public set's fit rows, then report both splits.

    PYTHONPATH=. python experiments/fit_public.py [--json] [--out PARAMS.yaml]

Each efficiency is fitted on the rows that measure its kernels (the measurements file's "How to
use", step 4): ``train_flops`` on the training rows (T1-T4), ``infer_flops`` on the prefill row
(F1), ``decode_hbm`` on the generation rows (G1-G4). The residuals are ln(estimate / measured)
of those rows' primary comparisons, minimised together by ``scipy.optimize.least_squares`` in
log space within [0.05, 1] (a generation row's prefill also depends on ``infer_flops``). The
holdout rows (S1-S14, W1, W2) never enter the fit: their error is what the fit generalises to.
The fitted values replace the kinds' defaults; a ``per_gpu`` entry of the base params would
still override them.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import yaml
from scipy.optimize import least_squares

from experiments.validate_public import load_rows, summary, validate
from hetrl.cost.params import DEFAULT_PARAMS, CostParams

#: efficiency kind -> the fit rows that measure it
FITTED = {"train_flops": ("T1", "T2", "T3", "T4"), "infer_flops": ("F1",),
          "decode_hbm": ("G1", "G2", "G3", "G4")}
BOUNDS = (0.05, 1.0)


def _with(params: CostParams, values: Sequence[float]) -> CostParams:
    defaults = dict(params.defaults)
    defaults.update(zip(FITTED, (float(v) for v in values), strict=True))
    return replace(params, defaults=tuple(defaults.items()))


def fit(params: CostParams = DEFAULT_PARAMS) -> tuple[CostParams, dict]:
    """(fitted params, a report of the fit): least squares over the fit rows of each kind."""
    rows = [r for r in load_rows() if any(r.id in ids for ids in FITTED.values())]
    start = np.log([params.efficiency("", k) for k in FITTED])

    def residuals(logs: np.ndarray) -> np.ndarray:
        df = validate(_with(params, np.exp(logs)), rows)
        primary = df[df["primary"].astype(bool) & (df["status"] == "estimated")]
        return np.log(primary["ratio"].to_numpy(dtype=float))

    res = least_squares(residuals, start, bounds=(np.log(BOUNDS[0]), np.log(BOUNDS[1])),
                        method="trf", diff_step=1e-3)
    fitted = _with(params, np.exp(res.x))
    report = {"fitted": {k: float(v) for k, v in zip(FITTED, np.exp(res.x), strict=True)},
              "start": {k: float(v) for k, v in zip(FITTED, np.exp(start), strict=True)},
              "rows": {k: list(v) for k, v in FITTED.items()},
              "rms_log_before": float(np.sqrt(np.mean(residuals(start) ** 2))),
              "rms_log_after": float(np.sqrt(np.mean(res.fun ** 2))),
              "converged": bool(res.success)}
    return fitted, report


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print machine-readable JSON")
    ap.add_argument("--out", type=Path, help="write the fitted CostParams here (YAML)")
    args = ap.parse_args(argv)
    before = summary(validate(DEFAULT_PARAMS))
    fitted, report = fit(DEFAULT_PARAMS)
    after = summary(validate(fitted))
    report["median_abs_log_ratio"] = {"before": before["median_abs_log_ratio"],
                                      "after": after["median_abs_log_ratio"]}
    report["within_band_share"] = {"before": before["within_band_share"],
                                   "after": after["within_band_share"]}
    if args.out:
        tmp = args.out.with_suffix(args.out.suffix + ".tmp")
        tmp.write_text(yaml.safe_dump({"defaults": report["fitted"]}, sort_keys=False))
        tmp.replace(args.out)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    for k, v in report["fitted"].items():
        print(f"{k:12s} {report['start'][k]:.3f} -> {v:.3f}   (rows {', '.join(FITTED[k])})")
    print(f"rms ln(est/meas) on the fitted rows: {report['rms_log_before']:.3f} -> "
          f"{report['rms_log_after']:.3f}")
    for split in ("fit", "holdout"):
        b, a = before["median_abs_log_ratio"][split], after["median_abs_log_ratio"][split]
        wb, wa = before["within_band_share"][split], after["within_band_share"][split]
        print(f"{split:8s} median |ln(est/meas)| {b:.3f} -> {a:.3f} (factor {math.exp(a):.2f}); "
              f"within +-30%: {wb:.0%} -> {wa:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
