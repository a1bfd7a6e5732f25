"""Benchmark: SHA-EA against the plans it contains, at small evaluation budgets (issue 26's
targets; a benchmark that prints its figures, not a test).

(a) Floor: ``hetrl plan --budget-evals E`` (default 1,000) for seeds 0-7 on every paper64
    scenario, for qwen3-8b-{ppo,grpo}-async against ``streamrl`` and ``verl-async``, and for
    qwen3-8b-{ppo,grpo}-sync against ``verl``, each baseline at the same budget. Prints every
    job's worst seed and counts the (job, seed) pairs where HetRL's estimate is above a
    baseline's.
(b) Budget monotone in expectation: the mean over seeds of HetRL's best estimate at 250, 1,000
    and 4,000 evaluations (``--budgets``) on ``qwen3-8b-ppo-sync @ paper64-multi-country``
    (``--workload``, ``--cluster``; ``--batch-prompts`` for the figures' smaller batches): also
    how far a budget is from convergence.

Evaluation budgets only, so every number is deterministic (same seed, same plan). Searches run
in worker processes (``--workers``, default 2). Run:
``python experiments/bench_floor.py [--section floor|budget|all] [--seeds 8] [--evals 1000]``.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import ast  # noqa: E402
import multiprocessing  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ProcessPoolExecutor  # noqa: E402

from hetrl.errors import HetrlError  # noqa: E402
from hetrl.search import Budget, get_scheduler  # noqa: E402
from hetrl.spec.presets import cluster_preset, workload_preset  # noqa: E402

SCENARIOS = ("single-region", "multi-region-hybrid", "multi-country", "multi-continent")
BASELINES = {"async": ("streamrl", "verl-async"), "sync": ("verl",)}
TIE_S = 1e-6


def search(args: tuple[str, str, str, int, int, dict]) -> tuple[tuple, float, float]:
    """(the key, best estimate in seconds (inf when nothing fits), wall seconds)."""
    scheduler, workload, cluster, evals, seed, options = args
    options = dict(options)
    wl = workload_preset(workload)
    if "batch_prompts" in options:
        wl = wl.with_(batch_prompts=options.pop("batch_prompts"))
    t0 = time.perf_counter()
    try:
        r = get_scheduler(scheduler, **options).search(
            wl, cluster_preset(cluster), Budget(evaluations=evals, seed=seed))
        value = r.estimate.iteration_s
    except HetrlError:
        value = float("inf")
    return args[:5], value, time.perf_counter() - t0


def run_all(jobs: list[tuple], workers: int) -> dict[tuple, float]:
    out: dict[tuple, float] = {}
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for key, value, _ in pool.map(search, jobs):
            out[key] = value
    return out


def floor(seeds: int, evals: int, workers: int, options: dict) -> int:
    """Section (a); returns the number of (job, seed) pairs HetRL lost."""
    jobs, pairs = [], []
    for scenario in SCENARIOS:
        cluster = f"paper64-{scenario}"
        for mode, baselines in BASELINES.items():
            for alg in ("ppo", "grpo"):
                workload = f"qwen3-8b-{alg}-{mode}"
                pairs.append((workload, cluster, baselines))
                for seed in range(seeds):
                    jobs.append(("hetrl", workload, cluster, evals, seed, options))
                # the baselines draw nothing at random: one run each (seed 0) stands for all
                jobs += [(b, workload, cluster, evals, 0, {}) for b in baselines]
    t0 = time.perf_counter()
    got = run_all(jobs, workers)
    lost = 0
    print(f"(a) floor at {evals} evaluations, seeds 0-{seeds - 1} "
          f"({time.perf_counter() - t0:.0f} s)")
    print(f"{'job':44s} {'hetrl best':>10s} {'worst':>8s} " + "  baselines")
    for workload, cluster, baselines in pairs:
        ours = [got[("hetrl", workload, cluster, evals, s)] for s in range(seeds)]
        base = {b: got[(b, workload, cluster, evals, 0)] for b in baselines}
        worse = sum(1 for v in ours for b in base.values() if v > b + TIE_S)
        lost += worse
        text = "  ".join(f"{b} {v:7.2f}" for b, v in base.items())
        flag = f"  LOST {worse}" if worse else ""
        print(f"{workload + ' @ ' + cluster:44s} {min(ours):10.2f} {max(ours):8.2f}  {text}{flag}")
    print(f"(job, seed, baseline) triples where HetRL is above a baseline: {lost}")
    return lost


def budget(seeds: int, workers: int, options: dict, workload: str, cluster: str,
           budgets: tuple[int, ...], batch_prompts: int | None) -> None:
    """Section (b)."""
    if batch_prompts:
        options = {**options, "batch_prompts": batch_prompts}
    jobs = [("hetrl", workload, cluster, e, s, options) for e in budgets for s in range(seeds)]
    t0 = time.perf_counter()
    got = run_all(jobs, workers)
    batch = f", {batch_prompts} prompts" if batch_prompts else ""
    print(f"(b) budget monotone, {workload} @ {cluster}{batch}, seeds 0-{seeds - 1} "
          f"({time.perf_counter() - t0:.0f} s)")
    means = []
    for e in budgets:
        values = [got[("hetrl", workload, cluster, e, s)] for s in range(seeds)]
        means.append(statistics.fmean(values))
        print(f"  {e:5d} evaluations: mean {means[-1]:8.2f}  min {min(values):8.2f}  "
              f"max {max(values):8.2f}")
    ok = all(a >= b for a, b in zip(means, means[1:], strict=False))
    print(f"  mean non-increasing with the budget: {'yes' if ok else 'NO'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--section", choices=("floor", "budget", "all"), default="all")
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--evals", type=int, default=1000, help="evaluation budget of section (a)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-warm-start", action="store_true", help="HetRL without its warm start")
    ap.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                    help="a HetRL option (a Python literal value), e.g. p_sub=0.0; repeatable")
    ap.add_argument("--workload", default="qwen3-8b-ppo-sync", help="section (b)'s job")
    ap.add_argument("--cluster", default="paper64-multi-country", help="section (b)'s cluster")
    ap.add_argument("--budgets", default="250,1000,4000",
                    help="section (b)'s evaluation budgets, comma-separated")
    ap.add_argument("--batch-prompts", type=int, default=None,
                    help="section (b): prompts per iteration (the figures' default mode: 96)")
    args = ap.parse_args()
    options = {"warm_start": False} if args.no_warm_start else {}
    for item in args.option:
        name, _, value = item.partition("=")
        options[name] = ast.literal_eval(value)
    if args.section in ("floor", "all"):
        floor(args.seeds, args.evals, args.workers, options)
    if args.section in ("budget", "all"):
        budget(args.seeds, args.workers, options, args.workload, args.cluster,
               tuple(int(b) for b in args.budgets.split(",")), args.batch_prompts)


if __name__ == "__main__":
    main()
