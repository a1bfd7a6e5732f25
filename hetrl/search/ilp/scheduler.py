"""The scheduler registered as ``ilp``: price the candidates, solve, estimate the plan found."""

from __future__ import annotations

from typing import Any

from hetrl.search.base import Evaluator, Scheduler, register
from hetrl.search.ilp.data import candidates, prune_dominated
from hetrl.search.ilp.model import NoSolution, greedy_fallback, plan_from
from hetrl.search.ilp.monolithic import solve
from hetrl.search.ilp.phased import solve_staged, stages_of
from hetrl.search.options import ILPOptions

#: With only an evaluation budget, the solver's deterministic-time limit per evaluation (about
#: what one SHA-EA evaluation costs, so that budgets compare).
EVAL_DETERMINISTIC_S = 0.005


@register
class ILPScheduler(Scheduler):
    """Options: :class:`hetrl.search.options.ILPOptions`."""

    name = "ilp"
    description = "HetRL ILP: CP-SAT over block-aligned device sets x layouts, optimal in that space"
    Options = ILPOptions

    def run(self, ev: Evaluator) -> dict[str, Any]:
        b = ev.budget
        cands = candidates(ev.model, self.options.load_balance)
        priced = sum(len(c) for c in cands.values())
        cands = prune_dominated(cands)
        left = None if b.seconds is None else max(b.seconds - ev.elapsed(), 1.0)
        det = (b.evaluations * EVAL_DETERMINISTIC_S
               if b.evaluations is not None and b.seconds is None else None)
        ev.evaluations += priced  # each candidate priced counts as one task evaluation
        # sync workflows with barrier stages (PPO, GRPO): one small model per sharing pattern
        stages = stages_of(ev.workload) if self.options.phased else None
        try:
            if stages is not None:
                out = solve_staged(ev.model, cands, stages, left, det, b.seed, b.workers,
                                   self.options.hint)
            else:
                out = solve(ev.model, cands, left, det, b.seed, b.workers, self.options.hint)
            plan = plan_from(ev.workload, out["chosen"])
        except NoSolution as exc:
            chosen = greedy_fallback(ev.model, cands)
            plan = plan_from(ev.workload, chosen)
            out = {"status": f"{exc} (greedy fallback plan)", "objective_s": None,
                   "bound_s": None, "solve_s": None}
        ev.budget = type(b)(seconds=None, evaluations=ev.evaluations + 1, seed=b.seed)
        ev.evaluate(plan)
        bound = out["bound_s"]
        return {
            "ilp_status": out["status"],
            "ilp_objective_s": out["objective_s"],
            "ilp_bound_s": bound,
            "ilp_gap": None if bound is None or not out["objective_s"]
            else (out["objective_s"] - bound) / out["objective_s"],
            "ilp_solve_s": out["solve_s"],
            "ilp_candidates": priced,
            "ilp_method": "phased" if stages is not None else "monolithic",
            "ilp_models": out.get("models"),
        }
