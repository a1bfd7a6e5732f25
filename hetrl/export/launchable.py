"""Plans a framework can launch (``hetrl plan --launch-with verl|openrlhf``).

:func:`launchable_plan` maps any plan to what the framework runs from it -- the exporter's own
closest plan (its pools or placement groups, one layout per model, its co-location and async
rules, its per-node uniformity) -- or refuses it (SpecError) where the framework cannot come
close. A search that prices every plan it proposes through this map searches exactly the plans
the framework can express; its best plan exports with a closest-plan ratio of 1.00, because the
map is idempotent on its own results (tests/test_launchable.py).
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
    if framework == "verl" and workload.batch_prompts % workload.optimizer_steps:
        raise SpecError("optimizer_steps", workload.optimizer_steps,
                        f"must divide batch_prompts ({workload.batch_prompts}): verl's "
                        "ppo_mini_batch_size is a whole number of prompts")
    if framework == "openrlhf":
        from hetrl.export.openrlhf import check_fp8

        check_fp8(workload)


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
