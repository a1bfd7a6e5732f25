"""HetRL (ILP): an exact search with OR-tools CP-SAT over a symmetric, block-aligned space.

Phases (as in OR-tools' job-shop example): data, variables, constraints, objective, solve,
extract.

Data. Each task's candidates are (device set, layout) pairs: a device set takes, in each node,
nothing or one aligned power-of-two block of its GPUs (GPUs of a type in a node are
interchangeable, so blocks lose nothing but the order); the layout uses the whole set
(dp * pp * tp = |set|). Each candidate is load-balanced and priced by the cost model on its own:
its seconds and the bytes it needs on each device (resident + working; generation: weights and
one max-length sequence of KV cache). Dominated candidates (same task and devices, no faster,
no less memory) are dropped (``prune_dominated``; exact).

Variables. A boolean per (task, candidate), exactly one per task; per task a start, end and
duration (integer milliseconds); per (task, device) an optional interval present when the task
uses the device.

Constraints. NoOverlap per device (tasks sharing GPUs run one after another); precedence from the
workflow (generation -> inference -> training); per-device memory: the needs of every task
placed on the device sum to at most its usable memory (co-located models counted separately, a
conservative reading); weight sync after actor training: for each node a generation candidate
uses, the pull from the nearest node the actor training uses (latency + shard bytes / bandwidth),
zero when generation and actor training pick the same candidate (sync mode, weights shared).
Redundant per-device cuts on the makespan (see the code) tighten the LP relaxation.

Objective. Sync: the makespan (actor training's end + weight sync, every task's end).
Async (staleness k): the period max(makespan / (k + 1), the busiest device's work).

The plan found is re-estimated by the full cost model; both numbers, the solver's bound and the
gap are reported. Candidates are priced with generation running alone, so the full cost model
can find co-located plans slower than the ILP objective says (their KV cache is smaller).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

from hetrl.cost.model import CostModel
from hetrl.errors import HetrlError
from hetrl.plan import Plan, TaskGroup, TaskPlacement, make_placement
from hetrl.search.balance import balance
from hetrl.search.base import Evaluator, Scheduler, register
from hetrl.search.space import layouts

SCALE = 1000  # objective units per second (integer milliseconds)
EVAL_DETERMINISTIC_S = 0.005


class _NoSolution(Exception):
    """CP-SAT found no solution within its limits (the status name is the message)."""


@dataclass(frozen=True)
class Candidate:
    task: str
    devices: tuple[int, ...]
    placement: TaskPlacement
    seconds: float
    need: np.ndarray  # bytes per device (0 where unused)


def node_blocks(cluster) -> list[list[tuple[int, ...]]]:
    """Per node, its aligned power-of-two blocks of GPUs (the whole node, halves, quarters...)."""
    out, start = [], 0
    for node in cluster.nodes:
        ids = list(range(start, start + node.count))
        start += node.count
        blocks, size = [], node.count
        while size >= 1:
            if node.count % size == 0:
                blocks += [tuple(ids[i:i + size]) for i in range(0, node.count, size)]
            if size == 1:
                break
            size //= 2
        out.append(blocks)
    return out


def device_sets(cluster, max_sets: int = 4096) -> list[tuple[int, ...]]:
    """Unions of at most one block per node (every non-empty combination)."""
    per_node = [[()] + blocks for blocks in node_blocks(cluster)]
    total = int(np.prod([len(b) for b in per_node]))
    if total - 1 > max_sets:
        raise HetrlError(f"ilp: {total - 1} device sets exceed the limit of {max_sets}; the ILP "
                         "is meant for small clusters (up to ~24 GPUs)")
    sets = []
    for combo in itertools.product(*per_node):
        devices = tuple(d for block in combo for d in block)
        if devices:
            sets.append(devices)
    return sets


def candidates(model: CostModel, load_balance: bool = True,
               max_sets: int = 4096) -> dict[str, list[Candidate]]:
    wl = model.workload
    out: dict[str, list[Candidate]] = {t: [] for t in wl.task_names}
    usable = model.cluster.topology.memory_bytes * model.params.usable_memory_fraction
    for devices in device_sets(model.cluster, max_sets):
        n = len(devices)
        for t in wl.task_names:
            shape = wl.model(wl.task(t).role)
            for dp, pp, tp in layouts(shape, n):
                if dp * pp * tp != n:
                    continue
                p = make_placement(t, devices, dp, pp, tp, shape.layers)
                if load_balance:
                    p = balance(model, p)
                seconds, need = model.task_alone(p)
                if np.any(need > usable + 1e-6):
                    continue  # cannot fit even alone
                out[t].append(Candidate(t, devices, p, seconds, need))
    return out


def prune_dominated(cands: dict[str, list[Candidate]],
                    keep: tuple[str, ...] = ("actor_generation", "actor_training")
                    ) -> dict[str, list[Candidate]]:
    """Drop candidates that another candidate of the same task on the same devices dominates
    (no slower and needing no more memory on any device; ties keep the first). Exact: every
    constraint and the objective see a candidate only through its devices, duration and memory
    -- except for generation and actor training, whose layouts also enter the weight sync, so
    ``keep`` leaves them whole."""
    out = {}
    for t, cs in cands.items():
        if t in keep:
            out[t] = cs
            continue
        by_devices: dict[tuple[int, ...], list[Candidate]] = {}
        for c in cs:
            by_devices.setdefault(c.devices, []).append(c)
        kept = []
        for c in cs:
            rivals = by_devices[c.devices]
            dominated = False
            for i, o in enumerate(rivals):
                if o is c:
                    continue
                if o.seconds <= c.seconds and np.all(o.need <= c.need) and (
                        o.seconds < c.seconds or np.any(o.need < c.need)
                        or i < rivals.index(c)):
                    dominated = True
                    break
            if not dominated:
                kept.append(c)
        out[t] = kept
    return out


def _sync_pull_ms(model: CostModel, gen: Candidate) -> dict[int, dict[int, int]]:
    """For each node the generation candidate uses: ms to pull its shard from each node."""
    topo = model.cluster.topology
    shapes = model.shapes(gen.task, gen.placement)
    shard: dict[int, float] = {}
    for replica in gen.placement.devices:
        for s, stage in zip(shapes, replica, strict=True):
            for d in stage:
                node = int(topo.node_of[d])
                shard[node] = max(shard.get(node, 0.0), s.weight_bytes)
    first = {}
    for d in range(model.cluster.num_devices):
        first.setdefault(int(topo.node_of[d]), []).append(d)
    out: dict[int, dict[int, int]] = {}
    for n, nbytes in shard.items():
        dst = first[n][0]
        row = {}
        for m, devs in first.items():
            src = devs[1] if m == n and len(devs) > 1 else devs[0]
            if src == dst:
                row[m] = 0
                continue
            gpu = model.cluster.devices[dst].gpu.name
            t = topo.latency_s[src, dst] + nbytes / (topo.bandwidth_Bps[src, dst]
                                                       * model.params.efficiency(gpu, "link"))
            row[m] = int(round(t * SCALE))
        out[n] = row
    return out


def solve(model: CostModel, cands: dict[str, list[Candidate]], time_limit_s: float | None,
          deterministic_time: float | None, seed: int, workers: int,
          hint: Plan | None = None) -> dict[str, Any]:
    from ortools.sat.python import cp_model

    wl, cluster = model.workload, model.cluster
    topo = cluster.topology
    n_dev = cluster.num_devices
    usable = topo.memory_bytes * model.params.usable_memory_fraction
    for t, cs in cands.items():
        if not cs:
            raise HetrlError(f"ilp: task {t} has no candidate that fits in memory")
    horizon = int(sum(max(c.seconds for c in cs) for cs in cands.values()) * SCALE * 2) + 10**6
    m = cp_model.CpModel()
    # Variables.
    x = {t: [m.NewBoolVar(f"x[{t},{i}]") for i in range(len(cs))] for t, cs in cands.items()}
    start, end, dur = {}, {}, {}
    for t, cs in cands.items():
        m.AddExactlyOne(x[t])
        dur[t] = m.NewIntVar(0, horizon, f"dur[{t}]")
        m.Add(dur[t] == sum(int(round(c.seconds * SCALE)) * v for c, v in zip(cs, x[t], strict=True)))
        start[t] = m.NewIntVar(0, horizon, f"start[{t}]")
        end[t] = m.NewIntVar(0, horizon, f"end[{t}]")
        m.Add(end[t] == start[t] + dur[t])
    uses: dict[tuple[str, int], Any] = {}
    per_device: dict[int, list] = {d: [] for d in range(n_dev)}
    mem_terms: dict[int, list] = {d: [] for d in range(n_dev)}
    for t, cs in cands.items():
        for d in range(n_dev):
            lits = [v for c, v in zip(cs, x[t], strict=True) if c.need[d] > 0]
            if not lits:
                continue
            u = m.NewBoolVar(f"u[{t},{d}]")
            m.Add(sum(lits) == u)
            uses[(t, d)] = u
            per_device[d].append(m.NewOptionalIntervalVar(start[t], dur[t], end[t], u, f"iv[{t},{d}]"))
            for c, v in zip(cs, x[t], strict=True):
                if c.need[d] > 0:
                    mem_terms[d].append(int(c.need[d] // 1e6) * v)  # MB
    # Constraints: devices, memory, precedence.
    for d in range(n_dev):
        if len(per_device[d]) > 1:
            m.AddNoOverlap(per_device[d])
        if mem_terms[d]:
            m.Add(sum(mem_terms[d]) <= int(usable[d] // 1e6))
    for info in wl.tasks:
        for dep in info.depends_on:
            m.Add(start[info.name] >= end[dep])
    # Weight sync after actor training.
    train_nodes = {}
    for nd in range(len(cluster.nodes)):
        lits = [v for c, v in zip(cands["actor_training"], x["actor_training"], strict=True)
                if any(int(topo.node_of[d]) == nd for d in c.devices)]
        y = m.NewBoolVar(f"train_node[{nd}]")
        if lits:
            m.AddMaxEquality(y, lits)
        else:
            m.Add(y == 0)
        train_nodes[nd] = y
    sync = m.NewIntVar(0, horizon, "sync")
    big = horizon
    for c, v in zip(cands["actor_generation"], x["actor_generation"], strict=True):
        same = [w for ct, w in zip(cands["actor_training"], x["actor_training"], strict=True)
                if ct.devices == c.devices and ct.placement.layers_per_stage == c.placement.layers_per_stage
                and (ct.placement.dp, ct.placement.pp, ct.placement.tp)
                == (c.placement.dp, c.placement.pp, c.placement.tp)]
        shared = m.NewBoolVar("") if same and wl.mode == "sync" else None
        if shared is not None:
            m.AddBoolAnd([v, same[0]]).OnlyEnforceIf(shared)
            m.AddBoolOr([v.Not(), same[0].Not()]).OnlyEnforceIf(shared.Not())
        for _n, row in _sync_pull_ms(model, c).items():
            q = m.NewIntVar(0, big, "")
            m.AddMinEquality(q, [big - (big - ms) * train_nodes[nd] for nd, ms in row.items()])
            ct = m.Add(sync >= q)
            ct.OnlyEnforceIf([v] + ([shared.Not()] if shared is not None else []))
    makespan = m.NewIntVar(0, horizon, "makespan")
    for t in cands:
        m.Add(makespan >= end[t])
    m.Add(makespan >= end["actor_training"] + sync)
    # Redundant cuts (they tighten the LP relaxation, so the bound rises where NoOverlap's own
    # reasoning over optional intervals of variable length is weak). On any device the tasks
    # after generation run one after another, and none starts before generation has ended; the
    # training tasks also wait for every inference task. With load(t, d) the seconds of the
    # candidate t picks if it uses d (0 otherwise):
    #   makespan >= dur(generation) + sum over t != generation of load(t, d)
    #   makespan >= dur(generation) + dur(i) + sum over training t of load(t, d), each inference i
    #   makespan >= dur(generation) + sum over inference t of load(t, d) + dur(j) (+ the weight
    #                sync when j is actor training), each training task j
    ms = {t: [int(round(c.seconds * SCALE)) for c in cs] for t, cs in cands.items()}
    kinds = {info.name: info.stage for info in wl.tasks}
    inference = [t for t in cands if kinds[t] == 1]
    for d in range(n_dev):
        load = {t: [k * v for c, k, v in zip(cs, ms[t], x[t], strict=True) if c.need[d] > 0]
                for t, cs in cands.items()}
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
    # Objective.
    if wl.mode == "sync":
        objective = makespan
    else:
        objective = m.NewIntVar(0, horizon, "period")
        m.Add((wl.staleness + 1) * objective >= makespan)
        for d in range(n_dev):
            work = [int(round(c.seconds * SCALE)) * v for t, cs in cands.items()
                    for c, v in zip(cs, x[t], strict=True) if c.need[d] > 0]
            if work:
                gen_u = uses.get(("actor_generation", d))
                busy = sum(work)
                if gen_u is not None:
                    s_d = m.NewIntVar(0, horizon, "")
                    m.Add(s_d == sync).OnlyEnforceIf(gen_u)
                    m.Add(s_d == 0).OnlyEnforceIf(gen_u.Not())
                    busy = busy + s_d
                m.Add(objective >= busy)
    m.Minimize(objective)
    if hint is not None:
        for t, cs in cands.items():
            p = hint.placement(t)
            for c, v in zip(cs, x[t], strict=True):
                m.AddHint(v, c.devices == tuple(sorted(p.device_ids)) and (
                    c.placement.dp, c.placement.pp, c.placement.tp) == (p.dp, p.pp, p.tp))
    # Solve.
    solver = cp_model.CpSolver()
    solver.parameters.random_seed = seed
    solver.parameters.num_workers = workers
    if time_limit_s is not None:
        solver.parameters.max_time_in_seconds = time_limit_s
    if deterministic_time is not None:
        solver.parameters.max_deterministic_time = deterministic_time
    status = solver.Solve(m)
    name = solver.StatusName(status)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise _NoSolution(name)
    chosen = {t: next(c for c, v in zip(cs, x[t], strict=True) if solver.Value(v))
              for t, cs in cands.items()}
    return {
        "chosen": chosen,
        "status": name,
        "objective_s": solver.ObjectiveValue() / SCALE,
        "bound_s": solver.BestObjectiveBound() / SCALE,
        "solve_s": solver.WallTime(),
        "variables": sum(len(v) for v in x.values()),
    }


def greedy_fallback(model: CostModel, cands: dict[str, list[Candidate]]) -> dict[str, Candidate]:
    """A plan when the solver found none, memory-feasible under the ILP's rule when the greedy
    can manage: task by task (workflow order), the fastest full-cluster candidate, else the
    fastest candidate, that fits on top of the tasks already chosen; if some task finds no room,
    again with each task taking the candidate that leaves the most memory free (its fastest on
    ties); the fastest candidates of all if that fails too."""
    usable = model.cluster.topology.memory_bytes * model.params.usable_memory_fraction
    full = tuple(range(model.cluster.num_devices))

    def peak(used: np.ndarray, c: Candidate) -> float:
        return float(np.max((used + c.need) / usable))

    for key in (lambda used, c: (c.devices != full, c.seconds),
                lambda used, c: (peak(used, c), c.seconds)):
        used = np.zeros(model.cluster.num_devices)
        chosen = {}
        for t, cs in cands.items():
            pick = min((c for c in cs if np.all(used + c.need <= usable)),
                       key=lambda c, used=used: key(used, c), default=None)
            if pick is None:
                break
            chosen[t] = pick
            used = used + pick.need
        else:
            return chosen
    return {t: min(cs, key=lambda c: (c.devices != full, c.seconds)) for t, cs in cands.items()}


def plan_from(workload, chosen: dict[str, Candidate]) -> Plan:
    """Tasks with identical device sets form one group; tasks sharing some devices too."""
    groups: list[tuple[list[str], set[int]]] = []
    for t in workload.task_names:
        devs = set(chosen[t].devices)
        merged = [g for g in groups if g[1] & devs]
        for g in merged:
            groups.remove(g)
        tasks = [u for g in merged for u in g[0]] + [t]
        groups.append((tasks, devs.union(*(g[1] for g in merged))))
    order = {t: i for i, t in enumerate(workload.task_names)}
    return Plan(
        tuple(TaskGroup(tuple(sorted(ts, key=order.get)), tuple(sorted(ds))) for ts, ds in groups),
        tuple(chosen[t].placement for t in workload.task_names),
    )


@register
class ILPScheduler(Scheduler):
    name = "ilp"
    description = "HetRL ILP: CP-SAT over block-aligned device sets x layouts, optimal in that space"

    def run(self, ev: Evaluator) -> dict[str, Any]:
        b = ev.budget
        cands = candidates(ev.model, bool(self.options.get("load_balance", True)))
        priced = sum(len(c) for c in cands.values())
        cands = prune_dominated(cands)
        left = None if b.seconds is None else max(b.seconds - ev.elapsed(), 1.0)
        # With only an evaluation budget, a deterministic solver budget of 5 ms (deterministic
        # time) per evaluation: about what one SHA-EA evaluation costs, so budgets compare.
        det = b.evaluations * EVAL_DETERMINISTIC_S if b.evaluations is not None and b.seconds is None else None
        ev.evaluations += priced  # each candidate priced counts as one task evaluation
        try:
            out = solve(ev.model, cands, left, det, b.seed, b.workers, self.options.get("hint"))
            plan = plan_from(ev.workload, out["chosen"])
        except _NoSolution as exc:
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
        }
