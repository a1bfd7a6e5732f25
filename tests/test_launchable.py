"""Plans a framework can launch (hetrl.export.launchable): the map from a plan to what the
framework runs from it is idempotent on its own results, and a search through it returns a
plan the framework runs as it is."""

from __future__ import annotations

import pytest

from hetrl.errors import SpecError
from hetrl.export.launchable import LAUNCHERS, launchable_plan, projection
from hetrl.io import load_cluster, load_workload
from hetrl.search import Budget, get_scheduler
from hetrl.search.base import UNLAUNCHABLE_PENALTY_S, Evaluator

CASES = [("qwen3-8b-ppo-sync", "paper64-multi-region-hybrid"),
         ("qwen3-8b-grpo-async", "examples/cluster-fleet.yaml"),
         ("examples/workload-llama8b-grpo-rule.yaml", "examples/cluster-mixed.yaml")]


def _same(a, b) -> bool:
    return a.groups == b.groups and a.placements == b.placements


@pytest.mark.parametrize("framework", LAUNCHERS)
@pytest.mark.parametrize("workload_name,cluster_name", CASES)
def test_the_map_is_idempotent_on_every_plan_a_search_proposes(framework, workload_name,
                                                               cluster_name):
    """Every plan the hetrl search evaluates, mapped once and then again: the second map
    changes nothing (so the searched plan exports with a ratio of 1.00)."""
    workload, cluster = load_workload(workload_name), load_cluster(cluster_name)
    launch = projection(framework, workload, cluster)
    seen, refused = [], 0

    def recording(plan):
        nonlocal refused
        try:
            out = launch(plan)
        except SpecError:
            refused += 1
            raise
        seen.append(out)
        return out

    result = get_scheduler("hetrl").search(workload, cluster, Budget(evaluations=150),
                                           launch=recording)
    assert seen and all(_same(launchable_plan(framework, p, workload, cluster), p)
                        for p in seen[::5])
    assert _same(launchable_plan(framework, result.plan, workload, cluster), result.plan)


def test_a_plan_the_framework_cannot_run_ranks_after_every_plan_it_can():
    workload, cluster = load_workload("qwen3-8b-ppo-sync"), load_cluster("a100x8")

    def never(plan):
        raise SpecError("plan", "x", "not launchable")

    ev = Evaluator(workload, cluster, Budget(evaluations=5), launch=never)
    from hetrl.plan import colocated_plan

    assert ev.evaluate(colocated_plan(workload, cluster)) == UNLAUNCHABLE_PENALTY_S
    assert ev.evaluations == 1 and ev.best is None


def test_an_unknown_framework_is_refused():
    workload, cluster = load_workload("qwen3-8b-ppo-sync"), load_cluster("a100x8")
    with pytest.raises(SpecError) as err:
        projection("trl", workload, cluster)
    assert err.value.field == "--launch-with"


def test_a_search_that_finds_nothing_launchable_says_so():
    from hetrl.errors import InfeasibleError

    workload, cluster = load_workload("qwen3-8b-ppo-sync"), load_cluster("a100x8")

    def never(plan):
        raise SpecError("plan", "x", "not launchable")

    with pytest.raises(InfeasibleError, match="launches none of the"):
        get_scheduler("random").search(workload, cluster, Budget(evaluations=20), launch=never)
