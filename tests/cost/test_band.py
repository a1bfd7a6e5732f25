"""The band of an estimate (hetrl.cost.band): its arithmetic on synthetic residuals, the class
fallback, unvalidated GPUs, the shipped residual table's consistency with the public rows, and
``hetrl estimate``'s band in JSON and text."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from hetrl.cost.band import (
    BAND_PERCENT,
    MIN_CLASS_ROWS,
    MIN_HALF_WIDTH,
    Residual,
    estimate_band,
    is_colocated,
    parse_residuals,
    percentile,
    residuals_csv,
    shipped_residuals,
)
from hetrl.errors import SpecError
from hetrl.plan import colocated_plan
from hetrl.spec.presets import cluster_preset, workload_preset
from tests.cli_helpers import run
from tests.cost.plans import split_plan

ROWS_DIR = Path(__file__).resolve().parents[2] / "experiments" / "public"
EST = ["estimate", "-w", "qwen3-8b-ppo-sync", "-c", "a100x8", "--colocate", "--tp", "4"]
WL, A100X8 = workload_preset("qwen3-8b-ppo-sync"), cluster_preset("a100x8")
COLO = colocated_plan(WL, A100X8, tp=4)
#: generation on GPUs 0-3, everything else on 4-7
SPLIT = split_plan(WL, A100X8, [(["actor_generation"], [0, 1, 2, 3], 2),
                                ([t for t in WL.task_names if t != "actor_generation"],
                                 [4, 5, 6, 7], 4)])


def res(i: int, ratio: float, colocated: bool = True, gpus: tuple[str, ...] = ("A100-80GB",),
        split: str = "holdout", kind: str = "step") -> Residual:
    return Residual(f"R{i}", split, kind, colocated, True, gpus, ratio, f"src{i}")


def test_is_colocated_needs_sync_and_generation_on_the_trainers_gpus():
    assert is_colocated(COLO, WL)
    assert not is_colocated(SPLIT, WL)
    wl_async = workload_preset("qwen3-8b-ppo-async")
    assert not is_colocated(colocated_plan(wl_async, A100X8, tp=4), wl_async)


def test_percentile_is_numpys_linear_one():
    xs = [0.3, 0.01, 2.0, 0.7, 0.05, 1.1, 0.4]
    for p in (0, 10, 50, 80, 100):
        assert percentile(xs, p) == pytest.approx(float(np.percentile(xs, p)), rel=1e-12)
    assert percentile([0.2], 80) == 0.2


def test_band_arithmetic_on_a_synthetic_table():
    ratios = [0.5, 0.8, 1.1, 1.3, 2.0, 0.9]
    rows = [res(i, r) for i, r in enumerate(ratios)]
    # fit rows, other kinds and the other class never enter the colocated band
    rows += [res(10, 50.0, split="fit", kind="gen"), res(11, 40.0, kind="sync"),
             res(12, 30.0, colocated=False)]
    b = estimate_band(100.0, COLO, WL, A100X8, rows)
    q = float(np.percentile([abs(math.log(r)) for r in ratios], BAND_PERCENT))
    assert b.cls == "colocated" == b.plan_class and b.rows == 6 and b.quantile == 80
    assert b.row_ids == tuple(f"R{i}" for i in range(6))
    assert b.half_width == pytest.approx(q)
    assert b.low_s == pytest.approx(100 * math.exp(-q)) and b.high_s == pytest.approx(
        100 * math.exp(q))
    assert b.low_s < 100 < b.high_s and b.low_s * b.high_s == pytest.approx(100 ** 2)
    assert b.unvalidated == ()
    assert b.description == "80% band from 6 published co-located steps"


def test_the_band_is_never_empty():
    b = estimate_band(10.0, COLO, WL, A100X8, [res(i, 1.0) for i in range(MIN_CLASS_ROWS)])
    assert b.half_width == MIN_HALF_WIDTH
    assert b.low_s == pytest.approx(10 / 1.05) and b.high_s == pytest.approx(10 * 1.05)


def test_a_class_with_too_few_rows_takes_every_row():
    rows = [res(i, 1.5) for i in range(6)] + [res(6, 3.0, colocated=False)]
    b = estimate_band(50.0, SPLIT, WL, A100X8, rows)
    assert b.cls == "all" and b.plan_class == "disaggregated" and b.rows == 7
    assert b.half_width == pytest.approx(float(np.percentile([math.log(1.5)] * 6 + [math.log(3)],
                                                             80)))
    assert b.class_rows == 1
    assert b.description == "80% band from all 7 published steps; only 1 disaggregated"
    # enough rows of its own class: only those
    rows += [res(i, 2.0, colocated=False) for i in range(7, 7 + MIN_CLASS_ROWS)]
    b = estimate_band(50.0, SPLIT, WL, A100X8, rows)
    assert b.cls == "disaggregated" and b.rows == 1 + MIN_CLASS_ROWS
    assert "R0" not in b.row_ids


def test_gpus_without_a_published_step_are_listed():
    cluster = cluster_preset("paper48-a100-l40s-single-region")
    plan = colocated_plan(WL, cluster, tp=4)
    rows = [res(i, 1.2) for i in range(5)]
    b = estimate_band(100.0, plan, WL, cluster, rows)
    assert b.unvalidated == ("L40S",) and b.low_s < 100 < b.high_s
    # a row on any class counts as validation of its GPUs
    b = estimate_band(100.0, plan, WL, cluster, rows + [res(9, 1.0, False, ("L40S", "H100"))])
    assert b.unvalidated == ()
    assert estimate_band(100.0, COLO, WL, A100X8, [res(0, 1.0, gpus=("H100",))]).unvalidated \
        == ("A100-80GB",)


def test_no_band_without_rows_or_a_finite_estimate():
    assert estimate_band(10.0, COLO, WL, A100X8, []) is None
    assert estimate_band(10.0, COLO, WL, A100X8, [res(0, 2.0, split="fit", kind="gen")]) is None
    assert estimate_band(math.inf, COLO, WL, A100X8, [res(0, 2.0)]) is None


def test_residual_csv_round_trips_and_refuses_bad_ratios():
    rows = (res(1, 0.25), Residual("S9", "holdout", "step", False, False, ("H20", "L4"), 11.5,
                                   "a, b"))
    assert parse_residuals(residuals_csv(rows)) == rows
    text = residuals_csv(rows).replace("0.25", "-1")
    with pytest.raises(SpecError, match="line 2: ratio"):
        parse_residuals(text)
    with pytest.raises(SpecError, match="missing columns"):
        parse_residuals("id,ratio\nS1,1.0\n")


def test_shipped_residuals_are_holdout_step_rows_of_the_public_set():
    rows = shipped_residuals()
    assert rows and len({r.id for r in rows}) == len(rows)
    for r in rows:
        assert r.split == "holdout" and r.kind == "step"
        path = ROWS_DIR / f"{r.id}.yaml"
        assert path.is_file(), r.id
        data = yaml.safe_load(path.read_text())
        assert data["split"] == "holdout" and data["kind"] == "step" and not data.get("skip")
        assert r.source_key == str(data["source_key"])
        assert r.gpus and r.ratio > 0 and math.isfinite(r.ratio)


# --- hetrl estimate ------------------------------------------------------------------------

def test_estimate_json_and_text_carry_the_band(capsys):
    code, out, err = run(capsys, *EST, "--json")
    assert code == 0, err
    d = json.loads(out)
    low, high = d["iteration_s_band"]
    assert low < d["iteration_s"] < high
    src = d["band_source"]
    assert src["quantile"] == 80 and src["class"] in ("colocated", "all")
    assert src["rows"] == len(src["row_ids"]) > 0 and src["unvalidated_gpus"] == []
    assert src["description"]
    code, out, err = run(capsys, *EST)
    assert code == 0 and err == ""
    first = out.splitlines()[0]
    assert first.startswith(f"qwen3-8b-ppo-sync on a100x8: {d['iteration_s']:.2f} s per "
                            "iteration (")
    assert f"s, {src['description']}) (" in first and "samples/s" in first
    assert "band: no published steps" not in out


def test_estimate_notes_unvalidated_gpus_and_infeasible_has_no_band(capsys):
    if any("L40S" in r.gpus for r in shipped_residuals()):
        pytest.skip("the shipped residuals now have an L40S step")
    code, out, _ = run(capsys, "estimate", "-w", "qwen3-8b-ppo-sync", "-c",
                       "paper48-a100-l40s-single-region", "--colocate", "--tp", "4")
    assert code == 0
    assert out.splitlines()[1] == ("  band: no published steps on L40S; the band is from other "
                                   "GPUs' steps")
    code, out, _ = run(capsys, "estimate", "-w", "qwen3-8b-ppo-sync", "-c", "a100x8",
                       "--colocate", "--tp", "1", "--json")
    d = json.loads(out)
    assert code == 3 and d["iteration_s_band"] is None and d["band_source"] is None
