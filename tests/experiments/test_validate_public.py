"""The public-measurement validation (experiments/validate_public.py, docs/validation.md)."""

from __future__ import annotations

import dataclasses
import json
import math
from collections import defaultdict

import pandas as pd
import pytest

from experiments import validate_public as vp
from hetrl.cost.framework import without_framework
from hetrl.cost.model import CostModel
from hetrl.cost.params import DEFAULT_PARAMS

#: The 36 rows of shared/data/public_measurements.md, and the mixture-of-experts rows found
#: for issue 57 (NeMo-RL's GRPO steps S22-S25; NeMo AutoModel's and Megatron-Bridge's MoE
#: training T5-T8; verl's 235B weight sync W5; Megatron-LM's memory test T9: sources in the
#: files).
IDS = ([f"S{i}" for i in range(1, 26)] + [f"G{i}" for i in range(1, 7)] + ["F1"]
       + [f"T{i}" for i in range(1, 12)] + [f"W{i}" for i in range(1, 6)])
#: Cheap rows that every hetrl version can estimate (no FSDP backend needed).
QUICK = ("G1", "G2", "F1", "T1", "W1", "W4", "S1")


@pytest.fixture(scope="module")
def rows() -> list[vp.Row]:
    return vp.load_rows()


@pytest.fixture(scope="module")
def quick(rows) -> pd.DataFrame:
    return vp.validate(DEFAULT_PARAMS, [r for r in rows if r.id in QUICK])


def test_every_measurement_has_one_row_file_that_loads(rows):
    assert sorted(r.id for r in rows) == sorted(IDS)
    for r in rows:
        assert r.kind == {"S": "step", "G": "gen", "F": "fwd", "T": "train", "W": "sync"}[r.id[0]]
        assert r.source and r.source_key
        # every row states where it comes from and what was assumed in its header comment
        header = r.path.read_text().split("\nid:")[0]
        assert header.startswith(f"# {r.id} -- ") and "Source:" in header
        assert r.skip or ("Assumptions" in header and r.compare)


def test_at_most_half_the_rows_fit_and_no_source_on_both_sides(rows):
    splits = [r.split for r in rows]
    assert splits.count("fit") <= len(rows) / 2
    sides = defaultdict(set)
    for r in rows:
        sides[r.source_key].add(r.split)
    assert all(len(s) == 1 for s in sides.values()), {k: s for k, s in sides.items() if len(s) > 1}
    # the fit's step rows are the verl logs that pin the per-step framework costs
    # (fit_public.STEP_ROWS); every other step row is holdout
    from experiments import fit_public

    assert {r.id for r in rows if r.kind == "step" and r.split == "fit"} == \
        set(fit_public.STEP_ROWS)
    holdout_steps = [r for r in rows if r.kind == "step" and r.split == "holdout"]
    assert len(holdout_steps) >= len(fit_public.STEP_ROWS) * 2


def test_each_step_row_names_its_framework_and_profiles_fit_on_their_own_rows(rows):
    from hetrl.cost.profiles import FRAMEWORK_PROFILES

    assert all("framework" in r.workload for r in rows if r.kind == "step")
    by_id = {r.id: r for r in rows}
    for prof in FRAMEWORK_PROFILES.values():
        for i in prof.fit_rows:
            assert by_id[i].split == "fit" and vp.row_framework(by_id[i]) == prof.name, (prof, i)
    # a component row (an engine, a trainer, a sync) is priced with no framework's costs
    assert {vp.row_framework(r) for r in rows if r.kind != "step"} == {"none"}


def test_estimated_ratios_are_positive_finite_and_estimate_over_measured(quick):
    est = quick[quick["status"] == "estimated"]
    assert set(est["id"]) == set(QUICK)
    for _, r in est.iterrows():
        assert r["estimate_s"] > 0 and r["measured_s"] > 0
        assert math.isfinite(r["ratio"]) and r["ratio"] > 0
        assert r["ratio"] == pytest.approx(r["estimate_s"] / r["measured_s"], rel=1e-12)
        assert r["abs_log_ratio"] == pytest.approx(abs(math.log(r["ratio"])), rel=1e-12)
        assert r["within_band"] == (abs(r["ratio"] - 1) <= vp.BAND)


def test_measured_seconds_by_hand(rows, quick):
    by_id = {r["id"]: r for _, r in quick[quick["primary"]].iterrows()}
    assert by_id["G1"]["measured_s"] == pytest.approx(256 * 128 / 5390)  # 6.079 s
    assert by_id["G2"]["measured_s"] == pytest.approx(32 * 2048 / 1484)  # 44.16 s
    assert by_id["F1"]["measured_s"] == pytest.approx(0.1324)
    assert by_id["S1"]["measured_s"] == pytest.approx(15.4 * 3600 * 16 / 264292)  # 3.356 s
    # T1: Megatron's FLOPs of 192 x 4096 tokens of the 7.1B GPT over 465.9 TFLOP/s x 96 GPUs
    b, s, lay, h, v = 192, 4096, 30, 4096, 131072
    flops = 12 * b * s * lay * h * h * ((1 + 1 + s / h) + 4 + v / (2 * lay * h))
    assert by_id["T1"]["measured_s"] == pytest.approx(flops / (465.9e12 * 96))
    t4 = next(r for r in rows if r.id == "T4")
    assert vp.measured_seconds(t4.compare[0], vp.build_workload(t4)) == pytest.approx(16 * 8192 / (5762 * 8))


def test_megatron_flops_swiglu_and_gqa_terms():
    # one layer, h = 2, s = 2, V = 4, a = 2, g = 1 query group, ffn 4, SwiGLU:
    # 12 * 1 * 2 * 1 * 4 * [(1 + 1/2 + 1) * 1 + 2 * 1.5 + 4 / 4] = 96 * 6.5
    assert vp.megatron_flops(1, 2, 1, 2, 4, 2, 4, query_groups=1, swiglu=True) == 96 * 6.5


def test_json_output_has_the_documented_keys(capsys, tmp_path):
    code = vp.main(["--json", "--only", "G1,F1,W3,G5", "--csv", str(tmp_path / "p.csv"),
                    "--figure", str(tmp_path / "p.png")])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["median_abs_log_ratio"]) == {"fit", "holdout"}
    assert out["median_abs_log_ratio"]["holdout"] is None  # no holdout row was asked for
    ids = [r["id"] for r in out["rows"]]
    assert sorted(ids) == ["F1", "G1", "G5", "W3"]
    for r in out["rows"]:
        assert {"id", "estimate_s", "measured_s", "ratio", "split", "kind", "quantity",
                "reason", "status", "stages"} <= set(r)
    skipped = {r["id"]: r for r in out["rows"] if r["status"] == "skipped"}
    # (G5, an FP8 row, is estimated since issue 57)
    assert set(skipped) == {"W3"} and all(r["ratio"] is None for r in skipped.values())
    assert all(r["reason"] for r in skipped.values())
    fit = [r for r in out["rows"] if r["status"] == "estimated"]
    expected = sorted(abs(math.log(r["ratio"])) for r in fit)
    assert len(expected) == 3 and out["median_abs_log_ratio"]["fit"] == pytest.approx(expected[1])
    table = pd.read_csv(tmp_path / "p.csv")
    assert list(table.columns) == vp.COLUMNS and set(table["id"]) == {"G1", "G5", "F1", "W3"}
    assert (tmp_path / "p.png").stat().st_size > 0


def test_every_estimated_record_says_whether_its_plan_is_colocated(quick):
    est = quick[quick["status"] == "estimated"]
    assert all(isinstance(v, bool) for v in est["colocated"])
    by_id = {r["id"]: r["colocated"] for _, r in est[est["primary"]].iterrows()}
    # S1: DeepSpeed-Chat's hybrid engine; a component row's generation is on its own GPUs
    assert by_id["S1"] is True and by_id["G1"] is False and by_id["W1"] is False
    out = vp.to_json(quick)
    assert all("colocated" in r for r in out["rows"])


def test_summary_gives_the_median_step_ratio_per_class(quick):
    s = vp.summary(quick)
    s1 = quick[(quick["id"] == "S1") & quick["primary"]]["ratio"].iloc[0]
    # S1 is the only holdout step row of the quick set
    assert s["median_ratio_step_holdout"] == {"colocated": pytest.approx(s1),
                                              "disaggregated": None}
    assert s["step_holdout_rows"] == {"colocated": 1, "disaggregated": 0}
    assert "holdout step rows, median est/meas: colocated" in vp.table(quick)


def test_residuals_are_the_holdout_step_rows_primary_comparisons(capsys, tmp_path):
    from hetrl.cost.band import parse_residuals

    shipped = vp.RESIDUALS_PATH.read_bytes()
    common = ["--csv", str(tmp_path / "p.csv"), "--figure", str(tmp_path / "p.png")]
    # --only without --residuals leaves the shipped table alone (a partial one would replace it)
    assert vp.main(["--json", "--only", "S1,G1", *common]) == 0
    assert vp.RESIDUALS_PATH.read_bytes() == shipped
    out = json.loads(capsys.readouterr().out)
    assert {r["id"]: r["colocated"] for r in out["rows"]} == {"S1": True, "G1": False}
    assert vp.main(["--json", "--only", "S1,G1,W3", *common,
                    "--residuals", str(tmp_path / "r.csv")]) == 0
    capsys.readouterr()
    (r,) = parse_residuals((tmp_path / "r.csv").read_text())  # not G1 (fit), not W3 (skipped)
    assert (r.id, r.split, r.kind, r.colocated, r.gpus) == ("S1", "holdout", "step", True,
                                                           ("A100-40GB",))
    ratio = next(x["ratio"] for x in out["rows"] if x["id"] == "S1")
    assert r.ratio == pytest.approx(ratio, rel=1e-5)


def test_step_rows_report_each_stage_under_the_primary_comparison(rows):
    s12 = next(r for r in rows if r.id == "S12")
    labels = [c["label"] for c in s12.compare]
    assert labels[0].startswith("step") and {"gen", "old_log_prob", "ref", "update_actor"} <= set(labels)
    df = vp.validate(DEFAULT_PARAMS, [s12])
    if (df["status"] == "estimated").all():  # the FSDP backend is in this hetrl
        assert list(df["primary"]) == [True, False, False, False, False]
        assert set(df["quantity"][1:]) == {"gen", "old_log_prob", "ref", "update_actor"}
    else:
        assert len(df) == 1 and "not estimated" in df["reason"].iloc[0]


def test_a_row_that_cannot_be_built_is_skipped_with_its_reason(rows):
    g1 = next(r for r in rows if r.id == "G1")
    bad = vp.Row(**{**g1.__dict__, "layout": {"groups": [{"tasks": ["no_such_task"]}]}})
    df = vp.validate(DEFAULT_PARAMS, [bad])
    assert list(df["status"]) == ["skipped"]
    assert "no_such_task" in df["reason"].iloc[0]


def test_the_fit_reads_only_fit_rows_and_moves_only_their_kernels(rows):
    """experiments/fit_public.py: every row it fits on is in the fit split (the holdout rows
    never enter it), and a fitted value changes only the efficiency it names."""
    from experiments import fit_public

    split = {r.id: r.split for r in rows}
    # ("H200": the gpu-h200 kernel runs, not rows of the public set)
    assert all(split[i] == "fit" for ids in fit_public.FITTED.values() for i in ids
               if i != "H200")
    assert list(fit_public.FITTED)[:4] == ["train_flops", "infer_flops", "decode_hbm",
                                           "flops_half_hidden"]
    # the two phases fit every constant once, the kernels' before the framework costs
    assert [k for phase in fit_public.PHASES for k in phase] == list(fit_public.FITTED)
    assert set(fit_public.PHASES[1]) == set(fit_public.FIELDS) - {"flops_half_hidden"}
    framework = [0.5, 1e-7, 1e-4, 1e-6, 0.01, 1e-4]
    moved = fit_public._with(DEFAULT_PARAMS, [0.9, 0.8, 0.7, 1234.0, *framework])
    assert [moved.efficiency("A100-80GB", k) for k in list(fit_public.FITTED)[:3]] == \
        [0.9, 0.8, 0.7]
    assert moved.flops_half_hidden == 1234.0
    assert [getattr(moved, k) for k in fit_public.PHASES[1]] == framework
    for kind in ("decode_flops", "hbm", "link"):
        assert moved.efficiency("A100-80GB", kind) == DEFAULT_PARAMS.efficiency("A100-80GB", kind)
    # the kernel runs: one training and one inference row per run, at the run's hidden size
    kernels = fit_public.kernel_rows()
    assert len(kernels) == 2 * len(fit_public.KERNEL_RUNS)
    assert {r["hidden"] for r in kernels} == {2560, 4096}


def test_rows_with_unknown_lengths_are_reported_apart_with_their_range(rows, quick):
    """S8-S11 and S13 publish only length caps: each is also priced at plausible mean lengths
    below its cap, carries the range of its ratios, and stays out of the pooled medians and the
    band's residuals."""
    unknown = [r for r in rows if r.lengths == "unknown"]
    assert sorted(r.id for r in unknown) == ["S10", "S11", "S13", "S8", "S9"]
    s9 = [r for r in unknown if r.id == "S9"]
    df = pd.concat([quick, vp.validate(DEFAULT_PARAMS, s9)], ignore_index=True)
    row = df[(df["id"] == "S9") & df["primary"].astype(bool)].iloc[0]
    assert row["status"] == "estimated" and row["lengths"] == "unknown"
    # priced at its cap (every response 28,672 tokens) it is the slowest of its pricings
    assert row["ratio_low"] < row["ratio"] == row["ratio_high"]
    s = vp.summary(df)
    assert [u["id"] for u in s["lengths_unknown"]] == ["S9"]
    assert s["lengths_unknown"][0]["measured_in_range"] == (row["ratio_low"] <= 1)
    pooled = quick[quick["primary"].astype(bool) & (quick["split"] == "holdout")]
    assert s["estimated"]["holdout"] == len(pooled)  # S9 is not among them
    assert "S9" not in {r.id for r in vp.residuals(df)}
    entry = next(e for e in vp.to_json(df)["rows"] if e["id"] == "S9")
    assert entry["lengths"] == "unknown" and entry["ratio_low"] < entry["ratio_high"]
    assert all(e["lengths"] == "published" for e in vp.to_json(quick)["rows"])


def test_a_peak_memory_comparison_is_in_gb_and_not_pooled(rows, quick):
    """T9 publishes Megatron's peak allocated memory (53.22 GiB): compared with the cost model's
    peak on the busiest of the 8 measured GPUs (the padding node left out), in GB, within its
    own +-15% band, summarised apart from the time comparisons."""
    t9 = [r for r in rows if r.id == "T9"]
    df = pd.concat([quick, vp.validate(DEFAULT_PARAMS, t9)], ignore_index=True)
    row = df[df["id"] == "T9"].iloc[0]
    assert row["status"] == "estimated" and row["measure"] == "memory"
    assert row["measured_s"] == pytest.approx(53.22 * 2**30 / 1e9)
    workload, (cluster, measured) = vp.build_workload(t9[0]), vp.build_cluster(t9[0])
    plan = vp.build_plan(t9[0], workload, cluster, measured)
    est = CostModel(workload, cluster, without_framework(DEFAULT_PARAMS)).estimate(plan)
    assert row["estimate_s"] == max(gb for d, gb in est.peak_memory_gb.items() if d < measured)
    assert row["within_band"] == (abs(row["ratio"] - 1) <= 0.15)
    s = vp.summary(df)
    assert s["peak_memory"]["comparisons"] == 1 and s["peak_memory"]["ratios"] == {
        "T9": pytest.approx(row["ratio"])}
    assert s["estimated"] == vp.summary(quick)["estimated"]  # not pooled with the times
    assert all(r["measure"] == "time" for _, r in quick.iterrows())


def test_a_rows_band_is_built_without_its_own_source():
    """in_band: the measured step inside the 80% band its estimate gets from other sources'
    holdout steps only (leave-one-source-out), so that no row vouches for itself."""
    from experiments.band_coverage import in_band
    from hetrl.cost.band import Residual, half_width

    def res(i, ratio, source):
        return Residual(id=f"R{i}", split="holdout", kind="step", colocated=True,
                        feasible=True, gpus=("H100",), ratio=ratio, source_key=source)

    own = [res(i, 3.0, "A") for i in range(5)]  # its own source's rows are far off
    others = [res(10 + i, 1.0 + 0.05 * i, "B") for i in range(6)]
    q = half_width(True, others)[0]
    row = {"kind": "step", "status": "estimated", "measure": "time", "source_key": "A",
           "colocated": True}
    assert in_band({**row, "ratio": math.exp(0.99 * q)}, own + others) is True
    assert in_band({**row, "ratio": math.exp(1.01 * q)}, own + others) is False
    assert in_band({**row, "ratio": 1.0}, own) is None  # no other source left
    assert in_band({**row, "kind": "train", "ratio": 1.0}, others) is None


def test_json_rows_say_whether_the_measured_step_is_in_its_band(quick):
    for entry in vp.to_json(quick)["rows"]:
        assert "in_band" in entry
        if entry["kind"] != "step":
            assert entry["in_band"] is None


def test_a_profile_with_fit_rows_gets_its_scale_fitted_on_them(monkeypatch):
    """fit_public's profiles phase: one scale per profile that names fit rows of its own, fitted
    on them alone (here a one-row profile, which the scale then matches exactly)."""
    from experiments import fit_public
    from hetrl.cost import profiles

    prof = profiles.FRAMEWORK_PROFILES["deepspeed-chat"]
    monkeypatch.setitem(profiles.FRAMEWORK_PROFILES, "deepspeed-chat",
                        dataclasses.replace(prof, fit_rows=("S1",)))
    assert fit_public.profile_fit_rows() == {"deepspeed-chat": ("S1",)}
    fitted, report = fit_public.fit_profiles(DEFAULT_PARAMS)
    r = report["deepspeed-chat"]
    assert r["converged"] and r["rms_log_after"] < min(1e-3, r["rms_log_before"])
    assert dict(fitted.framework_scale)["deepspeed-chat"] == pytest.approx(r["scale"])
    s1 = next(row for row in vp.load_rows() if row.id == "S1")
    assert vp.validate(fitted, [s1])["ratio"].iloc[0] == pytest.approx(1.0, abs=1e-3)


def test_a_pair_of_one_job_on_two_gpu_types_holds_the_ratio_of_estimates_to_the_measured(rows):
    """Issue 58, item 3: T10 (8 B200) is T7's job on another GPU type (``pair_of``); the
    pair's measured speed ratio is the rows' per-GPU throughputs' and its error the estimated
    ratio over the measured."""
    pair = [r for r in rows if r.id in ("T7", "T10")]
    df = vp.validate(DEFAULT_PARAMS, pair)
    (p,) = vp.summary(df)["gpu_pairs"]
    assert (p["id"], p["pair_of"], p["gpus"]) == ("T10", "T7", ["B200", "H100"])
    assert p["measured_ratio"] == pytest.approx(27136 / 8960, rel=1e-3)
    ratio = df.set_index("id")["ratio"]
    assert p["error"] == pytest.approx(ratio["T7"] / ratio["T10"], rel=1e-9)
    assert p["within"] == (1 / 1.2 <= p["error"] <= 1.2)
    assert "one job on two GPU types" in vp.table(df)


def test_rows_that_ran_fit_the_memory_model(rows):
    """Issue 58: real runs are not called impossible. S19/S20 (a reference forward at 32
    sequences per micro-batch), T4 (selective checkpointing), T5 (FSDP with expert
    parallelism), T6 (a bf16 model stepped by torch.optim.Adam: no fp32 master or states) and
    W4 fit, and the summary lists none; priced with an fp32 optimizer T6 does not fit, and the
    summary names it."""
    chosen = [r for r in rows if r.id in ("S19", "S20", "T4", "T5", "T6", "W4")]
    df = vp.validate(DEFAULT_PARAMS, chosen)
    primary = df[df["primary"].astype(bool)].set_index("id")
    assert primary["feasible"].astype(bool).all(), primary["feasible"].to_dict()
    assert vp.summary(df)["infeasible"] == []
    t6 = next(r for r in chosen if r.id == "T6")
    fp32 = dataclasses.replace(t6, workload={**t6.workload, "optimizer_precision": "fp32"})
    assert vp.summary(vp.validate(DEFAULT_PARAMS, [fp32]))["infeasible"] == ["T6"]


def test_moe_holdout_rows_are_summarised_against_issue_57s_target(rows):
    """The mixture-of-experts rows are marked (``moe``) and their holdout median is summarised
    and printed beside the target; a dense row is not counted, nor a row with unknown
    lengths."""
    chosen = [r for r in rows if r.id in ("W2", "T7", "S1", "S11")]
    df = vp.validate(DEFAULT_PARAMS, chosen)
    primary = df[df["primary"].astype(bool)].set_index("id")
    assert primary["moe"].astype(bool).to_dict() == {"W2": True, "T7": True, "S1": False,
                                                     "S11": True}
    moe = vp.summary(df)["moe_holdout"]
    assert moe["rows"] == ["T7", "W2"] and moe["target"] == vp.MOE_TARGET
    assert moe["median_abs_log_ratio"] == pytest.approx(
        primary.loc[["T7", "W2"], "abs_log_ratio"].median())
    assert "mixture-of-experts holdout rows: median" in vp.table(df)
