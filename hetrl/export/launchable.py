"""Plans a framework can launch (``hetrl plan --launch-with verl|openrlhf``).

:func:`launchable_plan` maps any plan to what the framework runs from it -- the exporter's own
closest plan (its pools or placement groups, one layout per model, its co-location and async
rules, its per-node uniformity) -- or refuses it (SpecError) where the framework cannot come
close. A search that prices every plan it proposes through this map searches exactly the plans
the framework can express; its best plan exports with a closest-plan ratio of 1.00, because the
map is idempotent on its own results (tests/test_launchable.py). :func:`with_own_placement`
keeps the framework's own placement where it is faster; :func:`as_verl_runs_it` prices a plan
as verl would run it and :func:`best_verl_launch` adds verl's own placements (``hetrl plan``
without ``--launch-with``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from hetrl.errors import SpecError
from hetrl.plan import Plan
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.workload import WorkloadSpec

#: The frameworks a search can keep to (each with an exporter: ``hetrl export --to``).
LAUNCHERS = ("verl", "openrlhf")


def check_workload(framework: str, workload: WorkloadSpec) -> None:
    """Refuse (SpecError) a workload the framework cannot run whatever the plan: checked once,
    before a search."""
    if framework == "verl":
        from hetrl.export.verl import check_workload as check_verl

        check_verl(workload)
    if framework == "openrlhf":
        from hetrl.export.openrlhf import check_settings

        check_settings(workload)


def launchable_plan(framework: str, plan: Plan, workload: WorkloadSpec,
                    cluster: ClusterSpec) -> Plan:
    """The plan ``framework`` runs when ``plan`` is exported to it (its closest plan); raises
    SpecError where the export would refuse."""
    if framework == "verl":
        from hetrl.export import verl

        return verl.closest_plan(verl.verl_layout(plan, workload, cluster), workload, cluster)
    if framework == "openrlhf":
        from hetrl.export import openrlhf as orl

        orl.check_experts_and_fp8(plan, workload)
        layout = orl.openrlhf_layout(plan, workload, cluster)
        orl.check_workload(workload, layout, cluster)
        return orl.closest_plan(layout, workload, cluster)
    raise SpecError("--launch-with", framework, f"must be one of {list(LAUNCHERS)}")


def projection(framework: str, workload: WorkloadSpec,
               cluster: ClusterSpec) -> Callable[[Plan], Plan]:
    """:func:`launchable_plan` for one framework, workload and cluster, as a picklable
    callable (a search's worker processes take it)."""
    if framework not in LAUNCHERS:
        raise SpecError("--launch-with", framework, f"must be one of {list(LAUNCHERS)}")
    return partial(_project, framework, workload, cluster)


def _project(framework: str, workload: WorkloadSpec, cluster: ClusterSpec, plan: Plan) -> Plan:
    return launchable_plan(framework, plan, workload, cluster)


#: Per framework of ``--launch-with`` the schedulers of its own published placement: their plans
#: are launchable by design, so the search's plan must be at least as good as theirs.
OWN_SCHEDULERS = {"verl": ("verl", "verl-async"), "openrlhf": ()}


def own_placements(framework, workload, cluster, params, budget, launch) -> dict:
    """Scheduler name -> SearchResult of the framework's own placements
    (:data:`OWN_SCHEDULERS`) searched with ``budget`` through the ``launch`` map; a placement
    the framework's design cannot make here is left out."""
    from hetrl.errors import HetrlError
    from hetrl.search import get_scheduler

    out = {}
    for name in OWN_SCHEDULERS[framework]:
        try:
            out[name] = get_scheduler(name, params).search(workload, cluster, budget,
                                                           launch=launch)
        except HetrlError:
            continue
    return out


def with_own_placement(result, framework, workload, cluster, params, budget, launch):
    """``result``, or the framework's own placement (:func:`own_placements`, the same budget
    and launch map) where that is faster: a search that keeps to a framework never returns
    worse than the framework's own plan. Reported under ``own_plans_compared`` (and
    ``found_by``)."""
    from dataclasses import replace

    own = own_placements(framework, workload, cluster, params, budget, launch)
    best = min([result, *own.values()], key=lambda r: r.estimate.iteration_s)
    extra = dict(result.extra, own_plans_compared={
        name: {"iteration_s": r.estimate.iteration_s, "evaluations": r.evaluations}
        for name, r in own.items()})
    if best is not result:
        extra["found_by"] = f"{best.scheduler} ({framework}'s own placement)"
    return replace(result, plan=best.plan, estimate=best.estimate, extra=extra)


def as_verl_runs_it(plan, workload, cluster, params, est) -> dict:
    """How verl would run ``plan`` (its export's closest plan, priced with verl's per-step
    costs): the ``launchable`` entry of ``hetrl plan --json`` without --launch-with."""
    from hetrl.cost.model import CostModel

    try:
        check_workload("verl", workload)
        closest = launchable_plan("verl", plan, workload, cluster)
    except SpecError as exc:
        return {"framework": "verl", "iteration_s": None, "feasible": None, "gap": None,
                "why_not": str(exc)}
    theirs = CostModel(workload.with_(framework="verl"), cluster, params).estimate(closest)
    gap = theirs.iteration_s / est.iteration_s if theirs.feasible else None
    return {"framework": "verl", "iteration_s": theirs.iteration_s,
            "feasible": theirs.feasible, "gap": gap, "why_not": None}


#: Evaluations given to each of verl's own schedulers when ``hetrl plan`` (without
#: ``--launch-with``) looks for the best plan verl can launch beside its own.
OWN_PLACEMENT_EVALS = 1000


def best_verl_launch(plan, workload, cluster, params, est, seed: int = 0) -> dict:
    """:func:`as_verl_runs_it` of ``plan``, and the best verl-launchable plan known here: the
    faster of ``plan`` as verl runs it and verl's own placements (:data:`OWN_SCHEDULERS`,
    launched, :data:`OWN_PLACEMENT_EVALS` evaluations each) -- ``best_launchable_s``, its
    ``best_launchable_gap`` to ``est`` and ``best_launchable_from``; ``workload_launchable``
    false where verl runs no plan of the workload at all (its ``why_not`` says why)."""
    from hetrl.search import Budget

    out = as_verl_runs_it(plan, workload, cluster, params, est)
    best = (out["iteration_s"], "this plan") if out["feasible"] else (None, None)
    verl_workload = workload.with_(framework="verl")
    try:
        check_workload("verl", workload)
    except SpecError:
        return {**out, "best_launchable_s": None, "best_launchable_gap": None,
                "best_launchable_from": None, "workload_launchable": False}
    own = own_placements("verl", verl_workload, cluster, params,
                         Budget(evaluations=OWN_PLACEMENT_EVALS, seed=seed),
                         projection("verl", verl_workload, cluster))
    for name, r in own.items():
        if best[0] is None or r.estimate.iteration_s < best[0]:
            best = (r.estimate.iteration_s, f"{name}'s placement")
    return {**out, "best_launchable_s": best[0],
            "best_launchable_gap": None if best[0] is None else best[0] / est.iteration_s,
            "best_launchable_from": best[1], "workload_launchable": True}
