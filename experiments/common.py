"""Helpers shared by the figures: plans from schedulers and throughput from the simulator."""

from __future__ import annotations

from typing import Any

from hetrl.cost.model import CostModel
from hetrl.errors import InfeasibleError
from hetrl.plan import Plan
from hetrl.search import Budget, get_scheduler
from hetrl.spec.presets import cluster_preset, workload_preset
from sim import simulate

#: The schedulers each system uses, by mode (the paper compares HetRL with verl in sync, and
#: with verl-async and StreamRL in async).
SYSTEMS = {"sync": ("hetrl", "verl"), "async": ("hetrl", "verl-async", "streamrl")}


def job(workload: str, batch_prompts: int | None = None):
    """A preset workload, optionally with fewer prompts per iteration (smaller runs)."""
    wl = workload_preset(workload)
    return wl if batch_prompts is None else wl.with_(batch_prompts=batch_prompts)


def search(scheduler: str, workload: str, cluster: str, evaluations: int | None, seed: int = 0,
           load_balance: bool = True, seconds: float | None = None,
           batch_prompts: int | None = None, **options: Any) -> tuple[Plan | None, dict[str, Any]]:
    """A plan from ``scheduler`` (None, with the reason, if it found nothing that fits);
    ``load_balance=False`` and ``options`` go to the scheduler (its own options only)."""
    wl, cl = job(workload, batch_prompts), cluster_preset(cluster)
    if not load_balance:
        options["load_balance"] = False
    try:
        result = get_scheduler(scheduler, **options).search(
            wl, cl, Budget(evaluations=evaluations, seconds=seconds, seed=seed))
    except InfeasibleError as exc:
        return None, {"estimate_s": float("nan"), "evaluations": evaluations, "search_s": float("nan"),
                      "history": [], "converged": None, "infeasible": str(exc)}
    return result.plan, {"estimate_s": result.estimate.iteration_s,
                         "evaluations": result.evaluations, "search_s": result.elapsed_s,
                         "history": [list(h) for h in result.history],
                         "converged": result.converged, **result.extra}


def simulated(plan: Plan | None, workload: str, cluster: str, iterations: int, seed: int = 0,
              batch_prompts: int | None = None) -> dict[str, Any]:
    """Simulated throughput of ``plan``; a missing plan (nothing fit) has throughput 0.
    ``feasible`` is the cost model's verdict (memory above all: the simulator checks none)."""
    wl, cl = job(workload, batch_prompts), cluster_preset(cluster)
    if plan is None:
        return {"sim_iteration_s": float("nan"), "throughput_samples_per_s": 0.0,
                "estimate_s": float("nan"), "feasible": False, "groups": 0, "gpus_used": 0}
    r = simulate(plan, wl, cl, iterations, seed)
    est = CostModel(wl, cl).estimate(plan)
    return {
        "sim_iteration_s": r.metrics["iteration_s"],
        "throughput_samples_per_s": wl.samples / r.metrics["iteration_s"],
        "estimate_s": est.iteration_s,
        "feasible": bool(est.feasible),
        "groups": len(plan.groups),
        "gpus_used": len(plan.device_ids),
    }


def batch_for(config) -> int | None:
    """Prompts per iteration: the paper's 384 in --full; smaller in the default (96) and quick
    (32) modes so every figure fits the time budget on 2 cores (stated in figures/README.md)."""
    return config.pick(32, 96, None)


def sim_iterations(mode: str, quick: bool) -> int:
    """Enough iterations for a steady-state mean after the first (async needs the pipeline
    filled)."""
    return (2 if mode == "sync" else 3) if quick else (3 if mode == "sync" else 4)
