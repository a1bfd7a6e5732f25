"""Scheduler contract: ``search(workload, cluster, budget) -> SearchResult``; one registry.

A :class:`Budget` is wall-clock seconds and/or cost-model evaluations, plus a seed. With an
evaluation budget (and no time limit) the search is deterministic: same seed, same plan.
"""

from __future__ import annotations

import copy
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from hetrl.cost.kernels import warm_up
from hetrl.cost.model import CostModel, Estimate
from hetrl.cost.neighbourhood import price_plans
from hetrl.cost.params import DEFAULT_PARAMS, CostParams
from hetrl.errors import HetrlError, InfeasibleError, SpecError, require
from hetrl.fingerprint import made_for
from hetrl.plan import Plan, Provenance
from hetrl.search.convergence import Convergence, convergence
from hetrl.search.objective import CONSTRAINT_PENALTY, TIME, Objective
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.workload import WorkloadSpec

INFEASIBLE_PENALTY_S = 1e6
#: Fitness of a plan the framework of ``--launch-with`` cannot run: after every plan it can.
UNLAUNCHABLE_PENALTY_S = 10 * INFEASIBLE_PENALTY_S


@dataclass(frozen=True)
class Budget:
    """``seconds`` of wall-clock and/or ``evaluations`` of the cost model (whichever ends first);
    ``workers`` processes where a scheduler can use them."""

    seconds: float | None = None
    evaluations: int | None = None
    seed: int = 0
    workers: int = 1
    progress: bool = False

    def __post_init__(self) -> None:
        require(self.seconds is not None or self.evaluations is not None, "budget", None,
                "give --budget-s and/or --budget-evals")
        if self.seconds is not None:
            require(self.seconds > 0, "budget.seconds", self.seconds, "must be > 0")
        if self.evaluations is not None:
            require(self.evaluations >= 1, "budget.evaluations", self.evaluations, "must be >= 1")
        require(self.workers >= 1, "budget.workers", self.workers, "must be >= 1")


@dataclass(frozen=True)
class SearchResult:
    """The best plan found, its estimate, the convergence history: (elapsed seconds,
    evaluations, best iteration seconds so far) points, and whether the search converged
    (:mod:`hetrl.search.convergence`)."""

    scheduler: str
    plan: Plan
    estimate: Estimate
    evaluations: int
    elapsed_s: float
    history: tuple[tuple[float, int, float], ...]
    extra: dict[str, Any] = field(default_factory=dict)
    convergence: Convergence | None = None

    @property
    def converged(self) -> bool:
        return self.convergence is not None and self.convergence.converged

    def to_dict(self) -> dict[str, Any]:
        return {
            "scheduler": self.scheduler,
            "iteration_s": self.estimate.iteration_s,
            "throughput_samples_per_s": self.estimate.throughput_samples_per_s,
            "throughput_tokens_per_s": self.estimate.throughput_tokens_per_s,
            "feasible": self.estimate.feasible,
            "evaluations": self.evaluations,
            "elapsed_s": self.elapsed_s,
            "history": [list(h) for h in self.history],
            **(self.convergence.to_dict() if self.convergence is not None else {}),
            **self.extra,
        }


def time_fitness(iteration_s: float, feasible: bool) -> float:
    """The plain-time fitness of a plan: its seconds per iteration; a plan that does not fit
    ranks after every one that does (``INFEASIBLE_PENALTY_S`` added)."""
    return iteration_s if feasible else INFEASIBLE_PENALTY_S + iteration_s


class BudgetExhausted(Exception):
    """Raised inside a search when the budget is spent; the evaluator keeps the best plan."""


class Evaluator:
    """Counts evaluations against the budget, keeps the best plan and the history."""

    def __init__(self, workload: WorkloadSpec, cluster: ClusterSpec, budget: Budget,
                 params: CostParams = DEFAULT_PARAMS, model: CostModel | None = None,
                 objective: Objective = TIME, launch: Callable[[Plan], Plan] | None = None):
        self.workload, self.cluster, self.budget = workload, cluster, budget
        self.objective = objective
        #: maps a proposed plan to the plan a framework launches from it (SpecError: none);
        #: with it every evaluation prices, and the best holds, launchable plans only
        #: (``hetrl plan --launch-with``: hetrl.export.launchable)
        self.launch = launch
        self._launched: dict[Plan, Plan | None] = {}
        self.model = model or CostModel(workload, cluster, params)
        warm_up()  # the compiled kernels' one-time start, not the search's time
        self.start = time.perf_counter()
        self.evaluations = 0
        self._partial = 0.0
        self.best: tuple[float, Plan, Estimate] | None = None
        self.history: list[tuple[float, int, float]] = []
        #: (elapsed seconds, evaluations, fitness) whenever the best improved
        self.improvements: list[tuple[float, int, float]] = []
        self._given = budget  # a scheduler may narrow ``budget`` (the ILP's final estimate)
        self._bar = None
        if budget.progress:
            from tqdm import tqdm

            total = budget.evaluations or None
            self._bar = tqdm(total=total, unit="eval", desc="search", leave=False,
                             mininterval=0.5)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def exhausted(self) -> bool:
        b = self.budget
        if b.evaluations is not None and self.evaluations >= b.evaluations:
            return True
        return b.seconds is not None and self.elapsed() >= b.seconds

    def remaining_fraction(self) -> float:
        """Share of the budget left (the tighter of evaluations and time)."""
        b = self.budget
        fr = 1.0
        if b.evaluations is not None:
            fr = min(fr, 1 - self.evaluations / b.evaluations)
        if b.seconds is not None:
            fr = min(fr, 1 - self.elapsed() / b.seconds)
        return max(fr, 0.0)

    def fitness(self, est: Estimate, plan: Plan | None = None) -> float:
        """Seconds per iteration (or what ``objective`` minimises, which needs ``plan``:
        hetrl/search/objective.py); infeasible plans rank after every feasible one."""
        if not est.feasible or self.objective.is_plain_time:
            return time_fitness(est.iteration_s, est.feasible)
        return self.objective.fitness(self.model, plan, est)

    def charge(self, evaluations: float) -> None:
        """Count part of an evaluation spent outside :meth:`evaluate` (e.g. pricing one task
        alone); raises BudgetExhausted when the budget is spent."""
        if self.exhausted():
            raise BudgetExhausted
        self._partial += evaluations
        whole = int(self._partial)
        if whole:
            self._partial -= whole
            self.evaluations += whole

    def evaluate(self, plan: Plan) -> float:
        """Estimate ``plan`` (one evaluation of the budget) and return its fitness."""
        if self.exhausted():
            raise BudgetExhausted
        if self.launch is not None:
            launched = self._launchable(plan)
            if launched is None:  # (counted: the search spent a proposal on it)
                self.evaluations += 1
                if self._bar is not None:
                    self._bar.update(1)
                return UNLAUNCHABLE_PENALTY_S
            plan = launched
        est = self.model.estimate(plan, check=False)
        f = self.fitness(est, plan)
        self._charged(f, plan, est)
        return f

    def evaluate_many(self, plans: Sequence[Plan]) -> Iterator[float]:
        """The fitness of each of ``plans``, as :meth:`evaluate` one after another would say
        and charge them: a generator that prices them together on its first step (the
        neighbourhood pricer, :func:`~hetrl.cost.neighbourhood.price_plans`), then charges one
        evaluation per fitness it hands out (a caller that stops early pays for what it took;
        the budget is looked at before each). With ``--launch-with`` or an objective other
        than plain time, :meth:`evaluate` one by one."""
        if self.launch is not None or not self.objective.is_plain_time:
            for plan in plans:
                yield self.evaluate(plan)
            return
        if self.exhausted():
            raise BudgetExhausted
        for plan, brief in zip(plans, price_plans(self.model, plans), strict=True):
            if self.exhausted():
                raise BudgetExhausted
            f = time_fitness(brief.iteration_s, brief.feasible)
            est = None
            if self.best is None or f < self.best[0]:  # the best keeps its whole estimate
                est = self.model.estimate(plan, check=False)
                if self.fitness(est, plan) != f:
                    raise RuntimeError(f"the neighbourhood pricer's fitness {f!r} differs from "
                                       f"the estimate's {self.fitness(est, plan)!r}")
            self._charged(f, plan, est)
            yield f

    def _charged(self, f: float, plan: Plan, est: Estimate | None) -> None:
        """One evaluation of ``plan``, of fitness ``f``: counted, kept as the best if it is
        (``est`` its estimate, given whenever it is the best), shown on the progress bar."""
        self.evaluations += 1
        if self.best is None or f < self.best[0]:
            assert est is not None
            self.best = (f, plan, est)
            self._improved(f, est)
            if self._bar is not None:
                self._bar.set_postfix(best_s=f"{est.iteration_s:.2f}" if est.feasible
                                      else "infeasible")
        if self._bar is not None:
            self._bar.update(1)

    def _launchable(self, plan: Plan) -> Plan | None:
        """``launch(plan)`` (memoised), None where the framework cannot run it."""
        try:
            return self._launched[plan]
        except KeyError:
            pass
        try:
            out = self.launch(plan)
        except SpecError:
            out = None
        if len(self._launched) < 100_000:
            self._launched[plan] = out
        return out

    def adopt(self, best: tuple[float, Plan, Estimate]) -> None:
        """Make ``best`` (fitness, plan, estimate) the best, found elsewhere (another
        objective's search): it counts as an improvement now."""
        self.best = best
        self._improved(best[0], best[2])

    def _improved(self, f: float, est: Estimate) -> None:
        at = self.elapsed()
        self.history.append((at, self.evaluations, est.iteration_s if est.feasible
                             else float("inf")))
        self.improvements.append((at, self.evaluations, f))

    def convergence(self) -> Convergence:
        b = self._given
        return convergence(self.improvements, self.evaluations, self.elapsed(), b.evaluations,
                           b.seconds)

    def absorb(self, best: tuple[float, Plan, Estimate] | None, evaluations: int) -> None:
        """Count ``evaluations`` made elsewhere (a worker) and keep their best plan."""
        self.evaluations += evaluations
        if best is not None and (self.best is None or best[0] < self.best[0]):
            self.best = best
            self._improved(best[0], best[2])

    def result(self, name: str, extra: dict[str, Any] | None = None) -> SearchResult:
        if self._bar is not None:
            self._bar.close()
        if self.best is None and self.launch is not None and self.evaluations:
            raise InfeasibleError(
                f"{name}: the framework launches none of the {self.evaluations} plans the "
                "search proposed (its export refuses each: e.g. its pools need the same GPUs "
                "on every node, or the batch does not split over its data-parallel ranks)")
        if self.best is None:
            raise HetrlError(f"{name}: the budget allowed no evaluation")
        f, plan, est = self.best
        if not est.feasible:
            raise InfeasibleError(
                f"{name}: no feasible plan found in {self.evaluations} evaluations; the best "
                f"still breaks memory: {est.violations[0]}"
                + (f" (and {len(est.violations) - 1} more)" if len(est.violations) > 1 else ""))
        obj = self.objective
        m = obj.money(self.model, plan, est) if not obj.is_plain_time else None
        if f >= CONSTRAINT_PENALTY:
            raise InfeasibleError(
                f"{name}: {obj.limits()}: infeasible: no plan within them found in "
                f"{self.evaluations} evaluations; the nearest: {est.iteration_s:.2f} s per "
                f"iteration at ${m.dollars_per_hour:,.2f}/h"
                + ("" if obj.charge_used_only else " (idle GPUs charged; --charge-used-only "
                   "lets a plan leave GPUs unrented)"))
        plan = replace(plan, provenance=Provenance(scheduler=name, seed=self.budget.seed,
                                                   note=f"{self.evaluations} evaluations"),
                       made_for=made_for(self.workload, self.cluster))
        history = tuple(self.history) + ((self.elapsed(), self.evaluations, est.iteration_s),)
        extra = dict(extra or {})
        if not obj.is_plain_time:
            extra.update(obj.to_dict())
        verdict = self.convergence()
        if "polish_finished" in extra:  # the search's own word on its unfinished work
            verdict = verdict.with_polish(extra.pop("polish_finished"),
                                          extra.pop("polish_budget", None),
                                          self.evaluations / max(self.elapsed(), 1e-9))
        return SearchResult(name, plan, est, self.evaluations, self.elapsed(), history, extra,
                            verdict)


class Scheduler(ABC):
    """A search algorithm over plans. Subclasses set ``name``, ``Options`` (a frozen dataclass
    of their documented options, see :mod:`hetrl.search.options`) and implement :meth:`run`."""

    name: ClassVar[str]
    description: ClassVar[str] = ""
    #: the options' dataclass; None: options kept as a plain dict (not checked)
    Options: ClassVar[type | None] = None
    #: whether it takes ``Objective`` other than plain time (``--objective cost``, limits);
    #: the baselines search by the objective of their published design
    objectives: ClassVar[bool] = False

    def __init__(self, params: CostParams = DEFAULT_PARAMS, objective: Objective = TIME,
                 **options: Any):
        from hetrl.errors import OptionError
        from hetrl.search.options import parse_options

        self.params = params
        if not objective.is_plain_time and not self.objectives:
            flag = "--objective" if objective.kind != "time" else objective.limits().split()[0]
            takes = ", ".join(sorted(n for n, c in SCHEDULERS.items() if c.objectives))
            raise OptionError("--scheduler", self.name,
                              f"takes no {flag}: it optimises time per iteration by its "
                              f"published design; schedulers that take {flag}: {takes}")
        self.objective = objective
        self.options = (options if self.Options is None
                        else parse_options(self.Options, self.name, options))

    def search(self, workload: WorkloadSpec, cluster: ClusterSpec, budget: Budget, *,
               compare_objectives: bool = False,
               launch: Callable[[Plan], Plan] | None = None) -> SearchResult:
        """Search with :attr:`objective`. With ``compare_objectives`` (``hetrl plan`` asks for
        it) and an evaluation budget alone, a scheduler that takes objectives also runs the
        plain time and cost searches of the same budget and seed (:meth:`companions`) and
        returns the best of the plans all of them returned, ranked by :attr:`objective` -- so
        that the objectives agree with themselves (docs/search.md, "Objectives that agree"), at
        up to three times the evaluations (reported). Off by default: comparisons of schedulers
        (the figures) give every scheduler the same budget. ``launch``: price each proposed plan as
        the plan a framework launches from it (:class:`Evaluator`)."""
        from hetrl.search.feasibility import check_fits

        check_fits(workload, cluster)
        self.objective.check(cluster)
        ev, extra = self._search(self, workload, cluster, budget, launch)
        compared: dict[str, Any] = {}
        for objective in self.companions(cluster, budget) if compare_objectives else ():
            other = copy.copy(self)
            other.objective = objective
            try:
                oev, _ = self._search(other, workload, cluster, budget, launch)
            except HetrlError:
                continue  # (a companion that finds nothing adds nothing)
            if oev.best is None or not oev.best[2].feasible:
                continue
            _, plan, est = oev.best
            f = ev.fitness(est, plan)
            compared[objective.kind] = {"evaluations": oev.evaluations,
                                        "iteration_s": est.iteration_s,
                                        "fitness": f}
            if ev.best is None or f < ev.best[0]:  # ties: the search's own plan
                ev.adopt((f, plan, est))
                extra["found_by"] = f"{objective.kind} objective's search"
        if compared:
            extra["objectives_compared"] = compared
        return ev.result(self.name, extra)

    def companions(self, cluster: ClusterSpec, budget: Budget) -> list[Objective]:
        """The plain searches whose plans :meth:`search` compares with its own: time, and cost
        where every GPU type has a price, but the search's own objective; none for schedulers
        without objectives or with a time budget (the guarantee is for deterministic budgets,
        and a time budget would be overrun)."""
        if not self.objectives or budget.seconds is not None:
            return []
        from hetrl.cost.money import hourly_gpu_dollars

        used_only = self.objective.charge_used_only
        out = [Objective("time", charge_used_only=used_only)]
        if not hourly_gpu_dollars(cluster)[1]:
            out.append(Objective("cost", charge_used_only=used_only))
        return [o for o in out if o != self.objective
                and not (o.is_plain_time and self.objective.is_plain_time)]

    @staticmethod
    def _search(scheduler: Scheduler, workload: WorkloadSpec, cluster: ClusterSpec,
                budget: Budget, launch: Callable[[Plan], Plan] | None = None
                ) -> tuple[Evaluator, dict[str, Any]]:
        """Run ``scheduler`` until ``budget`` is spent: its evaluator and what it reports."""
        from hetrl.search.collector import full_collections_held

        ev = Evaluator(workload, cluster, budget, scheduler.params,
                       objective=scheduler.objective, launch=launch)
        extra: dict[str, Any] = {}
        with full_collections_held():  # a search's memos make full collections costly
            try:
                extra = scheduler.run(ev) or {}
            except BudgetExhausted:
                pass
        return ev, extra

    @abstractmethod
    def run(self, ev: Evaluator) -> dict[str, Any] | None:
        """Search until the budget is spent (``ev.evaluate`` raises BudgetExhausted) or done."""


SCHEDULERS: dict[str, type[Scheduler]] = {}


def register(cls: type[Scheduler]) -> type[Scheduler]:
    """Class decorator: add a scheduler to the registry (names are unique)."""
    if cls.name in SCHEDULERS:
        raise RuntimeError(f"duplicate scheduler {cls.name!r}")
    SCHEDULERS[cls.name] = cls
    return cls


def get_scheduler(name: str, params: CostParams = DEFAULT_PARAMS, objective: Objective = TIME,
                  **options: Any) -> Scheduler:
    from hetrl.search import load_all

    load_all()
    if name not in SCHEDULERS:
        raise SpecError("scheduler", name, f"unknown; known: {', '.join(sorted(SCHEDULERS))}")
    return SCHEDULERS[name](params, objective, **options)

