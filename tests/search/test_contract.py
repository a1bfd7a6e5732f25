"""The scheduler contract, run over every registered scheduler (Optuna-style contract test).

``search(workload, cluster, budget) -> SearchResult``: a valid, feasible plan; its estimate is the
cost model's estimate of that plan; the evaluation budget is respected; the history is a
convergence curve (best seconds never increase); same seed + same evaluation budget -> same plan.

The one exception to the evaluation budget is ``ilp``: it prices every (task, device set, layout)
candidate with the cost model before solving (each counts as one evaluation), so its count is
the number of candidates plus the final estimate, whatever the budget; the budget instead sets
its solver's deterministic time limit (5 ms of deterministic time per evaluation).
"""

from __future__ import annotations

import math
import time

import pytest

from hetrl.cost.model import CostModel
from hetrl.plan import validate
from hetrl.search import SCHEDULERS, Budget, SearchResult, get_scheduler, load_all

load_all()
ALL = sorted(SCHEDULERS)
BUDGET_EVALS = 200
#: Schedulers whose evaluation count may exceed the evaluation budget, and why.
PRICES_ALL_CANDIDATES = {"ilp"}


def test_registry_is_complete():
    assert ALL == sorted(["hetrl", "hetrl-simple", "ilp", "verl", "verl-async", "streamrl",
                          "deap", "random"])
    for name, cls in SCHEDULERS.items():
        assert cls.name == name and cls.description


@pytest.mark.parametrize("name", ALL)
def test_scheduler_contract(name, small_workload, small_cluster):
    wl, cl = small_workload, small_cluster
    budget = Budget(evaluations=BUDGET_EVALS, seed=3)
    result = get_scheduler(name).search(wl, cl, budget)

    assert isinstance(result, SearchResult) and result.scheduler == name
    validate(result.plan, wl, cl)  # raises on an invalid plan
    assert result.plan.provenance.scheduler == name and result.plan.provenance.seed == 3
    est = result.estimate
    assert est.feasible and not est.violations
    assert 0 < est.iteration_s < math.inf
    # The estimate is the cost model's estimate of the returned plan.
    again = CostModel(wl, cl).estimate(result.plan)
    assert again.feasible
    assert again.iteration_s == pytest.approx(est.iteration_s, rel=1e-9)

    # Budget.
    assert result.evaluations >= 1
    if name not in PRICES_ALL_CANDIDATES:
        assert result.evaluations <= BUDGET_EVALS
    else:
        assert result.extra["ilp_candidates"] + 1 == result.evaluations

    # History: (elapsed, evaluations, best seconds), time and count never decrease, best never
    # increases, and it ends at the returned plan.
    hist = result.history
    assert hist, "a history point at least for the final plan"
    assert all(len(h) == 3 for h in hist)
    for (t0, n0, b0), (t1, n1, b1) in zip(hist, hist[1:], strict=False):
        assert t1 >= t0 and n1 >= n0
        assert b1 <= b0
    assert hist[-1][1] == result.evaluations
    assert hist[-1][2] == pytest.approx(est.iteration_s)
    assert hist[-1][0] == pytest.approx(result.elapsed_s, abs=0.05)

    data = result.to_dict()
    assert data["scheduler"] == name and data["iteration_s"] == est.iteration_s
    assert data["history"] == [list(h) for h in hist]

    # Convergence: whether the best improved by 0.5% or more over the budget's last half, and
    # the last improvement (within the evaluations spent; relative: a fraction, None at first).
    assert isinstance(data["converged"], bool) and data["converged"] == result.converged
    last = data["last_improvement"]
    assert set(last) == {"evaluations", "seconds", "relative"}
    assert 1 <= last["evaluations"] <= result.evaluations
    assert 0 <= last["seconds"] <= result.elapsed_s + 0.05
    assert last["relative"] is None or 0 < last["relative"] <= 1
    assert (data["suggested_budget"] is None) == data["converged"]
    # A search with a final polish says whether it finished a pass, and where one would fit.
    assert ("polish_finished" in data) == name.startswith("hetrl")
    if "polish_finished" in data:
        assert isinstance(data["polish_finished"], bool)
        assert (data["polish_budget"] is None) == data["polish_finished"]
        if data["suggested_budget"] is not None and data["polish_budget"] is not None:
            assert data["suggested_budget"]["evaluations"] >= data["polish_budget"]["evaluations"]

    # Determinism: same seed, same evaluation budget -> same plan, the same count and the same
    # history (each improvement at the same evaluation, to the same seconds; only the wall-clock
    # times differ).
    second = get_scheduler(name).search(wl, cl, Budget(evaluations=BUDGET_EVALS, seed=3))
    assert second.plan == result.plan
    assert second.evaluations == result.evaluations
    assert second.estimate.iteration_s == est.iteration_s
    assert [h[1:] for h in second.history] == [h[1:] for h in result.history]


@pytest.mark.parametrize("name", ["hetrl", "deap", "random"])
def test_wall_clock_budget_is_respected(name, small_workload, small_cluster):
    t0 = time.perf_counter()
    result = get_scheduler(name).search(small_workload, small_cluster, Budget(seconds=2, seed=0))
    wall = time.perf_counter() - t0
    assert result.estimate.feasible
    assert result.evaluations > 1
    # These schedulers search until the budget is spent; they stop within a small tolerance.
    assert 1.9 <= result.elapsed_s <= wall
    assert wall < 4.0, f"{name} ran {wall:.2f} s on a 2 s budget"


@pytest.mark.parametrize("name", ALL)
def test_every_scheduler_plans_a_rule_reward_job(name, small_workload, small_cluster):
    """With a rule reward there is no reward model and no reward_inference task (fewer tasks
    than any preset): every scheduler still returns a valid plan of the tasks there are."""
    wl = small_workload.with_(reward="rule", models=tuple(
        (r, m) for r, m in small_workload.models if r != "reward"))
    result = get_scheduler(name).search(wl, small_cluster, Budget(evaluations=BUDGET_EVALS, seed=1))
    validate(result.plan, wl, small_cluster)
    assert {p.task for p in result.plan.placements} == set(wl.task_names)
    assert result.estimate.feasible and result.estimate.tasks["reward_inference"] == 0.0


@pytest.mark.parametrize("name", ALL)
def test_every_scheduler_keeps_recomputed_logprobs_with_the_trainer(name, small_workload,
                                                                    small_cluster):
    """recompute_logprobs adds actor_inference, which runs on the trainer's weights: every
    scheduler places it in actor_training's task group and prices it (> 0 s) -- with FSDP
    layouts in the space too (a workload file's default)."""
    wl = small_workload.with_(recompute_logprobs=True, backends=("megatron", "fsdp"))
    result = get_scheduler(name).search(wl, small_cluster, Budget(evaluations=BUDGET_EVALS, seed=1))
    validate(result.plan, wl, small_cluster)
    assert result.plan.group_of("actor_inference") == result.plan.group_of("actor_training")
    assert result.estimate.feasible and result.estimate.tasks["actor_inference"] > 0.0


@pytest.mark.parametrize("name", ALL)
def test_every_scheduler_keeps_to_what_a_framework_launches(name, small_workload,
                                                            small_cluster):
    """``launch`` (``hetrl plan --launch-with verl``): every scheduler, baselines included,
    returns a plan verl runs as it is (its export's closest plan is the plan itself)."""
    from hetrl.export.launchable import launchable_plan, projection

    wl, cl = small_workload.with_(framework="verl"), small_cluster
    result = get_scheduler(name).search(wl, cl, Budget(evaluations=BUDGET_EVALS, seed=3),
                                        launch=projection("verl", wl, cl))
    again = launchable_plan("verl", result.plan, wl, cl)
    assert (again.groups, again.placements) == (result.plan.groups, result.plan.placements)
    assert result.estimate.iteration_s == pytest.approx(
        CostModel(wl, cl).estimate(result.plan).iteration_s, rel=1e-9)
