"""The monolithic ILP: every task's start, duration and end on a time line, tasks that share a
device kept from overlapping. It serves every workflow (async mode included); the phased solve
(:mod:`hetrl.search.ilp.phased`) is faster for sync workflows whose stages are barriers."""

from __future__ import annotations

import math
import time
from typing import Any

from hetrl.cost.model import CostModel
from hetrl.plan import Plan
from hetrl.search.ilp.data import SCALE, Candidate
from hetrl.search.ilp.model import (
    NoSolution,
    add_hint,
    check_nonempty,
    choice_vars,
    chosen_of,
    colocation_constraints,
    durations_ms,
    memory_constraints,
    sync_var,
    use_vars,
    users,
)


def solve(model: CostModel, cands: dict[str, list[Candidate]], time_limit_s: float | None,
          deterministic_time: float | None, seed: int, workers: int,
          hint: Plan | None = None, lower_bound_s: float | None = None) -> dict[str, Any]:
    """Solve the monolithic model.

    Variables: a boolean per (task, candidate), exactly one per task; per task a start, end and
    duration (ms); per (task, device) an optional interval present when the task uses it.
    Constraints: NoOverlap per device; the workflow's precedences; memory per device; the
    weight sync after actor training; redundant per-device cuts (below). Objective: sync mode,
    the makespan; async mode (staleness k), the period max(makespan / (k + 1), the busiest
    device's work). ``lower_bound_s``: a bound proved elsewhere (added as a cut);
    ``time_limit_s`` counts the model's building too. Returns the chosen candidates, the status
    name, objective and bound (s), the solver's wall time (s) and the number of variables."""
    from ortools.sat.python import cp_model

    began = time.perf_counter()
    wl, n_dev = model.workload, model.cluster.num_devices
    check_nonempty(cands)
    ms = durations_ms(cands)
    horizon = int(sum(max(c.seconds for c in cs) for cs in cands.values()) * SCALE * 2) + 10**6
    m = cp_model.CpModel()
    # Variables.
    x = choice_vars(m, cands)
    start, end, dur = {}, {}, {}
    for t in cands:
        dur[t] = m.NewIntVar(0, horizon, f"dur[{t}]")
        m.Add(dur[t] == sum(k * v for k, v in zip(ms[t], x[t], strict=True)))
        start[t] = m.NewIntVar(0, horizon, f"start[{t}]")
        end[t] = m.NewIntVar(0, horizon, f"end[{t}]")
        m.Add(end[t] == start[t] + dur[t])
    used_by = users(cands, n_dev)  # built once: it is large
    uses = use_vars(m, x, used_by)
    colocation_constraints(m, x, used_by)
    per_device: dict[int, list] = {d: [] for d in range(n_dev)}
    for (t, d), u in uses.items():
        per_device[d].append(m.NewOptionalIntervalVar(start[t], dur[t], end[t], u, f"iv[{t},{d}]"))
    # Constraints: devices, memory, precedence, weight sync.
    for d in range(n_dev):
        if len(per_device[d]) > 1:
            m.AddNoOverlap(per_device[d])
    memory_constraints(m, model, cands, x, used_by)
    for info in wl.tasks:
        for dep in info.depends_on:
            m.Add(start[info.name] >= end[dep])
    sync = sync_var(m, model, cands, x, horizon)
    makespan = m.NewIntVar(0, horizon, "makespan")
    for t in cands:
        m.Add(makespan >= end[t])
    m.Add(makespan >= end["actor_training"] + sync)
    _redundant_cuts(m, wl, n_dev, cands, x, ms, used_by, dur, sync, makespan)
    # Objective.
    if wl.mode == "sync":
        objective = makespan
    else:
        objective = m.NewIntVar(0, horizon, "period")
        m.Add((wl.staleness + 1) * objective >= makespan)
        for d in range(n_dev):
            work = [ms[t][i] * x[t][i] for t in cands for i in used_by[t][d]]
            if work:
                gen_u = uses.get(("actor_generation", d))
                busy = sum(work)
                if gen_u is not None:
                    s_d = m.NewIntVar(0, horizon, "")
                    m.Add(s_d == sync).OnlyEnforceIf(gen_u)
                    m.Add(s_d == 0).OnlyEnforceIf(gen_u.Not())
                    busy = busy + s_d
                m.Add(objective >= busy)
    if lower_bound_s is not None:
        m.Add(objective >= int(math.floor(lower_bound_s * SCALE)))
    m.Minimize(objective)
    if hint is not None:
        add_hint(m, cands, x, hint)
    # Solve.
    solver = cp_model.CpSolver()
    solver.parameters.random_seed = seed
    solver.parameters.num_workers = workers
    if time_limit_s is not None:
        solver.parameters.max_time_in_seconds = max(
            time_limit_s - (time.perf_counter() - began), 0.01)
    if deterministic_time is not None:
        solver.parameters.max_deterministic_time = deterministic_time
    status = solver.Solve(m)
    name = solver.StatusName(status)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise NoSolution(name)
    # Extract.
    return {
        "chosen": chosen_of(solver, cands, x),
        "status": name,
        "objective_s": solver.ObjectiveValue() / SCALE,
        "bound_s": solver.BestObjectiveBound() / SCALE,
        "solve_s": solver.WallTime(),
        "variables": sum(len(v) for v in x.values()),
    }


def _redundant_cuts(m, wl, n_dev, cands, x, ms, used_by, dur, sync, makespan) -> None:
    """Cuts that tighten the LP relaxation where NoOverlap's reasoning over optional intervals
    of variable length is weak. On any device the tasks after generation run one after another,
    and none starts before generation has ended; the training tasks also wait for every
    inference task. With load(t, d) the ms of the candidate t picks if it uses d (0 otherwise):

        makespan >= dur(generation) + sum over t != generation of load(t, d)
        makespan >= dur(generation) + dur(i) + sum over training t of load(t, d), each inference i
        makespan >= dur(generation) + sum over inference t of load(t, d) + dur(j)
                    (+ the weight sync when j is actor training), each training task j
    """
    kinds = {info.name: info.stage for info in wl.tasks}
    inference = [t for t in cands if kinds[t] == 1]
    for d in range(n_dev):
        load = {t: [ms[t][i] * x[t][i] for i in used_by[t][d]] for t in cands}
        after = [term for t in cands if kinds[t] > 0 for term in load[t]]
        if after:
            m.Add(makespan >= dur["actor_generation"] + sum(after))
        training = [term for t in cands if kinds[t] == 2 for term in load[t]]
        if training:
            for i in inference:
                m.Add(makespan >= dur["actor_generation"] + dur[i] + sum(training))
        before = [term for t in inference for term in load[t]]
        if before:
            for j in (t for t in cands if kinds[t] == 2):
                last = dur[j] + (sync if j == "actor_training" else 0)
                m.Add(makespan >= dur["actor_generation"] + sum(before) + last)
