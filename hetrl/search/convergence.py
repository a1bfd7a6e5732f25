"""Whether a search converged: did its best improve by 0.5% or more over the last half of its
budget? (``converged`` and ``last_improvement`` in ``hetrl plan``'s output; docs/search.md.)

The budget's axis is evaluations when the search ended on its evaluation budget (or had no
time limit), else seconds. The budget's half is half of the budget given, or of what was spent
where a scheduler spent more (the ILP prices every candidate). An unconverged search comes with
an estimate of the budget that would likely be enough: twice the point of the last improvement,
so that the last improvement falls in the first half (a rule of thumb: it assumes nothing better
is found after it, which no search can know).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
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

    def to_dict(self) -> dict[str, Any]:
        key = "evaluations" if self.axis == "evaluations" else "seconds"
        return {"converged": self.converged,
                "last_improvement": {"evaluations": self.evaluations, "seconds": self.seconds,
                                     "relative": self.relative},
                "suggested_budget": None if self.suggested is None else {key: self.suggested}}

    def line(self) -> str:
        """One line saying how the search ended (the text output's last line when unconverged)."""
        at = f"{self.evaluations:,} evaluations, {self.seconds:.1f} s"
        size = "" if self.relative is None else f", {100 * self.relative:.2f}% better,"
        if self.converged:
            return f"converged: the last improvement{size} came after {at}"
        hint = (f"--budget-evals {int(self.suggested):,}" if self.axis == "evaluations"
                else f"--budget-s {self.suggested:g}")
        return (f"not converged: the best still improved by {100 * TOLERANCE:g}% or more in the "
                f"last half of the budget (the last{size} after {at}); about {hint} would likely "
                f"be enough (an estimate: twice the point of the last improvement)")


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
