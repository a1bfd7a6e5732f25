"""Benchmark: wall time and events per second of simulating one sync PPO iteration of Qwen3-8B
(``qwen3-8b-ppo-sync``) on the paper's 64-GPU testbed (a benchmark, not a test).

Plans: the ``hetrl`` scheduler's with ``--evals`` cost-model evaluations (default 1000) on each
paper64 scenario, and a colocated plan (every task on all 64 GPUs, tp 4, dp 16). Each is
simulated for one iteration ``--repeats`` times (the best time counts, on one core: no worker
processes). Target from the simulator issue: <= 2 s per iteration on one core.

Every time is also printed as a ratio to a reference loop run in the same process (1e5 dict
look-ups in a Python loop, as in bench_cost_model.py), so that figures from different machines
can be compared. ``--profile`` prints the top functions of the slowest plan's run.

Run: ``python experiments/bench_sim.py [--scenarios single-region,...] [--evals N] [--profile]``.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import simpy  # noqa: E402

from experiments.bench_cost_model import reference_rate  # noqa: E402
from hetrl.cost.model import CostModel  # noqa: E402
from hetrl.plan import Plan, colocated_plan  # noqa: E402
from hetrl.search import Budget, get_scheduler  # noqa: E402
from hetrl.spec.presets import SCENARIOS, cluster_preset, workload_preset  # noqa: E402
from sim import simulate  # noqa: E402

WORKLOAD = "qwen3-8b-ppo-sync"
TARGET_S = 2.0


def reference_s(repeats: int = 5) -> float:
    """Seconds of 1e5 dict look-ups in a plain Python loop (best of ``repeats``): the same
    reference loop as bench_cost_model.py, so the two benchmarks' ratios compare."""
    return 100_000 / reference_rate(repeats)


def shape(plan: Plan, workload) -> str:
    """A short description: per task dp x pp x tp."""
    short = {"actor_generation": "gen", "reward_inference": "rew", "reference_inference": "ref",
             "critic_inference": "cinf", "actor_inference": "ainf", "actor_training": "atr",
             "critic_training": "ctr"}
    return " ".join(f"{short[p.task]} {p.dp}x{p.pp}x{p.tp}" for p in plan.placements)


def bench(name: str, plan: Plan, cluster, workload, repeats: int) -> dict:
    est = CostModel(workload, cluster).estimate(plan)
    simulate(plan, workload, cluster, 1)  # warm the cost model's caches the simulator uses
    best, events, sim_s = float("inf"), 0, 0.0
    for _ in range(repeats):
        t = time.perf_counter()
        r = simulate(plan, workload, cluster, 1)
        wall = time.perf_counter() - t
        if wall < best:
            best, events, sim_s = wall, r.metrics["events"], r.metrics["iterations"][0]
    return {"name": name, "wall_s": best, "events": events, "events_per_s": events / best,
            "sim_s": sim_s, "est_s": est.iteration_s, "feasible": est.feasible,
            "shape": shape(plan, workload), "plan": plan}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="experiments/bench_sim.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help="paper64 scenarios")
    p.add_argument("--evals", type=int, default=1000, help="hetrl search budget (evaluations)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3, help="timed runs per plan (best counts)")
    p.add_argument("--profile", action="store_true", help="profile the slowest plan's run")
    args = p.parse_args(argv)

    wl = workload_preset(WORKLOAD)
    print(f"python {platform.python_version()} on {platform.machine()}, simpy {simpy.__version__}")
    print(f"{WORKLOAD}: {wl.samples} sequences per iteration, micro-batches of "
          f"{wl.micro_batch_size} (training) / {wl.inference_micro_batch_size} (inference)")
    rows = []
    for scenario in [s.strip() for s in args.scenarios.split(",")]:
        cluster = cluster_preset(f"paper64-{scenario}")
        t = time.perf_counter()
        plan = get_scheduler("hetrl").search(wl, cluster, Budget(evaluations=args.evals,
                                                                 seed=args.seed)).plan
        print(f"  hetrl plan for {scenario}: {time.perf_counter() - t:.1f} s of search", flush=True)
        rows.append(bench(f"hetrl {scenario}", plan, cluster, wl, args.repeats))
    cluster = cluster_preset("paper64-single-region")
    rows.append(bench("colocated single-region", colocated_plan(wl, cluster, tp=4), cluster, wl,
                      args.repeats))

    ref = min(reference_s(), reference_s())
    print(f"reference loop: {ref * 1e3:.2f} ms for 1e5 dict look-ups (the unit of 'x ref')")
    print(f"{'plan':<30}{'wall s/it':>10}{'x ref':>8}{'events':>10}{'events/s':>10}"
          f"{'sim s':>9}{'est s':>9}  target <= {TARGET_S:g} s   layout (dp x pp x tp)")
    for r in rows:
        mark = "met" if r["wall_s"] <= TARGET_S else "MISSED"
        print(f"{r['name']:<30}{r['wall_s']:>10.2f}{r['wall_s'] / ref:>8.0f}{r['events']:>10,}"
              f"{r['events_per_s']:>10,.0f}{r['sim_s']:>9.1f}{r['est_s']:>9.1f}  {mark:<16}"
              f"{r['shape']}{'' if r['feasible'] else ' (infeasible)'}")

    if args.profile:
        import cProfile
        import pstats

        worst = max(rows, key=lambda r: r["wall_s"])
        cluster = cluster_preset("paper64-single-region" if worst["name"].startswith("colocated")
                                 else f"paper64-{worst['name'].split()[1]}")
        prof = cProfile.Profile()
        prof.enable()
        simulate(worst["plan"], wl, cluster, 1)
        prof.disable()
        print(f"\nprofile of {worst['name']}:")
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)
    return 0


if __name__ == "__main__":
    sys.exit(main())
