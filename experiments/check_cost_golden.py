"""Golden check of the cost model: every number it produces, for a few hundred varied plans.

``--write FILE`` draws plans with fixed seeds (random flat encodings with and without the load
balancer, the EA's random and seeded starts, then uneven data weights and layer splits on some of
them) over several workloads and clusters, stores the plans and the cost model's full answers;
``--check FILE`` re-estimates the stored plans and compares: numbers to a relative ``--rtol``
(default 1e-9), strings and flags exactly. The benchmark's own plans (random data weights,
shuffled device orders) are added to its case. Recorded per plan:

- ``fresh``: ``CostModel(...).estimate(plan).to_dict()`` with a new CostModel per plan (cold);
- ``shared``: the same through one CostModel per (workload, cluster) over all its plans in order
  (warm memos), the plan-level memo bypassed;
- ``replica_seconds`` and ``task_alone`` (seconds and per-device bytes) of every placement, and
  ``kv_budgets`` (the load balancer's and the ILP's entry points).

Run: ``python experiments/check_cost_golden.py --write /tmp/cost_golden.json`` before a change and
``python experiments/check_cost_golden.py --check /tmp/cost_golden.json`` after it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments.bench_cost_model import make_plan  # noqa: E402
from hetrl.cost.model import CostModel  # noqa: E402
from hetrl.plan import Plan, validate  # noqa: E402
from hetrl.search.ea import Arm, DeviceFacts  # noqa: E402
from hetrl.search.flat import FlatCodec  # noqa: E402
from hetrl.search.genome import decode  # noqa: E402
from hetrl.spec.presets import cluster_preset, workload_preset  # noqa: E402

BENCH_WORKLOAD, BENCH_CLUSTER = "qwen3-8b-ppo-sync", "paper64-multi-country"

#: (workload, cluster, plans drawn); the benchmark's case also gets 20 of its plans
CASES: tuple[tuple[str, str, int], ...] = (
    ("qwen3-8b-ppo-sync", "paper64-multi-country", 60),
    ("qwen3-8b-ppo-async", "paper64-multi-continent", 40),
    ("qwen3-4b-grpo-sync", "paper64-multi-continent", 40),
    ("qwen3-14b-grpo-async", "paper64-multi-country", 40),
    ("qwen3-4b-ppo-async", "hetero16-two-region", 40),
    ("qwen3-8b-grpo-sync", "hetero24-two-region", 40),
    ("qwen3-14b-ppo-sync", "hetero24-two-region", 30),
    ("qwen3-4b-ppo-sync", "a100x8", 30),
    ("qwen3-8b-grpo-async", "a100x8", 30),
)


def _draw_plans(wl_name: str, cl_name: str, count: int, seed: int) -> list[Plan]:
    """``count`` valid plans of one workload on one cluster, all from ``seed``."""
    wl, cluster = workload_preset(wl_name), cluster_preset(cl_name)
    model = CostModel(wl, cluster)
    rng = np.random.default_rng(seed)
    codec = FlatCodec(wl, cluster.num_devices)
    facts = DeviceFacts.of(model)
    plans: list[Plan] = []
    for i in range(count):
        kind = i % 4
        if kind in (0, 1):  # flat random encoding, with / without the load balancer
            plan = decode(codec.decode(codec.random(rng)), model, load_balance=kind == 0)
        else:  # the EA's random and seeded starts on a random grouping and split
            g = codec.decode(codec.random(rng))
            arm = Arm(g.groups, g.sizes, model, facts, rng)
            geno = arm.random_genotype() if kind == 2 else arm.seeded_genotype()
            plan = decode(geno, model, load_balance=True)
        if i % 3 == 0:  # uneven data weights and layer splits
            plan = _perturb(plan, wl, rng)
        validate(plan, wl, cluster)
        plans.append(plan)
    if (wl_name, cl_name) == (BENCH_WORKLOAD, BENCH_CLUSTER):  # the benchmark's plans too
        plans += [make_plan(rng, vary="weights" if i % 2 else "order") for i in range(20)]
    return plans


def _perturb(plan: Plan, wl: Any, rng: np.random.Generator) -> Plan:
    out = []
    for p in plan.placements:
        weights = tuple(float(x) for x in rng.uniform(0.3, 2.0, p.dp))
        layers = p.layers_per_stage
        if p.pp > 1 and rng.random() < 0.5:
            total = wl.model(wl.task(p.task).role).layers
            cuts = sorted(rng.choice(np.arange(1, total), p.pp - 1, replace=False).tolist())
            edges = [0, *cuts, total]
            layers = tuple(int(b - a) for a, b in zip(edges, edges[1:], strict=False))
        out.append(replace(p, data_weights=weights, layers_per_stage=layers))
    return replace(plan, placements=tuple(out))


def _answers(model: CostModel, plan: Plan) -> dict[str, Any]:
    """Everything recorded for one plan (see the module docstring); ``model`` is the shared one."""
    def fresh_of() -> CostModel:
        return CostModel(model.workload, model.cluster, model.params)

    def run(fn: Any) -> Any:
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 -- an error is an answer too
            return {"error": f"{type(exc).__name__}: {exc}"}

    fresh = fresh_of()
    out: dict[str, Any] = {
        "fresh": run(lambda: fresh.estimate(plan).to_dict()),
        "shared": run(lambda: model.estimate_uncached(plan).to_dict()),
        "kv_budgets": run(lambda: _nonzero(fresh_of().kv_budgets(plan))),
        "replica_seconds": {p.task: run(lambda p=p: fresh_of().replica_seconds(p))
                            for p in plan.placements},
    }
    alone = {}
    for p in plan.placements:
        def one(p=p) -> Any:
            s, need = fresh_of().task_alone(p)
            return {"seconds": s, "need": _nonzero(need)}
        alone[p.task] = run(one)
    out["task_alone"] = alone
    return out


def _nonzero(arr: np.ndarray) -> dict[str, float]:
    return {str(i): float(arr[i]) for i in np.nonzero(arr)[0].tolist()}


def build() -> dict[str, Any]:
    cases = []
    for k, (wl_name, cl_name, count) in enumerate(CASES):
        wl, cluster = workload_preset(wl_name), cluster_preset(cl_name)
        plans = _draw_plans(wl_name, cl_name, count, seed=1000 + k)
        shared = CostModel(wl, cluster)
        records = [{"plan": p.to_dict(), **_answers(shared, p)}
                   for p in plans]
        cases.append({"workload": wl_name, "cluster": cl_name, "records": records})
    return {"cases": cases}


def recompute(golden: dict[str, Any]) -> dict[str, Any]:
    """The answers for ``golden``'s stored plans, from the current code."""
    cases = []
    for case in golden["cases"]:
        wl, cluster = workload_preset(case["workload"]), cluster_preset(case["cluster"])
        shared = CostModel(wl, cluster)
        records = []
        for rec in case["records"]:
            plan = Plan.from_dict(rec["plan"])
            records.append({"plan": rec["plan"],
                            **_answers(shared, plan)})
        cases.append({**case, "records": records})
    return {"cases": cases}


class Diff:
    """Compares two JSON trees: numbers to a relative tolerance, everything else exactly."""

    def __init__(self, rtol: float):
        self.rtol = rtol
        self.max_rel = 0.0
        self.numbers = 0
        self.problems: list[str] = []

    def compare(self, a: Any, b: Any, path: str) -> None:
        if isinstance(a, bool) or isinstance(b, bool) or isinstance(a, str) or a is None:
            if a != b:
                self.problems.append(f"{path}: {a!r} != {b!r}")
        elif isinstance(a, int | float) and isinstance(b, int | float):
            self.numbers += 1
            if a == b or (math.isnan(a) and math.isnan(b)):
                return
            rel = abs(a - b) / max(abs(a), abs(b))
            self.max_rel = max(self.max_rel, rel)
            if not rel <= self.rtol:
                self.problems.append(f"{path}: {a!r} != {b!r} (relative {rel:.3g})")
        elif isinstance(a, dict) and isinstance(b, dict):
            if list(a) != list(b):
                self.problems.append(f"{path}: keys {list(a)} != {list(b)}")
            for k in a:
                if k in b:
                    self.compare(a[k], b[k], f"{path}.{k}")
        elif isinstance(a, list) and isinstance(b, list):
            if len(a) != len(b):
                self.problems.append(f"{path}: length {len(a)} != {len(b)}")
            for i, (x, y) in enumerate(zip(a, b, strict=False)):
                self.compare(x, y, f"{path}[{i}]")
        else:
            self.problems.append(f"{path}: {a!r} != {b!r} (types)")


def summary(golden: dict[str, Any]) -> str:
    recs = [r for c in golden["cases"] for r in c["records"]]
    infeasible = sum(1 for r in recs if isinstance(r["fresh"], dict) and r["fresh"].get("feasible") is False)
    errors = sum(1 for r in recs if "error" in r["fresh"])
    return f"{len(recs)} plans ({infeasible} infeasible, {errors} errors) in {len(golden['cases'])} cases"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", metavar="FILE", help="draw plans, write plans + answers")
    mode.add_argument("--check", metavar="FILE", help="re-estimate FILE's plans and compare")
    parser.add_argument("--rtol", type=float, default=1e-9)
    args = parser.parse_args()
    t = time.perf_counter()
    if args.write:
        golden = build()
        with open(args.write, "w") as f:
            json.dump(golden, f, allow_nan=True)
        print(f"wrote {args.write}: {summary(golden)} in {time.perf_counter() - t:.1f} s")
        return 0
    with open(args.check) as f:
        golden = json.load(f)
    # round-trip through JSON so both sides have the same types (tuples -> lists, keys -> str)
    now = json.loads(json.dumps(recompute(golden), allow_nan=True))
    diff = Diff(args.rtol)
    diff.compare(golden, now, "golden")
    print(f"checked {summary(golden)}: {diff.numbers} numbers, max relative difference "
          f"{diff.max_rel:.3g}, {len(diff.problems)} mismatches in {time.perf_counter() - t:.1f} s")
    for line in diff.problems[:20]:
        print("  " + line)
    return 1 if diff.problems else 0


if __name__ == "__main__":
    sys.exit(main())
