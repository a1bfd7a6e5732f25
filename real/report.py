"""What a real run measured, next to what the cost model estimates for the same plan."""

from __future__ import annotations

from typing import Any

from hetrl.cost.model import CostModel
from hetrl.cost.params import DEFAULT_PARAMS, CostParams
from hetrl.plan import Plan
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.tasks import REPORTED_TASKS
from hetrl.spec.workload import WorkloadSpec
from hetrl.trace import Trace


def measured_iteration_s(trace: Trace) -> float:
    """Mean iteration time (seconds), leaving out the first (warm-up) when there are several."""
    secs = trace.iteration_seconds()
    rest = secs[1:] if len(secs) > 1 else secs
    return sum(rest) / len(rest)


def per_iteration_tasks(trace: Trace) -> list[dict[str, float]]:
    """Seconds of each task span, per iteration."""
    out: list[dict[str, float]] = [{} for _ in trace.iterations]
    for s in trace.spans_of("task"):
        if 0 <= s.iteration < len(out):
            out[s.iteration][s.task] = out[s.iteration].get(s.task, 0.0) + s.duration_s
    return out


def run_report(result: Any, workload: WorkloadSpec, cluster: ClusterSpec, plan: Plan,
               params: CostParams = DEFAULT_PARAMS) -> dict[str, Any]:
    """The ``hetrl run --json`` object: per-iteration and per-task seconds, the estimate and the
    estimate's relative error ((estimate - measured) / measured)."""
    trace = result.trace
    est = CostModel(workload, cluster, params).estimate(plan)
    measured = measured_iteration_s(trace)
    tasks = trace.task_seconds()
    rows = [{"iteration": i, "seconds": s, "mean_reward": r, "tasks": t}
            for i, (s, r, t) in enumerate(zip(trace.iteration_seconds(), result.rewards,
                                              per_iteration_tasks(trace), strict=True))]
    return {
        "workload": workload.name, "cluster": cluster.name,
        "iterations": rows,
        "iteration_s": measured,
        "tasks": {t: tasks.get(t, 0.0) for t in REPORTED_TASKS if t in tasks or t in est.tasks},
        "extra_tasks": {t: s for t, s in tasks.items() if t not in REPORTED_TASKS},
        "estimate": {"iteration_s": est.iteration_s, "tasks": dict(est.tasks),
                     "feasible": est.feasible},
        "estimate_error": (est.iteration_s - measured) / measured if measured > 0 else None,
        "weights_verified": result.weights_verified,
        "resumed_from": result.resumed_from,
    }
