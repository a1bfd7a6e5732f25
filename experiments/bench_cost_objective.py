"""Issue 29's target: on qwen3-8b-ppo-sync @ paper64-multi-country, ``--objective cost`` finds
a plan with lower dollars per 1k samples than ``--objective time`` at the same budget and seed,
and the time objective's plan is faster. Prints both plans under both ways of charging (every
GPU of the cluster, idle ones too; only the GPUs a plan uses).

    PYTHONPATH=. python experiments/bench_cost_objective.py [--evals 600] [--seed 0]
"""

from __future__ import annotations

import argparse
import time

from hetrl.cost.money import money
from hetrl.search import Budget, get_scheduler
from hetrl.search.objective import Objective
from hetrl.spec.presets import cluster_preset, workload_preset


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="qwen3-8b-ppo-sync")
    ap.add_argument("--cluster", default="paper64-multi-country")
    ap.add_argument("--scheduler", default="hetrl")
    ap.add_argument("--evals", type=int, default=600)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    wl, cl = workload_preset(args.workload), cluster_preset(args.cluster)
    print(f"{args.scheduler} on {wl.name} @ {cl.name}, {args.evals} evaluations, seed {args.seed}")
    print(f"{'charging':<11}{'objective':<10}{'s/iter':>9}{'$/1k samples':>14}{'$/h':>9}"
          f"{'GPUs':>6}{'egress $':>10}{'x-region GB':>13}{'search s':>10}")
    ok = True
    for used_only in (False, True):
        rows = {}
        for kind in ("time", "cost"):
            obj = Objective(kind, charge_used_only=used_only)
            t = time.perf_counter()
            sched = get_scheduler(args.scheduler, objective=obj)
            r = sched.search(wl, cl, Budget(evaluations=args.evals, seed=args.seed))
            from hetrl.cost.model import CostModel

            m = money(CostModel(wl, cl), r.plan, r.estimate.iteration_s, used_only)
            rows[kind] = (r.estimate.iteration_s, m.dollars_per_1k_samples)
            print(f"{'used only' if used_only else 'idle too':<11}{kind:<10}"
                  f"{r.estimate.iteration_s:>9.2f}{m.dollars_per_1k_samples:>14.3f}"
                  f"{m.dollars_per_hour:>9.1f}{m.gpus_charged:>6}{m.egress_dollars:>10.3f}"
                  f"{m.cross_region_bytes / 1e9:>13.1f}{time.perf_counter() - t:>10.1f}")
        cheaper = rows["cost"][1] < rows["time"][1]
        faster = rows["time"][0] < rows["cost"][0]
        ok &= cheaper and faster
        print(f"  -> cost objective cheaper: {cheaper}; time objective faster: {faster}")
    print("target holds" if ok else "target does not hold under every charging (see above)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
