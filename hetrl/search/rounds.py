"""The paper's nested successive halving, as jobs: a task grouping's arms (level 1, one arm
per GPU-group sizes: level 2), the inner halving over those arms with the grouping's share of a
round (:func:`halving_round`), and the runner that runs a round's jobs in this process or on a
process pool with budgets fixed before any runs, so both give the same plans
(hetrl/search/sha.py drives the rounds; docs/search.md, "Rounds")."""

from __future__ import annotations

import math
from typing import Any

from hetrl.cost.model import CostModel
from hetrl.search.base import Budget, BudgetExhausted, Evaluator
from hetrl.search.collector import hold_full_collections
from hetrl.search.ea import Arm
from hetrl.search.objective import TIME, Objective


class Level1:
    """One task grouping in the halving: its arms (one per GPU-group sizes)."""

    def __init__(self, grouping: tuple[tuple[str, ...], ...], arms: list[Arm], halve: bool):
        self.grouping = grouping
        self.arms = arms
        self.halve = halve

    @property
    def best(self) -> float:
        return min(a.best for a in self.arms)


def halving_rounds(count: int) -> int:
    """Rounds of a successive halving over ``count`` arms: halve until one is left, plus its
    last round (1 for a single arm)."""
    return 1 + math.ceil(math.log2(max(count, 1)))


def affordable(count: int, budget: float, need: float, least: int = 1) -> int:
    """How many of ``count`` arms a successive halving of ``budget`` evaluations can enter:
    the most whose first round still gives each arm ``need`` evaluations (Hyperband's r_min),
    at least ``least``."""
    n = count
    while n > least and budget / (halving_rounds(n) * n) < need:
        n -= 1
    return n


def halving_round(arms: list[Arm], budget: float, ev: Evaluator, halve: bool) -> list[Arm]:
    """Inner successive halving: spend ``budget`` evaluations over ``arms``. With more arms
    than rounds of one step each can serve (a grouping holding dozens of warm starts' arms),
    only the best-priced enter (the others are dropped): every arm's step per round would
    spend several times ``budget`` (docs/search-history.md, "The inner halving kept to its
    share")."""
    alive = list(arms)
    if halve:
        alive = sorted(alive, key=lambda a: a.best)[: affordable(len(alive), budget, 1)]
    rounds = halving_rounds(len(alive)) if halve else 1
    per_round = budget / rounds
    for _ in range(rounds):
        share = per_round / len(alive)
        for arm in alive:
            arm.run(ev, max(1, round(share)))
        if halve and len(alive) > 1:
            alive.sort(key=lambda a: a.best)
            alive = alive[: max(1, len(alive) // 2)]
    return alive


# --- one level-1 arm's round as a job (in this process or in a worker process) ---------------

_WORKER: dict[str, Any] = {}


def init_worker(workload, cluster, params) -> None:
    hold_full_collections()  # a worker process only searches (see hetrl/search/collector.py)
    _WORKER["model"] = CostModel(workload, cluster, params)


def job_cap(arms: list[Arm], budget: float, halve: bool) -> int:
    """Most evaluations one job may use: its share plus the rounding of its inner rounds (over
    the arms that enter them: :func:`halving_round`)."""
    n = affordable(len(arms), budget, 1) if halve else len(arms)
    return n * halving_rounds(n) + int(math.ceil(budget)) + 1


def level1_job(arms: list[Arm], budget: float, halve: bool, seconds_left: float | None,
               model: CostModel | None = None, cap: int | None = None,
               objective: Objective = TIME, launch: Any = None) -> dict[str, Any]:
    """Run one task grouping's inner halving with its own evaluation budget (so the result does
    not depend on where or in which order jobs run) and report what it found. ``cap`` bounds
    its evaluations (the global budget's remainder allotted to this job)."""
    model = model or _WORKER["model"]
    if cap is None:
        cap = job_cap(arms, budget, halve)
    if cap < 1:
        return {"arms": arms, "keep": list(range(len(arms))), "best": None, "evaluations": 0,
                "history": []}
    for arm in arms:
        arm.model = model
    local = Evaluator(model.workload, model.cluster,
                      Budget(seconds=seconds_left, evaluations=cap), model.params, model=model,
                      objective=objective, launch=launch)
    survivors = arms
    try:
        survivors = halving_round(arms, budget, local, halve)
    except BudgetExhausted:
        pass
    keep = [arms.index(a) for a in survivors]
    for arm in arms:
        arm.model = None
    return {"arms": arms, "keep": keep, "best": local.best, "evaluations": local.evaluations,
            "history": local.history}


class RoundRunner:
    """Runs level-1 jobs serially or on a process pool (``Budget.workers``)."""

    def __init__(self, ev: Evaluator, workers: int, deadline: float | None = None):
        self.ev = ev
        #: wall-clock second (from the search's start) at which the rounds end, if any
        self.deadline = deadline if deadline is not None else ev.budget.seconds
        self.pool = None
        if workers > 1:
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor

            self.pool = ProcessPoolExecutor(
                workers, mp_context=mp.get_context("spawn"), initializer=init_worker,
                initargs=(ev.workload, ev.cluster, ev.model.params))

    def _caps(self, jobs: list[tuple[Level1, float]]) -> list[int | None]:
        """Each job's evaluation cap, allotted in job order from what the global evaluation
        budget has left (fixed before any job runs, so serial and pooled runs agree and the
        total never exceeds the budget)."""
        b = self.ev.budget
        if b.evaluations is None:
            return [None] * len(jobs)
        left = b.evaluations - self.ev.evaluations
        caps: list[int | None] = []
        for l1, budget in jobs:
            cap = max(min(job_cap(l1.arms, budget, l1.halve), left), 0)
            caps.append(cap)
            left -= cap
        return caps

    def run(self, jobs: list[tuple[Level1, float]], halve: bool) -> None:
        ev = self.ev
        caps = self._caps(jobs)
        if self.pool is None:
            for (l1, budget), cap in zip(jobs, caps, strict=True):
                if ev.exhausted() or self.past_deadline():
                    break
                self._merge(l1, level1_job(l1.arms, budget, halve, self.seconds_left(),
                                           ev.model, cap, ev.objective, ev.launch))
            return
        left = self.seconds_left()  # (every pooled job starts now)
        futures = [self.pool.submit(level1_job, l1.arms, budget, halve, left, None, cap,
                                    ev.objective, ev.launch)
                   for (l1, budget), cap in zip(jobs, caps, strict=True)]
        for (l1, _), fut in zip(jobs, futures, strict=True):
            self._merge(l1, fut.result())

    def seconds_left(self) -> float | None:
        """Seconds from now to the rounds' deadline (at least a microsecond), None without one."""
        return None if self.deadline is None else max(self.deadline - self.ev.elapsed(), 1e-6)

    def past_deadline(self) -> bool:
        return self.deadline is not None and self.ev.elapsed() >= self.deadline

    def _merge(self, l1: Level1, out: dict[str, Any]) -> None:
        ev = self.ev
        l1.arms = out["arms"]
        for arm in l1.arms:
            arm.model = ev.model
        if l1.halve:
            l1.arms = [l1.arms[i] for i in out["keep"]]
        ev.absorb(out["best"], out["evaluations"])

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)
