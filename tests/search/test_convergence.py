"""``converged`` and ``last_improvement``: the best improved by less than 0.5% over the last half
of the budget (evaluations, or seconds for a time budget), and the budget likely enough."""

from __future__ import annotations

import pytest

from hetrl.search.convergence import convergence


def test_an_improvement_in_the_last_half_means_not_converged():
    # (seconds, evaluations, fitness): 1% better after 800 of 1,000 evaluations
    c = convergence([(0.1, 1, 200.0), (1.0, 300, 100.0), (3.0, 800, 99.0)], 1000, 4.0, 1000, None)
    assert not c.converged and c.axis == "evaluations"
    assert (c.evaluations, c.seconds) == (800, 3.0)
    assert c.relative == pytest.approx(0.01)
    assert c.suggested == 1600  # twice the last improvement's evaluations
    d = c.to_dict()
    assert d["converged"] is False and d["suggested_budget"] == {"evaluations": 1600}
    assert d["last_improvement"] == {"evaluations": 800, "seconds": 3.0, "relative": c.relative}
    assert c.line().startswith("not converged") and "--budget-evals 1,600" in c.line()


def test_small_late_gains_still_count_as_converged():
    c = convergence([(0.1, 1, 200.0), (1.0, 300, 100.0), (3.0, 800, 99.6)], 1000, 4.0, 1000, None)
    assert c.converged and c.suggested is None and c.line().startswith("converged")


def test_the_first_plan_alone_has_no_relative_size():
    c = convergence([(0.1, 1, 50.0)], 1000, 4.0, 1000, None)
    assert c.converged and c.relative is None


def test_a_time_budget_is_halved_in_seconds():
    points = [(0.1, 1, 200.0), (4.0, 100, 150.0), (6.0, 900, 149.9)]
    late = convergence(points[:2], 1000, 10.0, None, 10.0)  # 25% better at 4 s of 10 s
    assert late.converged and late.axis == "seconds"
    c = convergence(points[:2], 1000, 6.0, None, 6.0)  # the same gain at 4 s of 6 s
    assert not c.converged and c.suggested == 8
    assert "--budget-s 8" in c.line()


def test_an_unfinished_polish_keeps_converged_and_says_which_budget_finishes_a_pass():
    # nothing gained in the last half, but the search's final polish was in its first pass
    c = convergence([(0.1, 1, 80.0), (6.3, 1236, 66.18)], 3000, 20.0, 3000, None)
    assert c.converged
    d = c.with_polish(False, 7_512_345, rate=150.0)
    assert d.converged and d.suggested is None  # the rule's verdict stands
    assert (d.polish_finished, d.polish_budget) == (False, 7_600_000)  # two figures, up
    assert d.to_dict()["polish_finished"] is False
    assert d.to_dict()["polish_budget"] == {"evaluations": 7_600_000}
    assert d.line().startswith("converged") and "had not finished a pass" in d.line()
    assert "--budget-evals 7,600,000" in d.line() and "may still find better" in d.line()
    # a finished polish changes nothing but says so
    done = c.with_polish(True, None, rate=150.0)
    assert done.polish_finished and done.line() == c.line()
    assert done.to_dict()["polish_budget"] is None
    # a search without a polish says nothing of one
    assert "polish_finished" not in c.to_dict()


def test_an_unconverged_search_suggests_at_least_the_budget_a_polish_pass_needs():
    c = convergence([(0.1, 1, 200.0), (1.0, 300, 100.0), (3.0, 800, 99.0)], 1000, 4.0, 1000, None)
    d = c.with_polish(False, 29_000, rate=250.0)
    assert not d.converged and d.suggested == 29_000 > c.suggested
    assert "--budget-evals 29,000" in d.line() and "where a polish pass fits" in d.line()
    # on a seconds axis the budget goes through the rate: 29,000 / 250 per s = 116 s -> 120 s
    t = convergence([(0.1, 1, 200.0), (4.0, 100, 150.0)], 1000, 6.0, None, 6.0)
    assert t.with_polish(False, 29_000, rate=250.0).suggested == 120
    # a suggestion above the pass's budget stays
    assert c.with_polish(False, 100, rate=250.0).suggested == c.suggested
