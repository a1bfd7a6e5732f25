"""Pricing a neighbourhood together changes nothing a search does: the same plan, history and
evaluation count as pricing each candidate alone (Evaluator.evaluate one by one), and the
budget is charged per candidate taken."""

from __future__ import annotations

import pytest

from hetrl.search import Budget, get_scheduler
from hetrl.search.base import BudgetExhausted, Evaluator


def _one_by_one(self, plans):
    for plan in plans:
        yield self.evaluate(plan)


@pytest.mark.parametrize("evaluations", [700, 4000])
def test_search_as_one_by_one(monkeypatch, ppo8b, paper_clusters, evaluations):
    cluster = paper_clusters["multi-country"]
    budget = Budget(evaluations=evaluations, seed=3)
    together = get_scheduler("hetrl").search(ppo8b, cluster, budget)
    monkeypatch.setattr(Evaluator, "evaluate_many", _one_by_one)
    alone = get_scheduler("hetrl").search(ppo8b, cluster, budget)
    assert together.plan.placements == alone.plan.placements
    assert together.evaluations == alone.evaluations == evaluations
    assert [h[1:] for h in together.history] == [h[1:] for h in alone.history]


def test_charged_per_candidate_taken(ppo8b, a100x8):
    from hetrl.plan import colocated_plan

    plans = [colocated_plan(ppo8b, a100x8, tp=t) for t in (1, 2, 4, 8)]
    ev = Evaluator(ppo8b, a100x8, Budget(evaluations=3))
    priced = ev.evaluate_many(plans)
    first = next(priced)
    assert ev.evaluations == 1  # the four were priced, one was taken
    assert first == ev.fitness(ev.model.estimate(plans[0]), plans[0])
    assert ev.best is not None and ev.best[1] is plans[0]
    next(priced), next(priced)
    assert ev.evaluations == 3
    with pytest.raises(BudgetExhausted):
        next(priced)
    assert ev.evaluations == 3
