"""CP-SAT pieces both ILP solvers share: choice variables, memory, the weight sync, and turning
a choice of candidates back into a plan (the "variables", "constraints" and "extract" phases of
OR-tools' job-shop example). Durations are integer milliseconds (``SCALE`` per second), memory
whole MB."""

from __future__ import annotations

from typing import Any

import numpy as np

from hetrl.cost.model import CostModel
from hetrl.errors import HetrlError
from hetrl.plan import Plan, TaskGroup, TaskPlacement
from hetrl.search.ilp.data import SCALE, Candidate
from hetrl.spec.tasks import COLOCATED_WITH


class NoSolution(Exception):
    """CP-SAT found no solution within its limits (the status name is the message)."""


def check_nonempty(cands: dict[str, list[Candidate]]) -> None:
    """Fail fast, naming the task, when a task has no candidate that fits in memory alone."""
    for t, cs in cands.items():
        if not cs:
            raise HetrlError(f"ilp: task {t} has no candidate that fits in memory")


def durations_ms(cands: dict[str, list[Candidate]]) -> dict[str, list[int]]:
    """Each candidate's seconds as integer milliseconds."""
    return {t: [int(round(c.seconds * SCALE)) for c in cs] for t, cs in cands.items()}


def memory_mb(cands: dict[str, list[Candidate]], n_dev: int) -> dict[str, np.ndarray]:
    """Per task, the candidates' needs in whole MB, an (candidates, devices) integer array."""
    return {t: (np.array([c.need for c in cs]).reshape(len(cs), n_dev) // 1e6).astype(np.int64)
            for t, cs in cands.items()}


def usable_mb(model: CostModel) -> np.ndarray:
    """Each device's usable memory in whole MB."""
    usable = model.cluster.topology.memory_bytes * model.params.usable_memory_fraction
    return (usable // 1e6).astype(np.int64)


def choice_vars(m, cands: dict[str, list[Candidate]]) -> dict[str, list]:
    """A boolean per (task, candidate), exactly one per task."""
    x = {t: [m.NewBoolVar(f"x[{t},{i}]") for i in range(len(cs))] for t, cs in cands.items()}
    for t in cands:
        m.AddExactlyOne(x[t])
    return x


def users(cands: dict[str, list[Candidate]], n_dev: int) -> dict[str, list[list[int]]]:
    """Per task and device, the indices of the task's candidates that use the device."""
    out = {}
    for t, cs in cands.items():
        used = np.array([c.need > 0 for c in cs]).reshape(len(cs), n_dev)
        out[t] = [np.flatnonzero(used[:, d]).tolist() for d in range(n_dev)]
    return out


def use_vars(m, x: dict[str, list], users_: dict[str, list[list[int]]]
             ) -> dict[tuple[str, int], Any]:
    """Per (task, device) a boolean for the tasks in ``users_`` (see :func:`users`): the task's
    chosen candidate uses the device (absent where no candidate of the task does)."""
    uses = {}
    for t, per_device in users_.items():
        for d, idx in enumerate(per_device):
            if idx:
                u = m.NewBoolVar(f"u[{t},{d}]")
                m.Add(sum(x[t][i] for i in idx) == u)
                uses[(t, d)] = u
    return uses


def memory_constraints(m, model: CostModel, cands: dict[str, list[Candidate]],
                       x: dict[str, list], users_: dict[str, list[list[int]]]) -> None:
    """On every device the chosen candidates' needs (whole MB) fit its usable memory (whole MB);
    co-located models are counted separately (conservative)."""
    from ortools.sat.python import cp_model

    cap = usable_mb(model)
    mb = memory_mb(cands, len(cap))
    for d in range(len(cap)):
        lits = [x[t][i] for t in cands for i in users_[t][d]]
        coefs = [int(mb[t][i, d]) for t in cands for i in users_[t][d]]
        if lits:
            m.Add(cp_model.LinearExpr.WeightedSum(lits, coefs) <= int(cap[d]))


def colocation_constraints(m, x: dict[str, list], users_: dict[str, list[list[int]]]) -> None:
    """A task that must share its host's group (``COLOCATED_WITH``) uses only devices its host's
    chosen candidate uses."""
    for t, host in COLOCATED_WITH.items():
        if t in x and host in x:
            for d, idx in enumerate(users_[t]):
                if idx:
                    m.Add(sum(x[t][i] for i in idx) <= sum(x[host][j] for j in users_[host][d]))


def colocated(chosen: dict[str, Candidate], cands: dict[str, list[Candidate]]
              ) -> dict[str, Candidate]:
    """``chosen`` with each task of ``COLOCATED_WITH`` moved, if it is not on its host's devices,
    to its fastest candidate on them (left as it is when it has none there)."""
    out = dict(chosen)
    for t, host in COLOCATED_WITH.items():
        if t in out and host in out and not set(out[t].devices) <= set(out[host].devices):
            inside = [c for c in cands[t] if set(c.devices) <= set(out[host].devices)]
            if inside:
                out[t] = min(inside, key=lambda c: c.seconds)
    return out


def fits(model: CostModel, chosen: dict[str, Candidate]) -> bool:
    """Whether one candidate per task fits every device under :func:`memory_constraints`."""
    cap = usable_mb(model)
    used = sum(memory_mb({t: [c]}, len(cap))[t][0] for t, c in chosen.items())
    return bool(np.all(used <= cap))


# --- the weight sync after actor training -----------------------------------------------------


def sync_pull_ms(model: CostModel, gen: Candidate) -> dict[int, dict[int, int]]:
    """For each node the generation candidate uses: ms to pull its shard (its largest stage's
    weight bytes on the node) from each node, first GPU to first GPU (the second GPU inside one
    node): latency + bytes / (bandwidth x link efficiency)."""
    topo = model.cluster.topology
    shapes = model.shapes(gen.task, gen.placement)
    shard: dict[int, float] = {}
    for replica in gen.placement.devices:
        for s, stage in zip(shapes, replica, strict=True):
            for d in stage:
                node = int(topo.node_of[d])
                shard[node] = max(shard.get(node, 0.0), s.weight_bytes)
    first: dict[int, list[int]] = {}
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


def layout_key(c: Candidate) -> tuple:
    """A candidate's devices and layout (layers per stage and backend included: an FSDP
    trainer's shards are never shared in place)."""
    p = c.placement
    return c.devices, p.layers_per_stage, p.dp, p.pp, p.tp, p.backend


def sync_ms(model: CostModel, gen: Candidate, train: Candidate) -> int:
    """The weight sync (ms) after actor training for one (generation, actor training) pair: zero
    when both pick the same devices and layout in sync mode (weights shared in place), else for
    every node generation uses the quickest pull from a node training uses, the slowest of
    those. :func:`sync_var` is its CP-SAT form."""
    if model.workload.mode == "sync" and layout_key(gen) == layout_key(train):
        return 0
    node_of = model.cluster.topology.node_of
    train_nodes = {int(node_of[d]) for d in train.devices}
    return max(min(row[nd] for nd in train_nodes) for row in sync_pull_ms(model, gen).values())


def sync_var(m, model: CostModel, cands: dict[str, list[Candidate]], x: dict[str, list],
             horizon: int):
    """An integer variable >= :func:`sync_ms` of the chosen generation and actor training."""
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
    # actor training's candidates by devices and layout (a dict, not a scan per pair)
    training: dict[tuple, list] = {}
    for ct, w in zip(cands["actor_training"], x["actor_training"], strict=True):
        training.setdefault(layout_key(ct), []).append(w)
    for c, v in zip(cands["actor_generation"], x["actor_generation"], strict=True):
        same = training.get(layout_key(c), [])
        shared = m.NewBoolVar("") if same and model.workload.mode == "sync" else None
        if shared is not None:
            m.AddBoolAnd([v, same[0]]).OnlyEnforceIf(shared)
            m.AddBoolOr([v.Not(), same[0].Not()]).OnlyEnforceIf(shared.Not())
        for _n, row in sync_pull_ms(model, c).items():
            q = m.NewIntVar(0, big, "")
            m.AddMinEquality(q, [big - (big - ms) * train_nodes[nd] for nd, ms in row.items()])
            ct = m.Add(sync >= q)
            ct.OnlyEnforceIf([v] + ([shared.Not()] if shared is not None else []))
    return sync


# --- plans in and out ----------------------------------------------------------------------------


def matches(c: Candidate, p: TaskPlacement) -> bool:
    """Whether candidate ``c`` has placement ``p``'s devices, (dp, pp, tp) and backend."""
    q = c.placement
    return c.devices == tuple(sorted(p.device_ids)) and (
        q.dp, q.pp, q.tp, q.backend, q.offload) == (p.dp, p.pp, p.tp, p.backend, p.offload)


def candidate_of(cands: dict[str, list[Candidate]], plan: Plan) -> dict[str, Candidate] | None:
    """Each task's candidate with the plan's devices and layout, if all have one."""
    out = {}
    for t, cs in cands.items():
        p = plan.placement(t)
        match = [c for c in cs if matches(c, p)]
        if not match:
            return None
        out[t] = match[0]
    return out


def chosen_of(solver, cands: dict[str, list[Candidate]], x: dict[str, list]
              ) -> dict[str, Candidate]:
    """The candidate each task's solution picks."""
    return {t: next(c for c, v in zip(cs, x[t], strict=True) if solver.Value(v))
            for t, cs in cands.items()}


def add_hint(m, cands: dict[str, list[Candidate]], x: dict[str, list], hint: Plan) -> None:
    """Hint each task's candidate with the plan's devices and layout (none where it has none)."""
    for t, cs in cands.items():
        p = hint.placement(t)
        for c, v in zip(cs, x[t], strict=True):
            m.AddHint(v, matches(c, p))


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
            return colocated(chosen, cands)
    return colocated({t: min(cs, key=lambda c: (c.devices != full, c.seconds))
                      for t, cs in cands.items()}, cands)


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
