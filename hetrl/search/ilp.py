"""HetRL (ILP): an exact search with OR-tools CP-SAT over a symmetric, block-aligned space.

Phases (as in OR-tools' job-shop example): data, variables, constraints, objective, solve,
extract.

Data. Each task's candidates are (device set, layout) pairs: a device set takes, in each node,
nothing or one aligned power-of-two block of its GPUs (GPUs of a type in a node are
interchangeable, so blocks lose nothing but the order); the layout uses the whole set
(dp * pp * tp = |set|). Each candidate is load-balanced and priced by the cost model on its own:
its seconds and the bytes it needs on each device (resident + working; generation: weights and
one max-length sequence of KV cache). Where every node's GPUs are interchangeable, device sets
with blocks of the same sizes in the same nodes are renamings of each other: each such class is
priced once and its candidates renamed for the others (exact). Dominated candidates (same task
and devices, no faster, no less memory) are dropped (``prune_dominated``; exact).

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

Phased solve (the default for sync workflows whose stages are barriers, PPO and GRPO; see
``solve_phased``). With barriers the makespan is the sum of the stages' lengths, and a stage of
at most three tasks lasts exactly its heaviest clique of tasks that share devices. So the same
optimum comes from one model per sharing pattern (which tasks of a stage share devices): tasks
the pattern keeps apart use disjoint devices, and each stage lasts at least every clique's
total. These models need no intervals and, given an incumbent, most candidates cannot be in a
better plan, so they are small and their LP bounds tight. The monolithic model above stays for
async mode and other workflows (and as option ``phased=False``).

The plan found is re-estimated by the full cost model; both numbers, the solver's bound and the
gap are reported. Candidates are priced with generation running alone, so the full cost model
can find co-located plans slower than the ILP objective says (their KV cache is smaller).
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from hetrl.cost.model import CostModel
from hetrl.cost.primitives import node_symmetry
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


def candidates(model: CostModel, load_balance: bool = True, max_sets: int = 4096,
               reuse_symmetric: bool = True) -> dict[str, list[Candidate]]:
    """Every task's priced candidates, in device-set, task and layout order. Where every node's
    GPUs are interchangeable (``node_symmetry``), device sets that take blocks of the same size
    in the same nodes are renamings of each other, and so are their candidates: each such class
    is priced once and the rest renamed (``reuse_symmetric``; on hetero24-two-region 124 classes
    for 4,095 device sets)."""
    wl = model.workload
    out: dict[str, list[Candidate]] = {t: [] for t in wl.task_names}
    usable = model.cluster.topology.memory_bytes * model.params.usable_memory_fraction
    sym = node_symmetry(model.cluster) if reuse_symmetric else None
    priced: dict[tuple[int, ...], tuple[tuple[int, ...], list[Candidate]]] = {}
    for devices in device_sets(model.cluster, max_sets):
        if sym is not None:
            counts = [0] * len(sym[1])
            for d in devices:
                counts[sym[0][d]] += 1
            key = tuple(counts)  # GPUs per node: with one block per node, its size
            hit = priced.get(key)
            if hit is not None:  # the same block sizes in the same nodes: rename
                first, cands = hit
                for c in cands:
                    out[c.task].append(_renamed(c, first, devices))
                continue
        mine = []
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
                mine.append(Candidate(t, devices, p, seconds, need))
        if sym is not None:
            priced[key] = (devices, mine)
        for c in mine:
            out[c.task].append(c)
    return out


def _renamed(c: Candidate, first: tuple[int, ...], devices: tuple[int, ...]) -> Candidate:
    """Candidate ``c`` on device set ``first`` moved to ``devices``: both list their GPUs node by
    node in id order with equal counts per node, so position i of one is position i of the
    other (a renaming within nodes: same seconds, same bytes on the renamed devices)."""
    name = dict(zip(first, devices, strict=True))
    grid = tuple(tuple(tuple(name[d] for d in stage) for stage in replica)
                 for replica in c.placement.devices)
    need = np.zeros_like(c.need)
    need[list(devices)] = c.need[list(first)]
    return Candidate(c.task, devices, replace(c.placement, devices=grid), c.seconds, need)


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


def _users(cands: dict[str, list[Candidate]], n_dev: int) -> dict[str, list[list[int]]]:
    """Per task and device, the indices of the task's candidates that use the device."""
    out = {}
    for t, cs in cands.items():
        used = np.array([c.need > 0 for c in cs]).reshape(len(cs), n_dev)
        out[t] = [np.flatnonzero(used[:, d]).tolist() for d in range(n_dev)]
    return out


def _use_vars(m, x: dict[str, list], users: dict[str, list[list[int]]]
              ) -> dict[tuple[str, int], Any]:
    """Per (task, device) a boolean for the tasks in ``users`` (see :func:`_users`): the
    task's chosen candidate uses the device (absent where no candidate of the task does)."""
    uses = {}
    for t, per_device in users.items():
        for d, idx in enumerate(per_device):
            if idx:
                u = m.NewBoolVar(f"u[{t},{d}]")
                m.Add(sum(x[t][i] for i in idx) == u)
                uses[(t, d)] = u
    return uses


def _memory_constraints(m, cands: dict[str, list[Candidate]], x: dict[str, list],
                        usable: np.ndarray, users: dict[str, list[list[int]]]) -> None:
    """On every device the chosen candidates' needs (whole MB) fit its usable memory."""
    from ortools.sat.python import cp_model

    mb = {t: (np.array([c.need for c in cs]).reshape(len(cs), len(usable)) // 1e6).astype(int)
          for t, cs in cands.items()}
    for d in range(len(usable)):
        lits = [x[t][i] for t in cands for i in users[t][d]]
        coefs = [int(mb[t][i, d]) for t in cands for i in users[t][d]]
        if lits:
            m.Add(cp_model.LinearExpr.WeightedSum(lits, coefs) <= int(usable[d] // 1e6))


def _sync_var(m, model: CostModel, cands: dict[str, list[Candidate]], x: dict[str, list],
              horizon: int):
    """The weight sync after actor training (ms): for each node the generation candidate uses,
    the pull from the nearest node the actor training uses; zero when generation and actor
    training pick the same candidate in sync mode (weights shared in place)."""
    topo = model.cluster.topology
    train_nodes = {}
    for nd in range(len(model.cluster.nodes)):
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
    # actor training's candidates by devices and layout (a dict: 17k x 2.6k pairs on 24 GPUs)
    training: dict[tuple, list] = {}
    for ct, w in zip(cands["actor_training"], x["actor_training"], strict=True):
        training.setdefault(_layout_key(ct), []).append(w)
    for c, v in zip(cands["actor_generation"], x["actor_generation"], strict=True):
        same = training.get(_layout_key(c), [])
        shared = m.NewBoolVar("") if same and model.workload.mode == "sync" else None
        if shared is not None:
            m.AddBoolAnd([v, same[0]]).OnlyEnforceIf(shared)
            m.AddBoolOr([v.Not(), same[0].Not()]).OnlyEnforceIf(shared.Not())
        for _n, row in _sync_pull_ms(model, c).items():
            q = m.NewIntVar(0, big, "")
            m.AddMinEquality(q, [big - (big - ms) * train_nodes[nd] for nd, ms in row.items()])
            ct = m.Add(sync >= q)
            ct.OnlyEnforceIf([v] + ([shared.Not()] if shared is not None else []))
    return sync


def _layout_key(c: Candidate) -> tuple:
    """A candidate's devices and layout (layers per stage included)."""
    p = c.placement
    return c.devices, p.layers_per_stage, p.dp, p.pp, p.tp


def _same_candidate(gen: Candidate, train: Candidate) -> bool:
    """Whether generation and actor training use the same devices in the same layout."""
    return _layout_key(gen) == _layout_key(train)


def sync_ms(model: CostModel, gen: Candidate, train: Candidate) -> int:
    """The weight-sync term of the ILP for one (generation, actor training) pair, ms: what
    :func:`_sync_var` makes of it."""
    if model.workload.mode == "sync" and _same_candidate(gen, train):
        return 0
    node_of = model.cluster.topology.node_of
    train_nodes = {int(node_of[d]) for d in train.devices}
    return max(min(row[nd] for nd in train_nodes) for row in _sync_pull_ms(model, gen).values())


def solve(model: CostModel, cands: dict[str, list[Candidate]], time_limit_s: float | None,
          deterministic_time: float | None, seed: int, workers: int,
          hint: Plan | None = None, lower_bound_s: float | None = None) -> dict[str, Any]:
    """The monolithic model; ``lower_bound_s``: a bound proved elsewhere (added as a cut).
    ``time_limit_s`` counts the model's building too."""
    from ortools.sat.python import cp_model

    began = time.perf_counter()

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
    users = _users(cands, n_dev)  # built once: 74k candidates on hetero24 PPO
    uses = _use_vars(m, x, users)
    per_device: dict[int, list] = {d: [] for d in range(n_dev)}
    for (t, d), u in uses.items():
        per_device[d].append(m.NewOptionalIntervalVar(start[t], dur[t], end[t], u, f"iv[{t},{d}]"))
    # Constraints: devices, memory, precedence.
    for d in range(n_dev):
        if len(per_device[d]) > 1:
            m.AddNoOverlap(per_device[d])
    _memory_constraints(m, cands, x, usable, users)
    for info in wl.tasks:
        for dep in info.depends_on:
            m.Add(start[info.name] >= end[dep])
    sync = _sync_var(m, model, cands, x, horizon)
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
        load = {t: [ms[t][i] * x[t][i] for i in users[t][d]] for t in cands}
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
            work = [ms[t][i] * x[t][i] for t in cands for i in users[t][d]]
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
        for t, cs in cands.items():
            p = hint.placement(t)
            for c, v in zip(cs, x[t], strict=True):
                m.AddHint(v, _matches(c, p))
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


# --- the phased solve: one small model per sharing pattern -----------------------------------


def stages_of(workload) -> tuple[tuple[str, ...], ...] | None:
    """The workflow's stages when they are barriers -- every task of a stage depends on every
    task of the stage before and on nothing else -- with at most three tasks each, the first
    stage being generation alone, in sync mode (PPO and GRPO); None otherwise."""
    if workload.mode != "sync":
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
    ms = {t: int(round(c.seconds * SCALE)) for t, c in chosen.items()}
    pairs = _pairs(stages)
    shared = [not set(chosen[a].devices).isdisjoint(chosen[b].devices) for _, a, b in pairs]
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
    usable = model.cluster.topology.memory_bytes * model.params.usable_memory_fraction
    ms = {t: [int(round(c.seconds * SCALE)) for c in cs] for t, cs in cands.items()}
    horizon = sum(max(v) for v in ms.values()) * 2 + 10**6
    m = cp_model.CpModel()
    x = {t: [m.NewBoolVar(f"x[{t},{i}]") for i in range(len(cs))] for t, cs in cands.items()}
    dur = {}
    for t in cands:
        m.AddExactlyOne(x[t])
        dur[t] = m.NewIntVar(min(ms[t]), max(ms[t]), f"dur[{t}]")
        m.Add(dur[t] == sum(k * v for k, v in zip(ms[t], x[t], strict=True)))
    users = _users(cands, n_dev)
    _memory_constraints(m, cands, x, usable, users)
    apart = {t for (_, a, b), on in zip(pairs, shared, strict=True) if not on for t in (a, b)}
    uses = _use_vars(m, x, {t: u for t, u in users.items() if t in apart})
    for (_, a, b), on in zip(pairs, shared, strict=True):
        if not on:
            for d in range(n_dev):
                if (a, d) in uses and (b, d) in uses:
                    m.AddBoolOr([uses[(a, d)].Not(), uses[(b, d)].Not()])
    sync = _sync_var(m, model, cands, x, horizon)
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
    return m, x


def _matches(c: Candidate, p: TaskPlacement) -> bool:
    """Whether candidate ``c`` has placement ``p``'s devices and (dp, pp, tp)."""
    return c.devices == tuple(sorted(p.device_ids)) and (
        c.placement.dp, c.placement.pp, c.placement.tp) == (p.dp, p.pp, p.tp)


def _candidate_of(cands: dict[str, list[Candidate]], plan: Plan) -> dict[str, Candidate] | None:
    """Each task's candidate with the plan's devices and layout, if all have one."""
    out = {}
    for t, cs in cands.items():
        p = plan.placement(t)
        match = [c for c in cs if _matches(c, p)]
        if not match:
            return None
        out[t] = match[0]
    return out


def _fits(model: CostModel, chosen: dict[str, Candidate]) -> bool:
    """Whether the candidates' needs fit every device under the ILP's memory rule."""
    usable = model.cluster.topology.memory_bytes * model.params.usable_memory_fraction
    mb = sum(np.array([int(b // 1e6) if b > 0 else 0 for b in c.need]) for c in chosen.values())
    return bool(np.all(mb <= np.array([int(u // 1e6) for u in usable])))


def solve_phased(model: CostModel, cands: dict[str, list[Candidate]],
                 stages: tuple[tuple[str, ...], ...], time_limit_s: float | None,
                 deterministic_time: float | None, seed: int, workers: int,
                 hint: Plan | None = None, deepen: float = 1.1) -> dict[str, Any]:
    """The sync ILP of a workflow with barrier stages (:func:`stages_of`), solved exactly as one
    small model per sharing pattern (which tasks of a stage share devices; 2^pairs patterns,
    16 for PPO, 2 for GRPO). The optimum is the best pattern's. A pattern's model needs no
    intervals, and with an incumbent U most candidates cannot be in a better plan
    (:func:`_prune_for_pattern`), so each model is small and its LP bound tight: the
    monolithic model (:func:`solve`) proved hetero16 PPO in 38 s and hetero24 PPO not in
    180 s; this proves the first in seconds.

    Patterns are taken in the order of their lower bounds. Each is deepened: solved with the
    cut objective <= T for T from ``deepen`` x its bound up to U - 1 (growing by ``deepen``),
    so the first models are small; a solution found lowers U, a model proved infeasible
    raises the pattern's bound to T + 1. A pattern is settled when its bound reaches U. A
    first pass gives each pattern an equal share of the time left; a second gives the ones
    left unsettled the rest. The reported bound is the least over the patterns; the status
    OPTIMAL when every pattern is settled."""
    from ortools.sat.python import cp_model

    clock = time.perf_counter()
    ms = {t: [int(round(c.seconds * SCALE)) for c in cs] for t, cs in cands.items()}
    for t, cs in cands.items():
        if not cs:
            raise HetrlError(f"ilp: task {t} has no candidate that fits in memory")
    pairs = _pairs(stages)
    patterns = [tuple(p) for p in itertools.product((True, False), repeat=len(pairs))]
    cliques = {p: _stage_cliques(stages, pairs, p) for p in patterns}
    lower = {p: _prune_for_pattern(ms, stages, cliques[p], 2**62)[1] for p in patterns}
    best: dict[str, Candidate] | None = None
    upper = 2**62  # the incumbent's objective (ms)
    for start in ([_candidate_of(cands, hint)] if hint is not None else []) + [
            greedy_fallback(model, cands)]:
        if start is not None and _fits(model, start):
            value = phased_objective_ms(model, start, stages)
            if value < upper:
                best, upper = start, value
    source = "hint or greedy" if best is not None else None
    settled: set = set()
    det = 0.0
    models = 0

    def left(limit: float | None, used: float) -> float | None:
        return None if limit is None else max(limit - used, 0.0)

    def attempt(p, share: int) -> None:
        """Deepen pattern ``p`` within 1/``share`` of the time left."""
        nonlocal best, upper, source, det, models
        began = time.perf_counter()
        t_left, d_left = left(time_limit_s, began - clock), left(deterministic_time, det)
        t_cap = None if t_left is None else t_left / share
        d_cap = None if d_left is None else d_left / share
        spent_d = 0.0
        while lower[p] < upper:
            target = min(upper - 1, max(int(lower[p] * deepen), lower[p]))
            keep, bound = _prune_for_pattern(ms, stages, cliques[p], target)
            if keep is None or bound > target:
                lower[p] = target + 1
                continue
            if (t_cap is not None and time.perf_counter() - began >= t_cap) or (
                    d_cap is not None and spent_d >= d_cap):
                return
            # no hint: the incumbent breaks the cut (objective <= T < U) by construction
            sub = {t: [cands[t][i] for i in keep[t]] for t in cands}
            m, x = _pattern_model(model, sub, stages, pairs, p, cliques[p], target)
            solver = cp_model.CpSolver()
            solver.parameters.random_seed = seed
            solver.parameters.num_workers = workers
            if t_cap is not None:  # the model's building counts too
                solver.parameters.max_time_in_seconds = max(t_cap - (time.perf_counter() - began),
                                                            0.01)
            if d_cap is not None:
                solver.parameters.max_deterministic_time = max(d_cap - spent_d, 1e-3)
            status = solver.Solve(m)
            models += 1
            spent_d += solver.response_proto.deterministic_time
            det += solver.response_proto.deterministic_time
            if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
                value = int(round(solver.ObjectiveValue()))
                if value < upper:
                    upper, source = value, "solver"
                    best = {t: next(c for c, v in zip(cs, x[t], strict=True) if solver.Value(v))
                            for t, cs in sub.items()}
                if status == cp_model.OPTIMAL:
                    lower[p] = max(lower[p], value)
                    settled.add(p)
                    return
                lower[p] = max(lower[p], int(math.ceil(solver.BestObjectiveBound())))
                return  # out of time with a solution: the bound stands
            if status == cp_model.INFEASIBLE:
                lower[p] = target + 1
                continue
            lower[p] = max(lower[p], min(int(math.ceil(solver.BestObjectiveBound())), target))
            return  # out of time without a solution

    order = sorted(patterns, key=lambda p: lower[p])
    for _ in range(2):
        todo = [p for p in order if p not in settled and lower[p] < upper]
        for i, p in enumerate(todo):
            attempt(p, len(todo) - i)
            if lower[p] >= upper:
                settled.add(p)
    if best is None:
        raise _NoSolution("UNKNOWN")
    bound = min([upper] + [lower[p] for p in patterns if lower[p] < upper])
    return {
        "chosen": best,
        "status": "OPTIMAL" if bound >= upper else "FEASIBLE",
        "objective_s": upper / SCALE,
        "bound_s": bound / SCALE,
        "solve_s": time.perf_counter() - clock,
        "variables": sum(len(v) for v in cands.values()),
        "patterns": len(patterns),
        #: per pattern (sharing flags of ``_pairs(stages)``), its lower bound (s) and whether settled
        "pattern_bounds": {p: (lower[p] / SCALE, p in settled or lower[p] >= upper)
                           for p in patterns},
        "models": models,
        "incumbent": source,
    }


def solve_staged(model: CostModel, cands: dict[str, list[Candidate]],
                 stages: tuple[tuple[str, ...], ...], time_limit_s: float | None,
                 deterministic_time: float | None, seed: int, workers: int,
                 hint: Plan | None = None, phased_share: float = 0.15) -> dict[str, Any]:
    """The phased solve with ``phased_share`` of the limits; if it has not proved its plan
    optimal, the monolithic model with the rest, hinted with the phased incumbent and cut
    below by the phased bound. The better plan and the higher bound are reported. (Measured,
    hetero24-two-region PPO, 180 s: the phased solve alone found no plan better than the
    greedy one (631 s, bound 136 s) -- its hard patterns, training on disjoint GPUs, need an
    incumbent to prune with; the monolithic model alone finds 192.7 s (bound 159.8 s) in
    180 s, 229.0 s (bound 157.8 s) in the 75% left by a share of 0.25, 190.9 s (bound 159.9 s)
    in the 85% left by 0.15 -- which still proves hetero16 PPO (13.6 s) and hetero24 GRPO.)"""
    clock = time.perf_counter()

    def part(limit: float | None, share: float, used: float) -> float | None:
        return None if limit is None else max(limit * share - used, 0.0)

    first: dict[str, Any] | None = None
    try:
        first = solve_phased(model, cands, stages, part(time_limit_s, phased_share, 0.0),
                             part(deterministic_time, phased_share, 0.0), seed, workers, hint)
    except _NoSolution:
        pass
    if first is not None and first["status"] == "OPTIMAL":
        return first
    spent = time.perf_counter() - clock
    # hinted with the phased plan only if a solver found it: a greedy plan as the hint kept
    # CP-SAT on it (measured, hetero24 PPO, 120 s: 630.9 s hinted, 234.2 s without)
    found = first is not None and first["incumbent"] == "solver"
    start = plan_from(model.workload, first["chosen"]) if found else hint
    try:
        second = solve(model, cands, part(time_limit_s, 1.0, spent),
                       None if deterministic_time is None
                       else deterministic_time * (1 - phased_share),
                       seed, workers, start, None if first is None else first["bound_s"])
    except _NoSolution:
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
        # sync workflows with barrier stages (PPO, GRPO): one small model per sharing pattern
        stages = stages_of(ev.workload) if self.options.get("phased", True) else None
        try:
            if stages is not None:
                out = solve_staged(ev.model, cands, stages, left, det, b.seed, b.workers,
                                   self.options.get("hint"))
            else:
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
            "ilp_method": "phased" if stages is not None else "monolithic",
            "ilp_models": out.get("models"),
        }
