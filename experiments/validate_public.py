"""Validation of the cost model against published measurements (docs/validation.md).

Every row of ``shared/data/public_measurements.md`` is one YAML file in ``experiments/public/``
(``S12.yaml``, ...): its source, every assumption made for a detail the source leaves out (in the
header comment), the workload, the cluster, a compact layout and the measured numbers. This
script builds a ``WorkloadSpec``, a ``ClusterSpec`` and a ``Plan`` from each, estimates it with
hetrl's cost model and compares like with like:

- step rows: the iteration time, and each stage the source breaks out (generation, the actor's
  old log-probs, the reference, the actor update);
- gen rows: generation time for the measured output tokens (output tokens / measured tokens/s);
- fwd rows: seconds of one forward (time to first token);
- train rows: one optimizer step, measured seconds = the step's FLOPs (as the source counts them)
  / measured FLOP/s, or its tokens / measured tokens/s;
- sync rows: seconds of one weight sync.

Component rows (gen, fwd, train, sync) place the measured task(s) on the measured GPUs; the
workload's other tasks go to a *padding* node whose time is never read (a task group's time and
memory depend only on its own devices), and a task's rollout-transfer part from that node is left
out.

    python experiments/validate_public.py            # table; writes the CSV and the figure
    python experiments/validate_public.py --json     # {"rows": [...], "median_abs_log_ratio": ...}

Each record says whether its plan is ``colocated`` (:func:`hetrl.cost.band.is_colocated`: sync,
generation on actor_training's GPUs). The holdout step rows' primary comparisons are also
written to ``hetrl/data/validation_residuals.csv``, the residuals ``hetrl estimate`` takes its
band from (:mod:`hetrl.cost.band`).

``validate(params)`` returns the comparisons as a DataFrame, so a fit can pass other
``CostParams``; nothing here changes a constant.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from hetrl.cost.band import Residual, is_colocated, residuals_csv
from hetrl.cost.lengths import length_stats
from hetrl.cost.model import CostModel, Estimate
from hetrl.cost.params import DEFAULT_PARAMS, CostParams
from hetrl.cost.workflow import stage_makespan
from hetrl.io import write_text_atomic
from hetrl.plan import Plan
from hetrl.spec.workload import WorkloadSpec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # (run as a script)
from experiments.band_coverage import coverage, in_band  # noqa: E402
from experiments.peak_memory import (  # noqa: E402
    MEMORY_BAND,
    estimated_gb,
    is_memory,
    measured_gb,
)
from experiments.public_rows import (  # noqa: E402  (Row and the builders: re-exported)
    ROOT,
    SPLITS,
    Row,
    RowError,
    build_cluster,
    build_plan,
    build_workload,
    load_rows,
)
from experiments.unknown_lengths import plausible_workloads  # noqa: E402

CSV_PATH = ROOT / "experiments" / "results" / "public.csv"
FIGURE_PATH = ROOT / "figures" / "public.png"
#: The residuals shipped with hetrl (hetrl.cost.band): holdout step rows, primary comparisons.
RESIDUALS_PATH = ROOT / "hetrl" / "data" / "validation_residuals.csv"
STAGES = {"generation": 0, "inference": 1, "training": 2}
#: A comparison within this factor of the measurement counts as a hit (the +-30% band).
BAND = 0.30



# --- quantities ------------------------------------------------------------------------------

def megatron_flops(batch: int, seq: int, layers: int, hidden: int, ffn: int, heads: int,
                   vocab: int, query_groups: int | None = None, swiglu: bool = False,
                   kv_channels: int | None = None) -> float:
    """FLOPs of one training iteration as Megatron-LM counts them for its TFLOP/s
    (``num_floating_point_operations`` in ``megatron/training/training.py``, 2024): 12 B s l h^2
    x [(1 + g/a + s/h) q/h + (f/h) (3/2 if SwiGLU) + V / (2 l h)] -- forward and backward of
    every GEMM, full (not causal) attention, no recomputation."""
    kv = kv_channels or hidden // heads
    groups = query_groups or heads
    q_ratio = kv * heads / hidden
    gated = 1.5 if swiglu else 1.0
    return (12.0 * batch * seq * layers * hidden * hidden
            * ((1 + groups / heads + seq / hidden) * q_ratio + ffn / hidden * gated
               + vocab / (2 * layers * hidden)))


def measured_seconds(comp: Mapping[str, Any], workload: WorkloadSpec) -> float:
    """A published number in seconds. Throughputs become the time for this workload's tokens
    (or FLOPs) at the published rate; an epoch time the time for this workload's samples."""
    value, unit = float(comp["value"]), comp.get("unit", "s")
    L = length_stats(workload)
    n = workload.samples
    gpus = comp.get("gpus")
    if unit == "s":
        return value
    if unit == "ms":
        return value / 1e3
    if unit == "h":
        return value * 3600.0
    if unit == "h_per_epoch":
        return value * 3600.0 * n / float(comp["epoch_samples"])
    if unit == "output_tokens_per_s":
        return n * L.response_mean / value
    if unit == "tokens_per_s":
        return n * L.seq_mean / value
    if unit == "tokens_per_s_per_gpu":
        return n * L.seq_mean / (value * float(gpus))
    if unit == "tflops_per_gpu":
        return megatron_flops(**comp["megatron"]) / (value * 1e12 * float(gpus))
    raise RowError(f"unknown unit {unit!r}")


def _term(term: str, row: Row, est: Estimate, plan: Plan, workload: WorkloadSpec,
          params: CostParams) -> float:
    term = term.strip()
    excluded = set(row.exclude_tasks)
    if term == "iteration":
        return est.iteration_s - sum(est.tasks.get(t, 0.0) for t in excluded)
    if term == "sync":
        return est.tasks["weight_sync"]
    kind, _, name = term.partition(":")
    if kind == "task":
        if name not in workload.task_names:
            raise RowError(f"quantity {term!r}: {name} is not a task of this workload")
        seconds = est.tasks[name]
        if row.padding:  # the rollout transfer from the padding node is not measured
            seconds -= est.parts.get(name, {}).get("data", 0.0)
        return seconds
    if kind == "stage" and name in STAGES:
        names = [t.name for t in workload.tasks
                 if t.stage == STAGES[name] and t.name not in excluded]
        devices = {p.task: frozenset(p.device_ids) for p in plan.placements}
        return stage_makespan(names, est.tasks, devices, params.eta)
    raise RowError(f"unknown quantity {term!r} (iteration, sync, task:NAME, stage:NAME, a+b)")


def estimate_quantity(quantity: str, row: Row, est: Estimate, plan: Plan,
                      workload: WorkloadSpec, params: CostParams) -> float:
    """The estimate of ``quantity``: terms joined by ``+``."""
    return sum(_term(t, row, est, plan, workload, params) for t in quantity.split("+"))


def _check_exclusions(row: Row, plan: Plan, workload: WorkloadSpec) -> None:
    """Subtracting a task from the iteration is exact only when every task runs one after
    another: sync mode, one task group."""
    if row.exclude_tasks and (workload.mode != "sync" or len(plan.groups) != 1):
        raise RowError("exclude_tasks needs a sync, fully co-located plan")


# --- the validation --------------------------------------------------------------------------

COLUMNS = ["id", "kind", "split", "colocated", "primary", "quantity", "estimate_s", "measured_s",
           "ratio", "abs_log_ratio", "within_band", "status", "feasible", "gpu", "source_key",
           "reason", "lengths", "ratio_low", "ratio_high", "measure", "in_band", "framework",
           "pair_of", "moe"]


def _record(row: Row, **values: Any) -> dict[str, Any]:
    out = {c: None for c in COLUMNS}
    out.update(id=row.id, kind=row.kind, split=row.split, source_key=row.source_key,
               lengths=row.lengths, framework=row_framework(row), pair_of=row.pair_of)
    out.update(values)
    return out


def row_framework(row: Row) -> str:
    """The framework profile a row is priced with: its workload's ``framework`` for a step row
    (verl when it names none); ``none`` for a component row (an engine, a trainer or a sync
    measured in a harness without an RL controller)."""
    if row.kind != "step":
        return "none"
    return str(row.workload.get("framework", "verl"))


def _priced(row: Row, params: CostParams) -> tuple[Estimate, list[tuple[float, float]], bool,
                                                   list[str], bool]:
    """The row's estimate; per comparison (estimate, measured) in seconds; whether its plan is
    co-located; the measured GPU types; whether its models include a mixture of experts."""
    workload = build_workload(row)
    cluster, measured = build_cluster(row)
    plan = build_plan(row, workload, cluster, measured)
    _check_exclusions(row, plan, workload)
    # priced with its framework's per-step costs (a component row's harness has none)
    workload = workload.with_(framework=row_framework(row))
    model = CostModel(workload, cluster, params)
    params = model.params  # as the row's framework pays them (hetrl.cost.profiles)
    est = model.estimate(plan)
    pairs = []
    for comp in row.compare:
        if is_memory(comp):  # (GB, not seconds: experiments/peak_memory.py)
            pairs.append((estimated_gb(est, row.padding), measured_gb(comp)))
            continue
        estimate = estimate_quantity(comp["quantity"], row, est, plan, workload, params)
        if not (estimate > 0 and math.isfinite(estimate)):
            raise RowError(f"{comp.get('label', comp['quantity'])}: the estimate is "
                           f"{estimate!r} s (not positive)")
        pairs.append((estimate, measured_seconds(comp, workload)))
    gpus = sorted({cluster.device(d).gpu.name for d in plan.device_ids if d < measured})
    moe = any(workload.model(t.role).moe is not None for t in workload.tasks)
    return est, pairs, is_colocated(plan, workload), gpus, moe


def _ratio_ranges(row: Row, params: CostParams, ratios: list[float]
                  ) -> list[tuple[float | None, float | None]]:
    """Per comparison the lowest and highest ratio over the row's pricing (``ratios``) and its
    plausible mean lengths (:mod:`experiments.unknown_lengths`); (None, None) for a row whose
    lengths are published."""
    if row.lengths != "unknown":
        return [(None, None)] * len(ratios)
    spans = [[r] for r in ratios]
    for workload in plausible_workloads(row.workload):
        _, pairs, _, _, _ = _priced(dataclasses.replace(row, workload=workload), params)
        for span, (estimate, meas) in zip(spans, pairs, strict=True):
            span.append(estimate / meas)
    return [(min(span), max(span)) for span in spans]


def estimate_row(row: Row, params: CostParams = DEFAULT_PARAMS) -> list[dict[str, Any]]:
    """The comparisons of one row (the first is the row's primary one); a skipped or failing
    row gives one record with status ``skipped`` and the reason. A row whose lengths are
    unknown carries each ratio's range over plausible mean lengths (``ratio_low``,
    ``ratio_high``)."""
    if row.skip:
        return [_record(row, primary=True, quantity="-", status="skipped", reason=row.skip)]
    try:
        est, pairs, colocated, gpus, moe = _priced(row, params)
        ranges = _ratio_ranges(row, params, [e / m for e, m in pairs])
        records = []
        for i, (comp, (estimate, meas), (low, high)) in enumerate(
                zip(row.compare, pairs, ranges, strict=True)):
            ratio = estimate / meas
            memory = is_memory(comp)
            records.append(_record(
                row, primary=i == 0, colocated=colocated,
                quantity=str(comp.get("label", comp["quantity"])),
                estimate_s=estimate, measured_s=meas, ratio=ratio,
                abs_log_ratio=abs(math.log(ratio)), within_band=abs(ratio - 1) <= (MEMORY_BAND if memory else BAND),
                measure="memory" if memory else "time",
                status="estimated", feasible=bool(est.feasible), gpu="+".join(gpus),
                reason=_reason(row, est), ratio_low=low, ratio_high=high, moe=moe))
        return records
    except Exception as exc:  # noqa: BLE001 -- one row's failure is reported, not fatal
        message = str(exc) if isinstance(exc, RowError) else f"{type(exc).__name__}: {exc}"
        return [_record(row, primary=True, quantity="-", status="skipped",
                        reason=f"not estimated: {message}")]


def _reason(row: Row, est: Estimate) -> str:
    parts = []
    if not est.feasible:
        first = est.violations[0] if est.violations else "does not fit"
        parts.append(f"INFEASIBLE in the cost model (time shown ignoring memory): {first}")
    if row.gaps:
        parts.append(row.gaps)
    return "; ".join(parts)


def validate(params: CostParams = DEFAULT_PARAMS, rows: Sequence[Row] | None = None
             ) -> pd.DataFrame:
    """Every comparison of every row (``rows``: default all of ``experiments/public``), one
    line each, with the estimate under ``params``."""
    rows = load_rows() if rows is None else rows
    records = [r for row in rows for r in estimate_row(row, params)]
    df = pd.DataFrame.from_records(records, columns=COLUMNS)
    # each step row's measured value against its leave-one-source-out band
    res = residuals(df)
    df["in_band"] = pd.Series([in_band(r, res) for _, r in df.iterrows()], dtype=object)
    return df


def summary(df: pd.DataFrame) -> dict[str, Any]:
    """Median |ln(estimate / measured)| per split, the share within the band, counts -- over
    each row's primary comparison (stage breakdowns are reported, not pooled) of the rows whose
    mean lengths are published (the others are listed apart: ``lengths_unknown``, with their
    ratio ranges over plausible means); and the median
    ratio of the holdout step rows per class (``colocated``, ``disaggregated``: the issue's "no
    side" target is both near 1) with their counts. Peak-memory comparisons (primary or not)
    are summarised apart: ``peak_memory``; ``infeasible`` lists the estimated rows (primary
    comparisons, every split) whose plan does not fit the memory model although it ran."""
    memory = df[(df["status"] == "estimated") & (df["measure"] == "memory")]
    primary = df[df["primary"].astype(bool) & (df["measure"] != "memory")]
    estimated = primary[primary["status"] == "estimated"]
    unknown = estimated["lengths"] == "unknown"
    ok = estimated[~unknown]  # pooled: the rows whose mean lengths are published
    out: dict[str, Any] = {"median_abs_log_ratio": {}, "within_band_share": {},
                           "estimated": {}, "skipped": {}, "row_counts": {},
                           "lengths_unknown": [
                               {"id": r["id"], "split": r["split"], "ratio_at_cap": r["ratio"],
                                "ratio_low": r["ratio_low"], "ratio_high": r["ratio_high"],
                                "measured_in_range": bool(r["ratio_low"] <= 1 <= r["ratio_high"])}
                               for _, r in estimated[unknown].iterrows()],
                           "band_coverage": coverage(df),
                           "peak_memory": {
                               "band": MEMORY_BAND, "comparisons": int(len(memory)),
                               "within_band": int(memory["within_band"].astype(bool).sum()),
                               "median_abs_log_ratio": (float(memory["abs_log_ratio"].median())
                                                        if len(memory) else None),
                               "ratios": {r["id"]: float(r["ratio"])
                                          for _, r in memory.iterrows()}}}
    for split in SPLITS:
        part = ok[ok["split"] == split]
        out["median_abs_log_ratio"][split] = (float(part["abs_log_ratio"].median())
                                             if len(part) else None)
        out["within_band_share"][split] = (float(part["within_band"].mean())
                                          if len(part) else None)
        out["estimated"][split] = int(len(part))
        out["row_counts"][split] = int(((primary["split"] == split)
                                        & (primary["lengths"] != "unknown")).sum())
        out["skipped"][split] = int(((primary["split"] == split)
                                     & (primary["status"] == "skipped")).sum())
    out["within_band_share"]["all"] = float(ok["within_band"].mean()) if len(ok) else None
    # issue 58's first target: rows that ran whose plan the memory model calls infeasible
    out["infeasible"] = sorted(estimated[~estimated["feasible"].astype(bool)]["id"].tolist())
    out["gpu_pairs"] = gpu_pairs(df)
    # issue 57's target: the mixture-of-experts holdout rows (published lengths)
    moe = ok[(ok["split"] == "holdout") & ok["moe"].astype(bool)]
    out["moe_holdout"] = {"rows": sorted(moe["id"].tolist()), "target": MOE_TARGET,
                          "median_abs_log_ratio": (float(moe["abs_log_ratio"].median())
                                                   if len(moe) else None)}
    # the step rows per framework profile (hetrl.cost.profiles) and split
    out["framework"] = {
        name: {split: {"rows": int(len(p := sub[sub["split"] == split])),
                       "median_abs_log_ratio": float(p["abs_log_ratio"].median())
                       if len(p) else None} for split in SPLITS}
        for name, sub in ok[ok["kind"] == "step"].groupby("framework", sort=True)}
    steps = ok[(ok["split"] == "holdout") & (ok["kind"] == "step")]
    out["median_ratio_step_holdout"], out["step_holdout_rows"] = {}, {}
    for cls, flag in (("colocated", True), ("disaggregated", False)):
        part = steps[steps["colocated"].astype(bool) == flag]
        out["median_ratio_step_holdout"][cls] = float(part["ratio"].median()) if len(part) else None
        out["step_holdout_rows"][cls] = int(len(part))
    return out


#: Issue 57's target for the mixture-of-experts holdout rows' median |ln(estimate / measured)|.
MOE_TARGET = 0.25

#: The band within which a pair's estimated ratio must hold the measured one (issue 58).
PAIR_BAND = 0.20


def gpu_pairs(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Each pair of rows measuring one job on two GPU types (a row's ``pair_of``): the measured
    and the estimated ratio of the pair's step seconds to the row's -- the row's speed per GPU
    over its pair's where both give each GPU the same work per step, as the pairs written so
    far do (T10/T7: 262,144 tokens per GPU; T11/T8: 131,072) -- and estimated / measured
    (whatever the work: each row's estimate over its measurement), within
    +-:data:`PAIR_BAND`."""
    primary = df[df["primary"].astype(bool) & (df["status"] == "estimated")].set_index("id")
    out = []
    for row_id, pair in (df[["id", "pair_of"]].dropna().drop_duplicates().itertuples(index=False)
                         if "pair_of" in df else ()):
        if row_id not in primary.index or pair not in primary.index:
            continue
        a, b = primary.loc[row_id], primary.loc[pair]
        measured = b["measured_s"] / a["measured_s"]  # speed of a over b
        estimated = b["estimate_s"] / a["estimate_s"]
        error = estimated / measured
        out.append({"id": row_id, "pair_of": pair, "gpus": [a["gpu"], b["gpu"]],
                    "measured_ratio": float(measured), "estimated_ratio": float(estimated),
                    "error": float(error),
                    "within": bool(1 / (1 + PAIR_BAND) <= error <= 1 + PAIR_BAND)})
    return out


def residuals(df: pd.DataFrame) -> list[Residual]:
    """The residuals of :mod:`hetrl.cost.band`: the primary comparison of every estimated
    holdout step row (infeasible ones too, marked ``feasible`` false; skipped rows and fit rows
    never)."""
    ok = df[df["primary"].astype(bool) & (df["status"] == "estimated")
            & (df["split"] == "holdout") & (df["kind"] == "step") & (df["lengths"] != "unknown")]
    return [Residual(id=r["id"], split=r["split"], kind=r["kind"], colocated=bool(r["colocated"]),
                     feasible=bool(r["feasible"]), gpus=tuple(str(r["gpu"]).split("+")),
                     ratio=float(r["ratio"]), source_key=r["source_key"])
            for _, r in ok.iterrows()]


def write_residuals(df: pd.DataFrame, path: Path) -> None:
    write_text_atomic(path, residuals_csv(residuals(df)))


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):
        return value.item()
    return value


def to_json(df: pd.DataFrame) -> dict[str, Any]:
    """The --json answer: ``rows`` (one per row id: its primary comparison, with its stage
    comparisons under ``stages``) and the summary."""
    rows = []
    for _, part in df.groupby("id", sort=False):
        first = part.iloc[0]
        entry = {k: _clean(first[k]) for k in COLUMNS if k != "primary"}
        entry["stages"] = [{k: _clean(r[k]) for k in ("quantity", "estimate_s", "measured_s",
                                                      "ratio", "within_band", "measure")}
                           for _, r in part.iloc[1:].iterrows()]
        rows.append(entry)
    return {"rows": rows, **summary(df), "band": BAND}


# --- output ----------------------------------------------------------------------------------

def _fmt(x: Any, spec: str) -> str:
    """``x`` formatted by ``spec``; a missing number as a dash of the same width."""
    width = int("".join(ch for ch in spec.split(".")[0] if ch.isdigit()) or 0)
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-".rjust(width)
    return format(x, spec)


def table(df: pd.DataFrame) -> str:
    """One line per comparison (stage comparisons indented under their row), the medians and
    shares per split, and the skipped rows with their reasons."""
    lines = [f"{'id':<5}{'split':<8}{'quantity':<30}{'estimate_s':>12}{'measured_s':>12}"
             f"{'ratio':>8}  verdict"]
    for _, r in df.iterrows():
        primary = bool(r["primary"])
        if r["status"] == "estimated":
            verdict = "hit" if r["within_band"] else "miss"
            if r["measure"] == "memory":
                verdict += f" (peak memory, GB; +-{MEMORY_BAND:.0%})"
            if r["lengths"] == "unknown":
                verdict = (f"lengths unknown: {r['ratio_low']:.3f}-{r['ratio_high']:.3f} over "
                           "plausible means (not pooled)")
            if primary and not r["feasible"]:
                verdict += " (plan infeasible in the cost model)"
        else:
            verdict = "skipped (below)"
        quantity = r["quantity"] if primary else f"  {r['quantity']}"
        lines.append(f"{r['id'] if primary else '':<5}{r['split'] if primary else '':<8}"
                     f"{quantity:<30}{_fmt(r['estimate_s'], '12.4g')}"
                     f"{_fmt(r['measured_s'], '12.4g')}{_fmt(r['ratio'], '8.3f')}  {verdict}")
    s = summary(df)
    lines.append("")
    for split in SPLITS:
        med = s["median_abs_log_ratio"][split]
        factor = math.exp(med) if med is not None else None
        lines.append(
            f"{split:<8} rows {s['row_counts'][split]:>2}, estimated {s['estimated'][split]:>2}, "
            f"skipped {s['skipped'][split]:>2}: median |ln(est/meas)| {_fmt(med, '.3f')} "
            f"(a factor {_fmt(factor, '.2f')}), within +-{BAND:.0%}: "
            f"{_fmt(s['within_band_share'][split], '.0%')}")
    lines.append(f"all estimated rows within +-{BAND:.0%}: "
                 f"{_fmt(s['within_band_share']['all'], '.0%')} (primary comparisons only)")
    per_class = []
    for cls in ("colocated", "disaggregated"):
        n = s["step_holdout_rows"][cls]
        per_class.append(f"{cls} {_fmt(s['median_ratio_step_holdout'][cls], '.3f')} "
                         f"({n} row{'' if n == 1 else 's'})")
    lines.append("holdout step rows, median est/meas: " + ", ".join(per_class))
    per_framework = []
    for name, splits in s["framework"].items():
        per_framework.append(name + " " + ", ".join(
            f"{split} {_fmt(v['median_abs_log_ratio'], '.3f')} ({v['rows']})"
            for split, v in splits.items() if v["rows"]))
    lines.append("step rows per framework profile, median |ln(est/meas)| (rows): "
                 + "; ".join(per_framework))
    cov = s["band_coverage"]
    if cov["rows"]:
        lines.append(f"the 80% band (leave-one-source-out) holds {cov['inside']} of {cov['rows']} "
                     f"holdout steps ({cov['share']:.0%}; colocated {cov['colocated']['inside']} "
                     f"of {cov['colocated']['rows']}, disaggregated "
                     f"{cov['disaggregated']['inside']} of {cov['disaggregated']['rows']}; "
                     + ", ".join(f"{k} {v['inside']} of {v['rows']}"
                                 for k, v in cov["framework"].items()) + ")")
    if s["gpu_pairs"]:
        lines.append(f"one job on two GPU types, estimated ratio / measured (+-{PAIR_BAND:.0%}): "
                     + ", ".join(f"{p['id']}/{p['pair_of']} ({p['gpus'][0]} / {p['gpus'][1]}: "
                                 f"measured {p['measured_ratio']:.2f}, estimated "
                                 f"{p['estimated_ratio']:.2f}) {p['error']:.3f} "
                                 f"{'hit' if p['within'] else 'miss'}"
                                 for p in s["gpu_pairs"]))
    moe = s["moe_holdout"]
    if moe["rows"]:
        lines.append(f"mixture-of-experts holdout rows: median |ln(est/meas)| "
                     f"{moe['median_abs_log_ratio']:.3f} over {len(moe['rows'])} (target <= "
                     f"{moe['target']}): {', '.join(moe['rows'])}")
    lines.append(f"rows that ran but do not fit the memory model: {len(s['infeasible'])}"
                 + (f" ({', '.join(s['infeasible'])})" if s["infeasible"] else ""))
    mem = s["peak_memory"]
    if mem["comparisons"]:
        lines.append(f"peak memory (not pooled): {mem['within_band']} of {mem['comparisons']} "
                     f"within +-{MEMORY_BAND:.0%} ("
                     + ", ".join(f"{k} {v:.3f}" for k, v in mem["ratios"].items()) + ")")
    unknown = s["lengths_unknown"]
    if unknown:
        inside = sum(u["measured_in_range"] for u in unknown)
        lines.append(f"rows whose sources publish only length caps (not pooled): "
                     f"{', '.join(u['id'] for u in unknown)}; the measured step lies within the "
                     f"range of estimates over plausible mean lengths for {inside} of "
                     f"{len(unknown)}")
    lines.append("skipped rows:")
    for _, r in df[df["status"] == "skipped"].iterrows():
        lines.append(f"  {r['id']}: {r['reason']}")
    return "\n".join(lines)


def markdown(df: pd.DataFrame) -> str:
    """The comparisons as a Markdown table (for docs/validation.md): id, quantity, estimate,
    measured, ratio, split; stage comparisons under their row; skipped rows with their reason."""
    lines = ["| id | quantity | estimate (s) | measured (s) | ratio | split |",
             "|---|---|---:|---:|---:|---|"]
    for _, r in df.iterrows():
        ident = r["id"] if r["primary"] else ""
        if r["status"] != "estimated":
            lines.append(f"| {ident} | skipped: {r['reason']} | | | | {r['split']} |")
            continue
        quantity = r["quantity"] if r["primary"] else f"&nbsp;&nbsp;{r['quantity']}"
        infeasible = "" if r["feasible"] or not r["primary"] else " (infeasible)"
        if r["primary"] and r["lengths"] == "unknown":
            infeasible += (f" (lengths unknown: {r['ratio_low']:.3f}-{r['ratio_high']:.3f} over "
                           "plausible means)")
        lines.append(f"| {ident} | {quantity}{infeasible} | {r['estimate_s']:.4g} | "
                     f"{r['measured_s']:.4g} | {r['ratio']:.3f} | "
                     f"{r['split'] if r['primary'] else ''} |")
    return "\n".join(lines)


def write_csv(df: pd.DataFrame, path: Path) -> None:
    write_text_atomic(path, df.to_csv(index=False, float_format="%.6g"))


def plot(df: pd.DataFrame, path: Path) -> None:
    """Estimate vs measured seconds, log-log, the y = x line and the +-30% band; fit and
    holdout rows marked differently (hollow: the plan does not fit in memory in the cost model,
    its time computed ignoring memory), each point labelled by its id (primary comparisons)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = df[(df["status"] == "estimated") & df["primary"].astype(bool)
            & (df["measure"] != "memory")]
    fig, ax = plt.subplots(figsize=(7.5, 7))
    lo = min(ok["estimate_s"].min(), ok["measured_s"].min()) / 2 if len(ok) else 0.01
    hi = max(ok["estimate_s"].max(), ok["measured_s"].max()) * 2 if len(ok) else 1000
    xs = [lo, hi]
    ax.fill_between(xs, [x * (1 - BAND) for x in xs], [x * (1 + BAND) for x in xs],
                    color="0.88", label=f"±{BAND:.0%}")
    ax.plot(xs, xs, color="0.3", lw=1, label="estimate = measured")
    styles = {"fit": dict(marker="o", color="tab:blue"),
              "holdout": dict(marker="s", color="tab:orange")}
    for split, style in styles.items():
        part = ok[ok["split"] == split]
        fits = part["feasible"].astype(bool)
        ax.scatter(part["measured_s"][fits], part["estimate_s"][fits], s=36, zorder=3,
                   label=f"{split} ({len(part)})", **style)
        ax.scatter(part["measured_s"][~fits], part["estimate_s"][~fits], s=36, zorder=3,
                   facecolors="none", edgecolors=style["color"], marker=style["marker"],
                   label=f"{split}, plan infeasible in the model" if (~fits).any() else None)
        for _, r in part.iterrows():
            ax.annotate(r["id"], (r["measured_s"], r["estimate_s"]), textcoords="offset points",
                        xytext=(4, 3), fontsize=8)
    ax.set(xscale="log", yscale="log", xlim=xs, ylim=xs, xlabel="measured (s)",
           ylabel="estimated by hetrl's cost model (s)",
           title="Cost model vs published measurements (default CostParams)")
    ax.legend(loc="upper left")
    ax.grid(True, which="both", lw=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".png", dir=path.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=130)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.unlink(tmp)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print a JSON object instead of a table")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table instead")
    ap.add_argument("--only", help="comma-separated row ids (default: every row)")
    ap.add_argument("--csv", type=Path, default=CSV_PATH, help=f"default {CSV_PATH}")
    ap.add_argument("--figure", type=Path, default=FIGURE_PATH, help=f"default {FIGURE_PATH}")
    ap.add_argument("--residuals", type=Path, default=None,
                    help=f"the band's residuals (default {RESIDUALS_PATH}, written only when "
                         "every row is run: a partial table would replace the shipped one)")
    ap.add_argument("--no-write", action="store_true",
                    help="write neither the CSV, the figure nor the residuals")
    args = ap.parse_args(argv)
    rows = load_rows()
    if args.only:
        wanted = {x.strip() for x in args.only.split(",") if x.strip()}
        unknown = wanted - {r.id for r in rows}
        if unknown:
            print(f"validate_public: error: unknown rows {sorted(unknown)}", file=sys.stderr)
            return 2
        rows = [r for r in rows if r.id in wanted]
    df = validate(DEFAULT_PARAMS, rows)
    if not args.no_write:
        write_csv(df, args.csv)
        plot(df, args.figure)
        if args.residuals is not None or not args.only:
            write_residuals(df, args.residuals or RESIDUALS_PATH)
    if args.json:
        print(json.dumps(to_json(df), indent=2))
    elif args.markdown:
        print(markdown(df))
    else:
        print(table(df))
    return 0


if __name__ == "__main__":
    sys.exit(main())
