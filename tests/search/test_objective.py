"""``--objective cost``, ``--max-dollars-per-hour``, ``--deadline-s`` and ``--charge-used-only``
in the schedulers that take them (hetrl, hetrl-simple, ilp); the baselines refuse them."""

from __future__ import annotations

import json

import pytest

from hetrl.cost.model import CostModel
from hetrl.cost.money import money
from hetrl.errors import InfeasibleError, OptionError, SpecError
from hetrl.plan import validate
from hetrl.search import SCHEDULERS, Budget, get_scheduler, load_all
from hetrl.search.objective import Objective
from tests.cli_helpers import assert_user_error, run

load_all()
TAKES = sorted(n for n, c in SCHEDULERS.items() if c.objectives)
BUDGET = Budget(evaluations=300, seed=1)


def dollars(wl, cl, result, used_only=True):
    return money(CostModel(wl, cl), result.plan, result.estimate.iteration_s, used_only)


def test_which_schedulers_take_an_objective():
    assert TAKES == ["hetrl", "hetrl-simple", "ilp"]


@pytest.mark.parametrize("name", TAKES)
def test_cost_objective_contract(name, small_workload, small_cluster):
    obj = Objective("cost", charge_used_only=True)
    a = get_scheduler(name, objective=obj).search(small_workload, small_cluster, BUDGET)
    validate(a.plan, small_workload, small_cluster)
    assert a.estimate.feasible and a.extra["objective"] == "cost"
    b = get_scheduler(name, objective=obj).search(small_workload, small_cluster, BUDGET)
    assert a.plan.to_dict() == b.plan.to_dict()  # same seed and budget: same plan


@pytest.mark.parametrize("name", TAKES)
def test_cost_plan_is_cheaper_and_time_plan_faster_on_two_regions(name, small_workload,
                                                                   small_cluster):
    """4 A100 in Virginia + 4 L40S in Ohio, GPUs used charged (a guarantee by construction:
    see test_objectives_agree_with_themselves)."""
    wl, cl = small_workload, small_cluster
    t = get_scheduler(name, objective=Objective("time", charge_used_only=True)).search(
        wl, cl, BUDGET)
    c = get_scheduler(name, objective=Objective("cost", charge_used_only=True)).search(
        wl, cl, BUDGET)
    assert dollars(wl, cl, c).dollars_per_1k_samples <= dollars(wl, cl, t).dollars_per_1k_samples
    assert t.estimate.iteration_s <= c.estimate.iteration_s


@pytest.mark.parametrize("used_only", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_objectives_agree_with_themselves(seed, used_only, small_workload, small_cluster):
    """Same budget and seed: the cost objective's plan costs no more than the time objective's,
    the time objective's is no slower than the cost objective's, and a limit never returns a plan
    worse than the plain search's when that one is within the limit (docs/search.md)."""
    wl, cl, budget = small_workload, small_cluster, Budget(evaluations=150, seed=seed)

    def search(kind, cap=None, deadline=None):
        r = get_scheduler("hetrl", objective=Objective(kind, cap, deadline, used_only)).search(
            wl, cl, budget, compare_objectives=True)
        return r, r.estimate.iteration_s, dollars(wl, cl, r, used_only)

    t, t_s, t_m = search("time")
    c, c_s, c_m = search("cost")
    assert c_m.dollars_per_1k_samples <= t_m.dollars_per_1k_samples
    assert t_s <= c_s
    assert set(t.extra["objectives_compared"]) == {"cost"}
    # a deadline the plain cost plan meets: the limited search's plan costs no more
    _, d_s, d_m = search("cost", deadline=c_s * 1.01)
    assert d_s <= c_s * 1.01 and d_m.dollars_per_1k_samples <= c_m.dollars_per_1k_samples
    # a cap the plain time plan keeps: the limited search's plan is no slower
    _, k_s, k_m = search("time", cap=t_m.dollars_per_hour * 1.01)
    assert k_m.dollars_per_hour <= t_m.dollars_per_hour * 1.01 and k_s <= t_s


@pytest.mark.parametrize("name", TAKES)
def test_limits_are_kept(name, small_workload, small_cluster):
    wl, cl = small_workload, small_cluster
    free = get_scheduler(name).search(wl, cl, BUDGET)
    rate = dollars(wl, cl, free).dollars_per_hour
    cap = 0.6 * rate
    r = get_scheduler(name, objective=Objective("time", cap, None, True)).search(wl, cl, BUDGET)
    assert dollars(wl, cl, r).dollars_per_hour <= cap
    deadline = 1.5 * free.estimate.iteration_s
    r = get_scheduler(name, objective=Objective("cost", None, deadline, True)).search(
        wl, cl, BUDGET)
    assert r.estimate.iteration_s <= deadline


def test_limits_no_plan_meets_are_refused_naming_them(small_workload, small_cluster):
    with pytest.raises(InfeasibleError, match="--deadline-s 0.001: infeasible"):
        get_scheduler("hetrl", objective=Objective("time", None, 0.001)).search(
            small_workload, small_cluster, Budget(evaluations=50))
    # idle GPUs charged: a cap below the whole cluster's price is refused before searching
    with pytest.raises(InfeasibleError, match="--max-dollars-per-hour 1: infeasible"):
        get_scheduler("ilp", objective=Objective("cost", 1.0)).search(
            small_workload, small_cluster, Budget(evaluations=50))


@pytest.mark.parametrize("name", sorted(set(SCHEDULERS) - set(TAKES)))
def test_baselines_refuse_an_objective(name):
    with pytest.raises(OptionError, match="optimises time per iteration by its published"):
        get_scheduler(name, objective=Objective("cost"))
    with pytest.raises(OptionError, match="--deadline-s"):
        get_scheduler(name, objective=Objective("time", None, 10.0))


def test_bad_objective_values():
    for args, field in ((("money",), "--objective"), (("cost", -1.0), "--max-dollars-per-hour"),
                        (("cost", None, 0.0), "--deadline-s")):
        with pytest.raises(SpecError, match=field):
            Objective(*args)


def test_cli_plan_objective(tmp_path, capsys):
    base = ["plan", "-w", "qwen3-4b-grpo-sync", "-c", "hetero8-two-region", "--budget-evals",
            "100", "-o", tmp_path / "p.json"]
    code, out, err = run(capsys, *base, "--objective", "cost", "--charge-used-only", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["objective"] == "cost" and data["charge_used_only"]
    assert data["dollars_per_1k_samples"] > 0 and "cross_region_bytes" in data
    code, _, err = run(capsys, *base, "-s", "verl", "--objective", "cost")
    assert_user_error(code, err, "--scheduler", "verl", "published design", command="plan")
    code, _, err = run(capsys, *base, "--max-dollars-per-hour", "1")
    assert_user_error(code, err, "--max-dollars-per-hour 1: infeasible", command="plan")
    code, _, err = run(capsys, *base, "--deadline-s", "-3")
    assert_user_error(code, err, "--deadline-s", command="plan")


def test_schedulers_compared_alone_keep_their_budget(small_workload, small_cluster):
    """Without compare_objectives (the figures' comparisons of schedulers) no other objective's
    search runs: the budget is the scheduler's alone."""
    r = get_scheduler("hetrl").search(small_workload, small_cluster,
                                      Budget(evaluations=150, seed=0))
    assert "objectives_compared" not in r.extra and r.evaluations <= 150
