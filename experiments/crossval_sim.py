"""Cross-validation: the discrete-event simulator against the analytical cost model.

Draws many feasible plans for a few workloads on each of the paper's four 64-GPU scenarios (the
``paper64-*`` presets), simulates each for a few iterations and compares the simulated
steady-state iteration time with the cost model's estimate (sync: 3 iterations, the mean after
the first; async: 6, the mean of the 4 between the first and the last). Plans come from the schedulers with
small budgets and different seeds (``hetrl``, ``random``, ``deap``, ``verl``, ``streamrl``), so
they range from good to poor and from colocated to deep cross-region pipelines; a plan is kept
if the cost model says it fits in memory, and duplicates are dropped.

Per scenario it prints the Spearman rank correlation between estimate and simulation and the
distribution of the relative difference (sim - est) / sim: signed median, and the median, p90
and max of its absolute value. Targets: Spearman >= 0.9 per scenario, median |diff| <= 15%.
Rows go to ``experiments/results/crossval.csv`` (one per plan, with per-task seconds from both)
and the plans to ``crossval_plans.jsonl`` beside it, both rewritten atomically after every plan,
so an interrupted run resumes where it stopped (a scheduler's plan for a given seed and budget
changes when the search code does; the saved plan is what the row measured).

Run: ``python experiments/crossval_sim.py [--quick] [--plans N] [--workers W] [--fresh]
[--resimulate [WORKLOADS]] [--reestimate]``.
``--quick`` (5 plans per scenario) takes a few minutes on 2 cores; the default 30 plans per
scenario about 45 minutes (plans from random searches can take a minute each to simulate).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import hashlib  # noqa: E402
import io  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ProcessPoolExecutor, as_completed  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pandas as pd  # noqa: E402
from scipy.stats import spearmanr  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hetrl.cost.model import CostModel  # noqa: E402
from hetrl.errors import HetrlError  # noqa: E402
from hetrl.io import write_text_atomic  # noqa: E402
from hetrl.plan import Plan  # noqa: E402
from hetrl.search import Budget, get_scheduler  # noqa: E402
from hetrl.spec.presets import SCENARIOS, cluster_preset, workload_preset  # noqa: E402
from hetrl.spec.tasks import REPORTED_TASKS  # noqa: E402
from sim import simulate  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "crossval.csv"
PLANS = OUT.with_name("crossval_plans.jsonl")  # every simulated plan, one JSON object a line
WORKLOADS = ("qwen3-4b-ppo-sync", "qwen3-8b-ppo-sync", "qwen3-4b-grpo-sync",
             "qwen3-8b-grpo-sync", "qwen3-4b-grpo-async")
SCHEDULERS = ("hetrl", "random", "deap", "verl", "streamrl")
BUDGETS = (40, 150, 400)  # cost-model evaluations: small, so plan quality varies
SPEARMAN_TARGET = 0.9
MEDIAN_TARGET = 0.15


def plan_id(plan: Plan) -> str:
    """A short hash of the plan's placements (provenance left out)."""
    data = [p.to_dict() for p in plan.placements] + [g.to_dict() for g in plan.groups]
    return hashlib.sha1(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]


def candidates() -> list[tuple[str, str, int, int]]:
    """(workload, scheduler, seed, budget) in a fixed shuffled order that takes the workloads in
    turn, so that the first N plans of a scenario already mix workloads, schedulers and budgets."""
    per_workload = []
    for k, w in enumerate(WORKLOADS):
        combos = list(itertools.product([w], SCHEDULERS, range(20), BUDGETS))
        random.Random(k).shuffle(combos)
        per_workload.append(combos)
    return [c for group in zip(*per_workload, strict=True) for c in group]


def draw_plans(scenario: str, n: int, seen: set[str]) -> list[dict[str, Any]]:
    """Up to ``n`` new feasible plans for ``scenario`` (skipping ids in ``seen``)."""
    cluster = cluster_preset(f"paper64-{scenario}")
    out: list[dict[str, Any]] = []
    tries = 0
    for workload, scheduler, seed, budget in candidates():
        if len(out) >= n or tries > 40 * n:
            break
        tries += 1
        wl = workload_preset(workload)
        if scheduler == "streamrl" and wl.mode == "sync":
            continue  # StreamRL is an async design (two disjoint pools)
        if scheduler == "verl" and wl.mode == "async":
            scheduler = "verl-async"
        try:
            result = get_scheduler(scheduler).search(wl, cluster, Budget(evaluations=budget,
                                                                         seed=seed))
        except HetrlError:
            continue
        if not result.estimate.feasible:
            continue
        pid = plan_id(result.plan)
        if pid in seen:
            continue
        seen.add(pid)
        out.append({"scenario": scenario, "workload": workload, "scheduler": scheduler,
                    "seed": seed, "budget_evals": budget, "plan_id": pid,
                    "plan": result.plan.to_dict()})
    return out


def steady_s(iterations: list[float], mode: str) -> float:
    """Steady-state seconds per iteration from a run's iteration windows: sync, the mean after
    the first; async, also without the last (the first fills the pipeline, and the last runs
    with no later generation competing for shared GPUs, so both are off the steady state)."""
    window = iterations[1:] if mode == "sync" else iterations[1:-1]
    return sum(window) / len(window)


def evaluate(job: dict[str, Any], iterations_sync: int, iterations_async: int) -> dict[str, Any]:
    """Estimate and simulate one plan; a flat row for the CSV."""
    wl = workload_preset(job["workload"])
    cluster = cluster_preset(f"paper64-{job['scenario']}")
    plan = Plan.from_dict(job["plan"])
    est = CostModel(wl, cluster).estimate(plan)
    t0 = time.perf_counter()
    iterations = iterations_sync if wl.mode == "sync" else iterations_async
    r = simulate(plan, wl, cluster, iterations, seed=0)
    wall = time.perf_counter() - t0
    sim_s = steady_s(r.metrics["iterations"], wl.mode)
    row = {k: v for k, v in job.items() if k != "plan"}
    row.update({
        "gpus": len(plan.device_ids), "groups": len(plan.groups),
        "max_pp": max(p.pp for p in plan.placements),
        "est_s": est.iteration_s, "sim_s": sim_s, "rel_diff": (sim_s - est.iteration_s) / sim_s,
        "sim_mean_after_first_s": r.iteration_s, "iterations": iterations, "sim_wall_s": wall,
        "events": r.metrics["events"],
    })
    for t in REPORTED_TASKS:
        row[f"est_{t}"] = est.tasks[t]
        row[f"sim_{t}"] = r.metrics["tasks"][t]
    return row


def spearman(a: pd.Series, b: pd.Series) -> float:
    """Spearman's rank correlation (``scipy.stats.spearmanr``; NaN below 3 pairs)."""
    if len(a) < 3:
        return float("nan")
    return float(spearmanr(a.to_numpy(), b.to_numpy()).statistic)


def summary(df: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    rows = []
    for key, g in df.groupby(by, sort=False):
        ad = g["rel_diff"].abs()
        rho = spearman(g["est_s"], g["sim_s"])
        rows.append({**dict(zip(by, key if isinstance(key, tuple) else (key,), strict=True)),
                     "plans": len(g), "spearman": rho,
                     "median_diff": g["rel_diff"].median(), "median_abs": ad.median(),
                     "p90_abs": ad.quantile(0.9), "max_abs": ad.max(),
                     "ok": bool(rho >= SPEARMAN_TARGET and ad.median() <= MEDIAN_TARGET)})
    return pd.DataFrame(rows)


def write(rows: list[dict[str, Any]], plans: dict[tuple[str, str], dict[str, Any]]) -> pd.DataFrame:
    """The CSV and the plans of its rows (so that any row can be simulated again)."""
    df = pd.DataFrame(rows)
    buf = io.StringIO()
    df.to_csv(buf, index=False, float_format="%.6g")
    write_text_atomic(OUT, buf.getvalue())
    keys = [(r["scenario"], r["plan_id"]) for r in rows]
    write_text_atomic(PLANS, "".join(json.dumps(plans[k]) + "\n" for k in keys if k in plans))
    return df


def fmt(table: pd.DataFrame) -> str:
    out = table.copy()
    out["median_diff"] = out["median_diff"].map(lambda x: f"{100 * x:+.1f}%")
    for c in ("median_abs", "p90_abs", "max_abs"):
        out[c] = out[c].map(lambda x: f"{100 * x:.1f}%")
    out["spearman"] = out["spearman"].map(lambda x: f"{x:.3f}")
    return out.to_string(index=False)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="experiments/crossval_sim.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="5 plans per scenario, fewer iterations")
    p.add_argument("--plans", type=int, help="plans per scenario (default 30; 4 with --quick)")
    p.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1),
                   help="simulations in parallel (processes)")
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated subset")
    p.add_argument("--fresh", action="store_true", help="ignore rows already in the CSV")
    p.add_argument("--resimulate", metavar="WORKLOADS", nargs="?", const="all",
                   help="simulate the saved plans again (after a simulator change), all or those "
                        "of the comma-separated workloads; no new plans are drawn")
    p.add_argument("--reestimate", action="store_true",
                   help="recompute only the cost model's columns of the saved rows (after a cost "
                        "model change that leaves the simulator as it is); nothing is simulated")
    return p.parse_args(argv)


def reestimate(row: dict[str, Any], job: dict[str, Any]) -> dict[str, Any]:
    """``row`` with its estimate columns recomputed by the current cost model."""
    wl = workload_preset(job["workload"])
    est = CostModel(wl, cluster_preset(f"paper64-{job['scenario']}")).estimate(
        Plan.from_dict(job["plan"]))
    out = {**row, "est_s": est.iteration_s, "rel_diff": (row["sim_s"] - est.iteration_s) / row["sim_s"]}
    for t in REPORTED_TASKS:
        out[f"est_{t}"] = est.tasks[t]
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    n = args.plans or (5 if args.quick else 30)
    # Async runs need their pipeline filled, and GPUs shared by generation and other tasks can
    # settle into a period of two iterations (see docs/simulator.md): 6 iterations give 4
    # steady windows (the first and the last left out).
    its_sync, its_async = (2, 6) if args.quick else (3, 6)
    scenarios = [s.strip() for s in args.scenarios.split(",")]
    bad = [s for s in scenarios if s not in SCENARIOS]
    if bad:
        print(f"crossval_sim.py: error: unknown scenario(s) {bad}; known: {list(SCENARIOS)}",
              file=sys.stderr)
        return 2
    rows: list[dict[str, Any]] = []
    plans: dict[tuple[str, str], dict[str, Any]] = {}
    if OUT.exists() and not args.fresh:
        rows = pd.read_csv(OUT).to_dict("records")
        if PLANS.exists():
            for line in PLANS.read_text().splitlines():
                job = json.loads(line)
                plans[(job["scenario"], job["plan_id"])] = job
        rows = [r for r in rows if (r["scenario"], r["plan_id"]) in plans]
        for r in rows:  # rows from before the column: in sync mode it is sim_s
            if pd.isna(r.get("sim_mean_after_first_s")) and r["workload"].endswith("-sync"):
                r["sim_mean_after_first_s"] = r["sim_s"]
    done = {(r["scenario"], r["plan_id"]) for r in rows}
    print(f"cross-validation: {n} plans per scenario over {len(scenarios)} scenarios "
          f"({len(rows)} already in {OUT.name})", flush=True)
    jobs = []
    if args.reestimate:
        rows = [reestimate(r, plans[(r["scenario"], r["plan_id"])]) for r in rows]
        scenarios = []  # nothing new to draw or simulate
    if args.resimulate:
        which = None if args.resimulate == "all" else set(args.resimulate.split(","))
        redo = {(r["scenario"], r["plan_id"]) for r in rows if r["scenario"] in scenarios
                and (which is None or r["workload"] in which)}
        rows = [r for r in rows if (r["scenario"], r["plan_id"]) not in redo]
        jobs = [plans[k] for k in sorted(redo)]
        scenarios = []  # nothing new to draw
    for scenario in scenarios:
        have = sum(1 for r in rows if r["scenario"] == scenario)
        if have >= n:
            continue
        t0 = time.perf_counter()
        seen = {pid for s, pid in done if s == scenario}
        new = draw_plans(scenario, n - have, seen)
        print(f"  {scenario}: {len(new)} new plans in {time.perf_counter() - t0:.0f} s of search",
              flush=True)
        jobs += new
    from tqdm import tqdm

    bar = tqdm(total=len(jobs), unit="plan", desc="simulate", mininterval=1.0)
    try:
        with ProcessPoolExecutor(max_workers=max(args.workers, 1)) as pool:
            futures = {pool.submit(evaluate, j, its_sync, its_async): j for j in jobs}
            for fut in as_completed(futures):
                job = futures[fut]
                plans[(job["scenario"], job["plan_id"])] = job
                rows.append(fut.result())
                write(rows, plans)
                bar.update(1)
    except KeyboardInterrupt:
        print("interrupted: rows so far kept; run again to resume", file=sys.stderr)
        return 130
    finally:
        bar.close()
    df = write(rows, plans)
    if df.empty:
        print("no plans")
        return 1
    print(f"\nper scenario ({len(df)} plans; rel diff = (sim - est) / sim):")
    print(fmt(summary(df, ["scenario"])))
    print("\nper scenario and workload:")
    print(fmt(summary(df, ["scenario", "workload"])))
    worst = df.reindex(df["rel_diff"].abs().sort_values(ascending=False).index).head(8)
    print("\nlargest differences:")
    print(worst[["scenario", "workload", "scheduler", "seed", "budget_evals", "max_pp", "est_s",
                 "sim_s", "rel_diff"]].to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    print(f"\nwrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
