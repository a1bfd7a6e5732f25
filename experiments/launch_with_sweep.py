"""`hetrl plan --launch-with verl` over the paper's clusters and the examples' fleets: does every
plan it returns export as it is (`hetrl export --to verl`, closest-plan ratio 1.00) and pass
verl 0.9.1's own config checks (tests/verl_accept.py)? And what does keeping to verl cost
against the unconstrained search, and how does it compare with verl's own placement (the verl and
verl-async schedulers' plans, as verl 0.9.1 launches them)?

    PYTHONPATH=. python experiments/launch_with_sweep.py [--budget-evals N] [--json]

Needs verl 0.9.1 importable for its checks (`pip install -e '.[test,verl]'`); without it the
checks column says so. About 4 minutes on 2 cores at the default budget.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

CLUSTERS = ("paper64-single-region", "paper64-multi-region-hybrid", "paper64-multi-country",
            "paper64-multi-continent", "paper24-a100-single-region",
            "paper48-a100-l40s-single-region", "examples/cluster-fleet.yaml",
            "examples/cluster-mixed.yaml", "examples/cluster-moe-fleet.yaml")
WORKLOADS = ("qwen3-8b-ppo-sync", "qwen3-8b-grpo-async", "qwen3-4b-ppo-async",
             "examples/workload-llama8b-grpo-rule.yaml", "examples/workload-ppo-mixed-sizes.yaml")


def _hetrl(*argv: str) -> tuple[int, dict | None]:
    """(exit code, the --json output) of one hetrl command run in this process."""
    from hetrl.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main([*argv, "--json"])
    return code, json.loads(out.getvalue()) if code == 0 else None


def _verl_accepts(where: Path, overrides: Path, workload_name: str) -> str:
    """"yes", or why verl's checks refuse (or cannot run)."""
    try:
        from tests.verl_accept import accepted_export
    except ImportError as exc:
        return f"not checked ({exc})"
    from hetrl.io import load_workload

    try:
        with contextlib.redirect_stdout(io.StringIO()):
            accepted_export(where, overrides, load_workload(workload_name))
    except ImportError as exc:
        return f"not checked ({exc})"
    except Exception as exc:  # noqa: BLE001 (any refusal of verl's is the answer)
        return f"refused: {type(exc).__name__}: {str(exc)[:120]}"
    return "yes"


def sweep_one(cluster: str, workload: str, budget: int) -> dict:
    """One (cluster, workload): the three searches, the export and verl's checks."""
    tmp = Path(tempfile.mkdtemp(prefix="hetrl-launch-"))
    row: dict = {"cluster": cluster, "workload": workload}
    common = ("-w", workload, "-c", cluster, "--budget-evals", str(budget), "--seed", "0")
    code, free = _hetrl("plan", *common, "-o", str(tmp / "free.json"))
    row["hetrl_s"] = free["iteration_s"] if free else None
    row["as_verl_runs_it_s"] = (free or {}).get("launchable", {}).get("iteration_s")
    code, kept = _hetrl("plan", *common, "--launch-with", "verl", "-o",
                      str(tmp / "launch.json"))
    row["launch_with_verl_s"] = kept["iteration_s"] if kept else None
    best = None
    for scheduler in ("verl", "verl-async"):
        code, own = _hetrl("plan", *common, "-s", scheduler, "--launch-with", "verl", "-o",
                           str(tmp / f"{scheduler}.json"))
        if own is not None and (best is None or own["iteration_s"] < best):
            best = own["iteration_s"]
    row["verl_scheduler_s"] = best
    if kept is None:
        row.update(export_exit=None, ratio=None, verl_accepts="no plan")
        return row
    code, exported = _hetrl("export", "--to", "verl", "-w", workload, "-c", cluster, "-p",
                            str(tmp / "launch.json"), "--out", str(tmp / "o.yaml"))
    row["export_exit"] = code
    row["ratio"] = exported["ratio"] if exported else None
    row["verl_accepts"] = _verl_accepts(tmp, tmp / "o.yaml", workload) if code == 0 else "-"
    return row


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget-evals", type=int, default=1000,
                    help="evaluations per search (default 1000)")
    ap.add_argument("--json", action="store_true", help="print machine-readable JSON")
    args = ap.parse_args(argv)
    rows = []
    for cluster in CLUSTERS:
        for workload in WORKLOADS:
            rows.append(sweep_one(cluster, workload, args.budget_evals))
            if not args.json:
                r = rows[-1]
                print(f"{cluster:34s} {workload:42s} hetrl {r['hetrl_s'] or 0:8.2f} "
                      f"(as verl runs it {r['as_verl_runs_it_s'] or float('nan'):9.2f}) "
                      f"launch-with verl {r['launch_with_verl_s'] or float('nan'):8.2f} "
                      f"verl's own (launched) {r['verl_scheduler_s'] or float('nan'):8.2f}  export "
                      f"{r['export_exit']} ratio {r['ratio']}  verl accepts: "
                      f"{r['verl_accepts']}", flush=True)
    ok = sum(r["export_exit"] == 0 and r["ratio"] == 1.0 and r["verl_accepts"] == "yes"
             for r in rows)
    summary = {"cases": len(rows), "exported_at_1_and_accepted": ok,
               "budget_evals": args.budget_evals}
    if args.json:
        print(json.dumps({"rows": rows, "summary": summary}, indent=2))
    else:
        print(f"{ok} of {len(rows)} --launch-with verl plans export at 1.00x and pass verl's "
              "checks")
    return 0 if ok == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
