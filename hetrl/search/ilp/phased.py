"""The phased ILP: one small CP-SAT model per sharing pattern, for sync workflows whose stages
are barriers (PPO, GRPO).

With barriers the makespan is the sum of the stages' lengths, and a stage of at most three tasks
lasts exactly its heaviest clique of tasks that share devices (tasks sharing GPUs run one after
another, the others side by side; actor training first, so that the weight sync overlaps the
rest). So the optimum is the least, over the sharing patterns (which pairs of a stage's tasks
share devices), of a model where the pairs kept apart use disjoint devices and each stage lasts
at least every clique's total duration: no intervals, no big-M sequencing. A pattern whose model
says a pair shares when its solution leaves them apart only overestimates, which another pattern
covers, so the least over the patterns is exact.
"""

from __future__ import annotations

import itertools
import math
import time
from typing import Any

from hetrl.cost.model import CostModel
from hetrl.plan import Plan
from hetrl.search.ilp.data import SCALE, Candidate
from hetrl.search.ilp.local import local_search
from hetrl.search.ilp.model import (
    NoSolution,
    candidate_of,
    check_nonempty,
    chosen_of,
    durations_ms,
    fits,
    greedy_fallback,
    memory_constraints,
    plan_from,
    sync_ms,
    sync_var,
    use_vars,
    users,
)
from hetrl.search.ilp.monolithic import solve
from hetrl.search.ilp.pairwise import Pairwise
from hetrl.spec.tasks import COLOCATED_WITH


def stages_of(workload) -> tuple[tuple[str, ...], ...] | None:
    """The workflow's stages when they are barriers -- every task of a stage depends on every
    task of the stage before and on nothing else -- with at most three tasks each, the first
    stage being generation alone, in sync mode (PPO and GRPO), and no task bound to another
    stage's group (``COLOCATED_WITH``: its patterns would cross stages); None otherwise."""
    if workload.mode != "sync" or any(t in COLOCATED_WITH for t in workload.task_names):
        return None
    by_stage: dict[int, list[str]] = {}
    for info in workload.tasks:
        by_stage.setdefault(info.stage, []).append(info.name)
    stages = tuple(tuple(by_stage[k]) for k in sorted(by_stage))
    if stages[0] != ("actor_generation",) or "actor_training" not in stages[-1]:
        return None
    for k, tasks in enumerate(stages):
        if len(tasks) > 3:
            return None
        want = set(stages[k - 1]) if k else set()
        if any(set(workload.task(t).depends_on) != want for t in tasks):
            return None
    return stages


def _pairs(stages: tuple[tuple[str, ...], ...]) -> list[tuple[int, str, str]]:
    """(stage, task, task) for every two tasks of one stage."""
    return [(k, a, b) for k, ts in enumerate(stages) for a, b in itertools.combinations(ts, 2)]


def _cliques(tasks: tuple[str, ...], edges: set[tuple[str, str]]) -> list[tuple[str, ...]]:
    """The non-empty subsets of ``tasks`` whose every two tasks are joined by ``edges``."""
    return [k for n in range(1, len(tasks) + 1) for k in itertools.combinations(tasks, n)
            if all(e in edges for e in itertools.combinations(k, 2))]


def _stage_cliques(stages, pairs, shared) -> list[list[tuple[str, ...]]]:
    """Per stage, the cliques of its sharing graph under the pattern ``shared``."""
    edges = {(a, b) for (_, a, b), on in zip(pairs, shared, strict=True) if on}
    return [_cliques(ts, edges) for ts in stages]


def phased_objective_ms(model: CostModel, chosen: dict[str, Candidate],
                        stages: tuple[tuple[str, ...], ...]) -> int:
    """The ILP's sync objective (ms) of one candidate per task: per stage, the heaviest chain
    of tasks that share a device (with three or fewer tasks, the heaviest clique of the
    stage's sharing graph: tasks that share devices run one after another, the others side by
    side), actor training counted with the weight sync after it; summed over the stages."""
    pairs = _pairs(stages)
    shared = [not set(chosen[a].devices).isdisjoint(chosen[b].devices) for _, a, b in pairs]
    return pattern_objective_ms(model, chosen, stages, pairs, shared)


def pattern_objective_ms(model: CostModel, chosen: dict[str, Candidate],
                         stages: tuple[tuple[str, ...], ...], pairs, shared) -> int:
    """:func:`phased_objective_ms` with the sharing pattern given (``shared``: for each of
    ``pairs``, whether its two tasks share a device) instead of read off the devices: the
    objective of the pattern model, which the pairwise bounds bound."""
    ms = {t: int(round(c.seconds * SCALE)) for t, c in chosen.items()}
    sync = sync_ms(model, chosen["actor_generation"], chosen["actor_training"])
    total = 0
    for tasks, cliques in zip(stages, _stage_cliques(stages, pairs, shared), strict=True):
        span = max(sum(ms[t] for t in k) for k in cliques)
        if "actor_training" in tasks:
            span = max(span, ms["actor_training"] + sync)
        total += span
    return total


def _prune_for_pattern(cands_ms: dict[str, list[int]], stages, cliques, limit: int
                       ) -> tuple[dict[str, list[int]] | None, int]:
    """Which candidates (indices) can be in a solution of objective <= ``limit`` ms under a
    sharing pattern (its ``cliques`` per stage), and the pattern's lower bound (ms): each stage
    at least its heaviest clique of the fastest candidates left. A candidate goes when, with
    the fastest candidates everywhere else, one of its cliques already passes the limit;
    repeated until nothing changes. None when some task has no candidate left."""
    keep = {t: list(range(len(v))) for t, v in cands_ms.items()}
    while True:
        fastest = {t: min(cands_ms[t][i] for i in keep[t]) for t in keep}
        bound = [max(sum(fastest[t] for t in k) for k in cl) for cl in cliques]
        lower = sum(bound)
        changed = False
        for s, tasks in enumerate(stages):
            rest = lower - bound[s]
            for t in tasks:
                others = max(sum(fastest[u] for u in k if u != t) for k in cliques[s] if t in k)
                cap = limit - rest - others
                kept = [i for i in keep[t] if cands_ms[t][i] <= cap]
                if not kept:
                    return None, lower
                if len(kept) < len(keep[t]):
                    keep[t], changed = kept, True
        if not changed:
            return keep, lower


def _pattern_model(model: CostModel, cands: dict[str, list[Candidate]], stages, pairs, shared,
                   cliques, cutoff: int | None):
    """The model of one sharing pattern: tasks of a stage that the pattern keeps apart use
    disjoint devices, and each stage lasts at least every clique's total duration (actor
    training: plus the weight sync). No intervals: with barriers between stages and three or
    fewer tasks each, a stage's length is exactly its heaviest clique when the pattern is the
    true one, and never less (more sharing only lengthens it), so the minimum over all patterns
    is the ILP's optimum."""
    from ortools.sat.python import cp_model

    n_dev = model.cluster.num_devices
    ms = {t: [int(round(c.seconds * SCALE)) for c in cs] for t, cs in cands.items()}
    horizon = sum(max(v) for v in ms.values()) * 2 + 10**6
    m = cp_model.CpModel()
    x = {t: [m.NewBoolVar(f"x[{t},{i}]") for i in range(len(cs))] for t, cs in cands.items()}
    dur = {}
    for t in cands:
        m.AddExactlyOne(x[t])
        dur[t] = m.NewIntVar(min(ms[t]), max(ms[t]), f"dur[{t}]")
        m.Add(dur[t] == sum(k * v for k, v in zip(ms[t], x[t], strict=True)))
    used_by = users(cands, n_dev)
    memory_constraints(m, model, cands, x, used_by)
    apart = {t for (_, a, b), on in zip(pairs, shared, strict=True) if not on for t in (a, b)}
    uses = use_vars(m, x, {t: u for t, u in used_by.items() if t in apart})
    for (_, a, b), on in zip(pairs, shared, strict=True):
        if not on:
            for d in range(n_dev):
                if (a, d) in uses and (b, d) in uses:
                    m.AddBoolOr([uses[(a, d)].Not(), uses[(b, d)].Not()])
    sync = sync_var(m, model, cands, x, horizon)
    spans = []
    for k, (tasks, cl) in enumerate(zip(stages, cliques, strict=True)):
        span = m.NewIntVar(0, horizon, f"stage[{k}]")
        for clique in cl:
            m.Add(span >= sum(dur[t] for t in clique))
        if "actor_training" in tasks:
            m.Add(span >= dur["actor_training"] + sync)
        spans.append(span)
    objective = m.NewIntVar(0, horizon, "objective")
    m.Add(objective == sum(spans))
    if cutoff is not None:
        m.Add(objective <= cutoff)
    m.Minimize(objective)
    # Search order (CP-SAT alternates it with its own): tasks with the fewest candidates first
    # (training, generation), each task's fastest candidate first.
    for t in sorted(cands, key=lambda t: len(cands[t])):
        order = sorted(range(len(cands[t])), key=lambda i: ms[t][i])
        m.AddDecisionStrategy([x[t][i] for i in order], cp_model.CHOOSE_FIRST,
                              cp_model.SELECT_MAX_VALUE)
    return m, x


#: CP-SAT parameters of the pattern models, chosen by measurement (docs/search-history.md, ILP):
#: one presolve round, no LP relaxation (after the pairwise bounds, propagation alone is
#: faster), the search alternating with the fixed order of :func:`_pattern_model` (tasks with
#: the fewest candidates first, fastest candidate first). The models run on one worker.
PATTERN_PARAMETERS = ("max_presolve_iterations: 1 linearization_level: 0 "
                      "search_branching: PORTFOLIO_SEARCH")


def solve_phased(model: CostModel, cands: dict[str, list[Candidate]],
                 stages: tuple[tuple[str, ...], ...], time_limit_s: float | None,
                 deterministic_time: float | None, seed: int, workers: int,
                 hint: Plan | None = None, deepen: float = 1.1,
                 incumbents: tuple[dict[str, Candidate], ...] = (),
                 kicks: int = 50) -> dict[str, Any]:
    """The sync ILP of a workflow with barrier stages (:func:`stages_of`), solved exactly as one
    small model per sharing pattern (which tasks of a stage share devices; 2^pairs patterns,
    16 for PPO, 2 for GRPO). The optimum is the best pattern's.

    The incumbent U starts as the best of ``hint``, ``incumbents`` (one candidate per task) and
    the greedy plan that fit in memory, improved by a local search of ``kicks`` kicks
    (:mod:`hetrl.search.ilp.local`); then all patterns deepen together, in rounds
    (:class:`_Rounds`), until every pattern is settled or the limits (wall-clock seconds,
    CP-SAT deterministic time) are spent. ``workers`` is unused: the pattern models run on one
    worker (:data:`PATTERN_PARAMETERS`).

    Returns the chosen candidates, status (OPTIMAL when every pattern is settled), objective
    and bound (s; the bound is the least over the patterns), wall time (s), the number of
    candidates, of patterns and of CP-SAT models solved, each pattern's bound (s) and whether it
    is settled, and where the incumbent came from ("solver", "local search" or "hint or
    greedy"). Raises NoSolution when no plan was found ("INFEASIBLE" when there is none)."""
    clock = time.perf_counter()
    check_nonempty(cands)
    search = _Rounds(model, cands, stages, deepen, seed, clock, time_limit_s, deterministic_time)
    starts = [candidate_of(cands, hint)] if hint is not None else []
    for start in starts + list(incumbents) + [greedy_fallback(model, cands)]:
        if start is not None and fits(model, start):
            search.offer(start, "hint or greedy")
    if search.best is not None and kicks:
        search.offer(local_search(search.pw, stages, search.best, kicks, seed)[0],
                     "local search")
    search.start()
    while search.round():
        pass
    if search.best is None:
        raise NoSolution("INFEASIBLE" if search.all_settled() else "UNKNOWN")
    upper, lower = search.upper, search.lower
    bound = min([upper] + [lower[p] for p in search.patterns if lower[p] < upper])
    return {
        "chosen": search.best,
        "status": "OPTIMAL" if bound >= upper else "FEASIBLE",
        "objective_s": upper / SCALE,
        "bound_s": bound / SCALE,
        "solve_s": time.perf_counter() - clock,
        "variables": sum(len(v) for v in cands.values()),
        "patterns": len(search.patterns),
        #: per pattern (sharing flags of ``_pairs(stages)``), its lower bound (s) and whether settled
        "pattern_bounds": {p: (lower[p] / SCALE, p in search.settled or lower[p] >= upper)
                           for p in search.patterns},
        "models": search.models,
        "incumbent": search.source,
    }


class _Rounds:
    """One phased solve's state: the incumbent (``best``, its objective ``upper`` = U, ms),
    each pattern's lower bound (ms) and whether it is settled, and the limits spent.

    A round (:meth:`round`) takes T = ``deepen`` x the least bound of the patterns left (U - 1
    once the next round would pass it). Each pattern whose bound is at most T, least bound
    first (ties: least first bound), is narrowed to the candidates a plan of objective <= min(T,
    U - 1) can use (:func:`_prune_for_pattern`, then
    :class:`~hetrl.search.ilp.pairwise.Pairwise`), which settles most; if some are left, its
    model (objective <= that, minimised) is solved there and then with half the time left (all
    of it for the round's last pattern), so that a better plan lowers U for the patterns after
    it; those out of time get equal shares of what is left. A solution lowers U; a model
    proved infeasible raises the pattern's bound to its target + 1. A pattern is settled when
    its bound reaches U."""

    def __init__(self, model: CostModel, cands: dict[str, list[Candidate]], stages, deepen: float,
                 seed: int, clock: float, time_limit_s: float | None,
                 deterministic_time: float | None):
        self.model, self.cands, self.stages, self.deepen, self.seed = (model, cands, stages,
                                                                       deepen, seed)
        self.clock, self.time_limit_s, self.deterministic_time = (clock, time_limit_s,
                                                                  deterministic_time)
        self.ms = durations_ms(cands)
        self.pw = Pairwise(model, cands)
        self.pairs = _pairs(stages)
        self.patterns = [tuple(p) for p in itertools.product((True, False),
                                                             repeat=len(self.pairs))]
        self.cliques = {p: _stage_cliques(stages, self.pairs, p) for p in self.patterns}
        self.apart = {p: {x for (_, a, b), on in zip(self.pairs, p, strict=True) if not on
                          for x in ((a, b), (b, a))} for p in self.patterns}
        self.lower = {p: _prune_for_pattern(self.ms, stages, self.cliques[p], 2**62)[1]
                      for p in self.patterns}
        self.first = dict(self.lower)  # tie-breaks among equal bounds
        self.best: dict[str, Candidate] | None = None
        self.upper = 2**62
        self.source: str | None = None
        self.settled: set = set()
        self.det = 0.0  # CP-SAT deterministic time spent
        self.models = 0

    def offer(self, chosen: dict[str, Candidate], source: str) -> None:
        """A plan that fits in memory: the incumbent if better."""
        value = phased_objective_ms(self.model, chosen, self.stages)
        if value < self.upper:
            self.best, self.upper, self.source = chosen, value, source

    def start(self) -> None:
        """Before the first round: candidates no pattern can use below U leave the pairwise
        memo; with no plan yet, U is set just above the longest plan possible, so that the
        patterns settle when none has a plan."""
        if self.best is not None:
            self.pw.restrict(_universe(self.ms, self.stages, self.cliques, self.upper))
        else:
            self.upper = sum(max(v) for v in self.ms.values()) + self.pw.longest_sync() + 1

    def all_settled(self) -> bool:
        return len(self.settled) == len(self.patterns)

    def _left(self, limit: float | None, used: float) -> float | None:
        return None if limit is None else max(limit - used, 0.0)

    def out_of_time(self) -> bool:
        return (self.time_limit_s is not None
                and time.perf_counter() - self.clock >= self.time_limit_s) or (
            self.deterministic_time is not None and self.det >= self.deterministic_time)

    def narrow(self, p, keep, target: int):
        """The candidates of pattern ``p`` (within ``keep`` if given) that can be in a plan of
        objective <= ``target`` (None if none), and the pattern's bound (ms) given that."""
        if keep is None:
            keep, bound = _prune_for_pattern(self.ms, self.stages, self.cliques[p], target)
            if keep is None or bound > target:
                return None, target + 1
        return self.pw.prune(keep, self.stages, self.cliques[p], self.apart[p], target)

    def solve(self, p, keep, target: int, share: float) -> bool:
        """Solve pattern ``p``'s model on candidates ``keep`` with the cut objective <=
        ``target`` within ``share`` of the time left; False if out of time first."""
        from ortools.sat.python import cp_model

        t_cap, d_cap = (None if c is None else c * share
                        for c in (self._left(self.time_limit_s, time.perf_counter() - self.clock),
                                  self._left(self.deterministic_time, self.det)))
        began = time.perf_counter()
        # no hint: the incumbent breaks the cut (objective <= T < U) by construction
        sub = {t: [self.cands[t][i] for i in keep[t]] for t in self.cands}
        m, x = _pattern_model(self.model, sub, self.stages, self.pairs, p, self.cliques[p],
                              target)
        solver = cp_model.CpSolver()
        solver.parameters.merge_text_format(PATTERN_PARAMETERS)
        solver.parameters.random_seed = self.seed
        solver.parameters.num_workers = 1  # see PATTERN_PARAMETERS
        if t_cap is not None:  # the model's building counts too
            solver.parameters.max_time_in_seconds = max(t_cap - (time.perf_counter() - began),
                                                        0.01)
        if d_cap is not None:
            solver.parameters.max_deterministic_time = max(d_cap, 1e-3)
        status = solver.Solve(m)
        self.models += 1
        self.det += solver.response_proto.deterministic_time
        lower = self.lower
        if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            value = int(round(solver.ObjectiveValue()))
            if value < self.upper:  # a better plan: U drops, and so does the pairwise memo
                self.best, self.upper, self.source = chosen_of(solver, sub, x), value, "solver"
                self.pw.restrict(_universe(self.ms, self.stages, self.cliques, self.upper))
            if status == cp_model.OPTIMAL:
                lower[p] = max(lower[p], value)
                self.settled.add(p)
                return True
            lower[p] = max(lower[p], int(math.ceil(solver.BestObjectiveBound())))
            return False  # out of time with a solution: the bound stands
        if status == cp_model.INFEASIBLE:
            lower[p] = max(lower[p], target + 1)
            return True
        lower[p] = max(lower[p], min(int(math.ceil(solver.BestObjectiveBound())), target))
        return False

    def round(self) -> bool:
        """One round (see the class); False when nothing is left to do or no time."""
        if self.out_of_time():
            return False
        lower = self.lower
        todo = sorted((p for p in self.patterns if p not in self.settled and lower[p] < self.upper),
                      key=lambda p: (lower[p], self.first[p]))
        if not todo:
            return False
        target = max(int(lower[todo[0]] * self.deepen), lower[todo[0]])
        if target * self.deepen >= self.upper - 1:  # the next round would pass U: go there now
            target = self.upper - 1
        todo = [p for p in todo if lower[p] <= target]
        stuck = []
        for i, p in enumerate(todo):
            cut = min(target, self.upper - 1)
            if self.out_of_time() or lower[p] > cut:
                continue
            keep, bound = self.narrow(p, None, cut)
            lower[p] = max(lower[p], bound)
            if keep is not None and not self.solve(p, keep, cut,
                                                   0.5 if i < len(todo) - 1 else 1.0):
                stuck.append((p, keep, cut))
        for i, (p, keep, cut) in enumerate(stuck):
            if self.out_of_time() or lower[p] >= self.upper:
                continue
            if self.upper - 1 < cut:  # a better plan since: narrow again below it
                cut = self.upper - 1
                keep, bound = self.narrow(p, keep, cut)
                lower[p] = max(lower[p], bound)
                if keep is None:
                    continue
            self.solve(p, keep, cut, 1 / (len(stuck) - i))
        for p in todo:
            if lower[p] >= self.upper:
                self.settled.add(p)
        return True


def _universe(ms: dict[str, list[int]], stages, cliques: dict, upper: int
              ) -> dict[str, list[int]]:
    """Per task, the candidates some pattern's plan of objective < ``upper`` might use (by
    :func:`_prune_for_pattern`), sorted."""
    universe: dict[str, set[int]] = {t: set() for t in ms}
    for cl in cliques.values():
        keep, bound = _prune_for_pattern(ms, stages, cl, upper - 1)
        if keep is not None and bound < upper:
            for t in ms:
                universe[t].update(keep[t])
    return {t: sorted(v) for t, v in universe.items()}


def solve_staged(model: CostModel, cands: dict[str, list[Candidate]],
                 stages: tuple[tuple[str, ...], ...], time_limit_s: float | None,
                 deterministic_time: float | None, seed: int, workers: int,
                 hint: Plan | None = None, phased_share: float = 1.0) -> dict[str, Any]:
    """The phased solve with ``phased_share`` of the limits; if it has not proved its plan
    optimal (or found none) and at least a second (or any deterministic time) is left, the
    monolithic model (:func:`~hetrl.search.ilp.monolithic.solve`) with the rest, hinted with the
    phased incumbent unless that is the greedy plan, and cut below by the phased bound. The
    better plan and the higher bound are reported. By default the phased solve has all the
    time: the monolithic model's share found nothing better (docs/search-history.md, ILP)."""
    clock = time.perf_counter()

    def part(limit: float | None, share: float, used: float) -> float | None:
        return None if limit is None else max(limit * share - used, 0.0)

    first: dict[str, Any] | None = None
    try:
        first = solve_phased(model, cands, stages, part(time_limit_s, phased_share, 0.0),
                             part(deterministic_time, phased_share, 0.0), seed, workers, hint)
    except NoSolution:
        pass
    spent = time.perf_counter() - clock
    rest = part(time_limit_s, 1.0, spent)
    rest_det = None if deterministic_time is None else deterministic_time * (1 - phased_share)
    if first is not None and (first["status"] == "OPTIMAL" or (rest is not None and rest < 1.0)
                              or (rest_det is not None and rest_det <= 0)):
        return first
    # not hinted with a greedy plan: that kept CP-SAT on it (docs/search-history.md)
    found = first is not None and first["incumbent"] != "hint or greedy"
    start = plan_from(model.workload, first["chosen"]) if found else hint
    try:
        second = solve(model, cands, rest, rest_det, seed, workers, start,
                       None if first is None else first["bound_s"])
    except NoSolution:
        if first is None:
            raise
        return first
    out = dict(second)
    if first is not None:
        if first["objective_s"] < second["objective_s"]:
            out["chosen"], out["objective_s"] = first["chosen"], first["objective_s"]
        out["bound_s"] = max(first["bound_s"], second["bound_s"])
        out["models"] = first["models"] + 1
    out["status"] = "OPTIMAL" if out["bound_s"] >= out["objective_s"] else "FEASIBLE"
    out["solve_s"] = time.perf_counter() - clock
    return out
