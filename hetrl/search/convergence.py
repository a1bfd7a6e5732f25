"""Whether a search converged: did its best improve by 0.5% or more over the last half of its
budget? (``converged`` and ``last_improvement`` in ``hetrl plan``'s output; docs/search.md.)

The budget's axis is evaluations when the search ended on its evaluation budget (or had no
time limit), else seconds. The budget's half is half of the budget given, or of what was spent
where a scheduler spent more (the ILP prices every candidate). An unconverged search comes with
an estimate of the budget that would likely be enough: twice the point of the last improvement,
so that the last improvement falls in the first half (a rule of thumb: it assumes nothing better
is found after it, which no search can know).

A search that reports its own unfinished work narrows the one-sided rule: SHA-EA says whether
its final polish finished a pass on every finalist it kept (``polish_finished``) and the budget
at which a pass fits its final phase. A search whose last half gained nothing because its
polish was still in its first pass (on 1,024 GPUs at a few thousand evaluations: docs/search.md)
keeps ``converged`` as defined, and its line says that a pass had not finished and which budget
would let one; an unconverged one suggests at least that budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

#: converged: the best improved by less than this fraction over the last half of the budget
TOLERANCE = 0.005


@dataclass(frozen=True)
class Convergence:
    """``converged``; the last improvement (``evaluations``, ``seconds`` since the search
    started, ``relative``: its size as a fraction of the previous best, None for the first plan);
    ``axis``: "evaluations" or "seconds"; ``suggested``: the estimated budget on that axis that
    would likely be enough (None when converged)."""

    converged: bool
    evaluations: int
    seconds: float
    relative: float | None
    axis: str
    suggested: float | None
    #: whether the search's final polish finished a pass on every finalist it kept (None: the
    #: search has no polish, or did not say)
    polish_finished: bool | None = None
    #: with ``polish_finished`` False: the budget on ``axis`` at which a pass would fit
    polish_budget: float | None = None

    def to_dict(self) -> dict[str, Any]:
        key = "evaluations" if self.axis == "evaluations" else "seconds"
        out = {"converged": self.converged,
               "last_improvement": {"evaluations": self.evaluations, "seconds": self.seconds,
                                    "relative": self.relative},
               "suggested_budget": None if self.suggested is None else {key: self.suggested}}
        if self.polish_finished is not None:
            out["polish_finished"] = self.polish_finished
            out["polish_budget"] = (None if self.polish_budget is None
                                    else {key: self.polish_budget})
        return out

    def with_polish(self, finished: bool, budget_evaluations: int | None,
                    rate: float) -> Convergence:
        """This verdict with the search's own word on its polish: ``finished``, and the
        evaluation budget at which a pass fits its final phase (``rate``: evaluations a
        second, to put it on a seconds axis). An unconverged search's suggestion becomes at
        least that budget."""
        if finished or budget_evaluations is None:
            return replace(self, polish_finished=finished)
        at = _round_up(budget_evaluations if self.axis == "evaluations"
                       else budget_evaluations / max(rate, 1e-9))
        if self.axis == "evaluations":
            at = int(at)
        suggested = None if self.converged else max(self.suggested or 0, at)
        return replace(self, polish_finished=False, polish_budget=at, suggested=suggested)

    def line(self) -> str:
        """One line saying how the search ended (the text output's last line when unconverged)."""
        at = f"{self.evaluations:,} evaluations, {self.seconds:.1f} s"
        size = "" if self.relative is None else f", {100 * self.relative:.2f}% better,"
        polish = ("" if self.polish_finished is not False else
                  "; the final polish had not finished a pass" + (
                      "" if self.polish_budget in (None, self.suggested)
                      else f" (one fits at about {self._flag(self.polish_budget)})"))
        if self.converged:
            return (f"converged: the last improvement{size} came after {at}{polish}"
                    + (", so a larger budget may still find better" if polish else ""))
        why = ("twice the point of the last improvement" if self.suggested != self.polish_budget
               else "where a polish pass fits")
        return (f"not converged: the best still improved by {100 * TOLERANCE:g}% or more in the "
                f"last half of the budget (the last{size} after {at}){polish}; about "
                f"{self._flag(self.suggested)} would likely be enough (an estimate: {why})")

    def _flag(self, budget: float) -> str:
        """``budget`` as the ``hetrl plan`` flag that asks for it."""
        return (f"--budget-evals {int(budget):,}" if self.axis == "evaluations"
                else f"--budget-s {budget:g}")


def _round_up(x: float) -> float:
    """``x`` rounded up to two significant figures."""
    if x <= 0:
        return x
    step = 10 ** max(math.floor(math.log10(x)) - 1, 0)
    return math.ceil(x / step) * step


def convergence(improvements: list[tuple[float, int, float]], evaluations: int,
                elapsed: float, budget_evaluations: int | None,
                budget_seconds: float | None) -> Convergence:
    """From the (seconds, evaluations, fitness) points at which the best improved (fitness:
    what the search minimises, lower is better) and the budget given and spent."""
    by_evals = budget_seconds is None or (budget_evaluations is not None
                                          and evaluations >= budget_evaluations)
    if by_evals:
        axis, index, total = "evaluations", 1, max(budget_evaluations or 0, evaluations)
    else:
        axis, index, total = "seconds", 0, max(budget_seconds, elapsed)
    if not improvements:
        return Convergence(False, evaluations, elapsed, None, axis, None)
    last_s, last_e, last_f = improvements[-1]
    prev = improvements[-2][2] if len(improvements) > 1 else None
    relative = (None if prev is None or not math.isfinite(prev) or prev <= 0
                else (prev - last_f) / prev)
    half = total / 2
    before = [p[2] for p in improvements if p[index] <= half]
    at_half = before[-1] if before else math.inf
    converged = math.isfinite(at_half) and (at_half - last_f) < TOLERANCE * abs(at_half)
    suggested = None
    if not converged:
        point = last_e if by_evals else last_s
        suggested = _round_up(2 * point)
        if by_evals:
            suggested = int(max(suggested, 1))
    return Convergence(converged, last_e, last_s, relative, axis, suggested)
