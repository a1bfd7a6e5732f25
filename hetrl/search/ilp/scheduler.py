"""The scheduler registered as ``ilp``: price the candidates, solve, estimate the plan found."""

from __future__ import annotations

from dataclasses import replace
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

    objectives = True  # cost and limits: one solve per subset of nodes, see run()

    def run(self, ev: Evaluator) -> dict[str, Any]:
        """Price the candidates and solve. The CP-SAT model minimises time; under another
        objective (``--objective cost``, limits) it is solved once for every non-empty subset
        of the cluster's nodes (the candidates inside that subset, the time limit shared), and
        the Evaluator keeps the plan of best fitness: the exact time-optimal plan of each
        rentable subset, priced in dollars (a plan on fewer nodes is cheaper under
        ``--charge-used-only``)."""
        b = ev.budget
        cands = candidates(ev.model, self.options.load_balance)
        priced = sum(len(c) for c in cands.values())
        cands = prune_dominated(cands)
        ev.evaluations += priced  # each candidate priced counts as one task evaluation
        subsets = [None] if ev.objective.is_plain_time else _node_subsets(ev.cluster)
        left = None if b.seconds is None else max(b.seconds - ev.elapsed(), 1.0)
        det = (b.evaluations * EVAL_DETERMINISTIC_S
               if b.evaluations is not None and b.seconds is None else None)
        share = 1.0 / len(subsets)
        extras: list[tuple[float, dict[str, Any]]] = []
        for devices in subsets:
            sub = cands if devices is None else {
                t: [c for c in cs if devices.issuperset(c.devices)] for t, cs in cands.items()}
            if any(not cs for cs in sub.values()):
                continue
            out, plan = self._solve(ev, b, sub, None if left is None else left * share,
                                    None if det is None else det * share)
            ev.budget = replace(b, seconds=None, evaluations=ev.evaluations + 1)
            extras.append((ev.evaluate(plan), self._extra(out, priced, sub)))
        return min(extras, key=lambda x: x[0])[1]

    def _solve(self, ev: Evaluator, b, cands, left, det) -> tuple[dict[str, Any], Any]:
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
        out["method"] = "phased" if stages is not None else "monolithic"
        return out, plan

    @staticmethod
    def _extra(out: dict[str, Any], priced: int, cands) -> dict[str, Any]:
        bound = out["bound_s"]
        devices = sorted({d for cs in cands.values() for c in cs for d in c.devices})
        return {
            "ilp_status": out["status"],
            "ilp_objective_s": out["objective_s"],
            "ilp_bound_s": bound,
            "ilp_gap": None if bound is None or not out["objective_s"]
            else (out["objective_s"] - bound) / out["objective_s"],
            "ilp_solve_s": out["solve_s"],
            "ilp_candidates": priced,
            "ilp_method": out["method"],
            "ilp_models": out.get("models"),
            "ilp_devices": len(devices),
        }


def _node_subsets(cluster) -> list[set[int]]:
    """Every non-empty subset of the cluster's nodes as a set of device ids, the whole cluster
    first (the ILP's clusters have a few nodes: 2**nodes - 1 subsets)."""
    ids, start = [], 0
    for node in cluster.nodes:
        ids.append(set(range(start, start + node.count)))
        start += node.count
    n = len(ids)
    masks = sorted(range(1, 2 ** n), key=lambda m: (-bin(m).count("1"), m))
    return [set().union(*(ids[i] for i in range(n) if m >> i & 1)) for m in masks]
