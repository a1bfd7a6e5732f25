"""Pricing a neighbourhood of plans at once (docs/search.md, "Pricing a neighbourhood").

A search's moves change one task or a few at a time: a sweep over one task's options, the turns
of a split, a screen of splits. Such plans differ from one another in the same few placements;
what :meth:`CostModel.estimate <hetrl.cost.model.CostModel.estimate>` recomputes for each is
mostly the memory of the moved tasks' groups (the KV budget the rollout engine gets depends on
every co-located task's bytes) and, in the group that holds it, the generation task under that
budget. :func:`price_plans` prices them together: each moved group's memory rows for all the
plans as arrays (the operations and their order of :func:`~hetrl.cost.kernels.
group_memory_rows`, element by element, so the bytes are equal to the last bit), the generation
task once per distinct KV budget where it stays, and the rest of each plan through the cost
model's own :meth:`~hetrl.cost.model.CostModel.timing`. The answers (seconds per iteration,
whether the plan fits) are bit-equal to the scalar path's (tests/cost/test_neighbourhood.py);
plans of another structure than the first go through the scalar path. A speed-up only: no
formula lives here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from hetrl.cost.group_memory import GroupResult, copy_names
from hetrl.cost.model import Timing, plan_key
from hetrl.cost.result import Estimate, TaskResult
from hetrl.plan import Plan, TaskPlacement
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.workload import WorkloadSpec


@runtime_checkable
class NeighbourhoodHost(Protocol):
    """What :func:`price_plans` reads of the :class:`~hetrl.cost.model.CostModel` it prices
    with: its memo tables and the terms the scalar path computes through (a speed-up beside
    the facade, as its mixins are; tests/cost/test_hosts.py checks the list)."""

    workload: WorkloadSpec
    cluster: ClusterSpec
    #: estimates made (price_plans counts one per plan)
    evaluations: int
    #: this cost model's own tables (memo.OwnTables), the plans' estimates and briefs
    _own: Any
    _plans: dict
    _briefs: dict
    #: per task: (kind, role, model copy name)
    _info: dict[str, tuple[str, str, str]]
    #: usable bytes per device (memory x usable_memory_fraction), read-only
    _mem_bytes: np.ndarray

    def estimate(self, plan: Plan, check: bool = True) -> Estimate: ...

    def clear_memos(self) -> None: ...

    def timing(self, plan: Plan, gen_result: TaskResult, devices: dict[str, frozenset[int]]
               ) -> Timing: ...

    def generation_cost(self, p: TaskPlacement, kv_budget: np.ndarray) -> TaskResult: ...

    def _structure(self, plan: Plan) -> tuple[tuple[str, ...],
                                              list[tuple[list[int], tuple[str, ...]]]]: ...

    def _group(self, placements: tuple[TaskPlacement, ...], copies: tuple[str, ...]
               ) -> GroupResult: ...

    def _slots(self, p: TaskPlacement) -> np.ndarray: ...

    def _kv_pool(self, gen: TaskPlacement, left: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True, slots=True)
class Brief:
    """What a search reads of a plan's estimate: its seconds per iteration and whether it fits
    (in memory, and no task violates a limit)."""

    iteration_s: float
    feasible: bool


def price_plans(model: NeighbourhoodHost, plans: Sequence[Plan]) -> list[Brief]:
    """The :class:`Brief` of each of ``plans`` (valid plans of ``model``'s workload and
    cluster), equal to what ``model.estimate(plan)`` says of it. Plans of the first unpriced
    plan's structure (task groups, relay) are priced together, batched by the placements in
    which they differ from it (see the module's text); any other through
    :meth:`~hetrl.cost.model.CostModel.estimate`. Counts one estimate of ``model`` per plan."""
    model.evaluations += len(plans)
    if model._own.full():
        model.clear_memos()
    out: list[Brief | None] = [None] * len(plans)
    todo: dict = {}  # plan key -> indices of the plans with that key, not yet priced
    for i, key in enumerate(map(plan_key, plans)):
        brief = model._briefs.get(key)
        if brief is None:
            est = model._plans.get(key)
            if est is not None:
                brief = Brief(est.iteration_s, est.feasible)
        if brief is not None:
            out[i] = brief
        else:
            todo.setdefault(key, []).append(i)
    if todo:
        briefs = _price_distinct(model, [plans[idx[0]] for idx in todo.values()])
        for (key, idx), brief in zip(todo.items(), briefs, strict=True):
            model._briefs[key] = brief
            for j in idx:
                out[j] = brief
    return out  # type: ignore[return-value]


def _price_distinct(model: NeighbourhoodHost, plans: list[Plan]) -> list[Brief]:
    """:func:`price_plans` of distinct plans none of which is in the memo tables: batched by
    the placements in which they differ from the first (and those placements' backends)."""
    ref = plans[0]
    n = len(ref.placements)
    moved: dict[tuple, list[int]] = {}  # (indices moved, their backends) -> plans
    alone: list[int] = []
    for i, plan in enumerate(plans):
        if i == 0:
            continue
        if plan.groups != ref.groups or plan.sync_relay != ref.sync_relay \
                or len(plan.placements) != n:
            alone.append(i)
            continue
        diff = tuple([j for j, (a, b) in enumerate(zip(plan.placements, ref.placements,
                                                       strict=True)) if a is not b and a != b])
        moved.setdefault((diff, tuple([plan.placements[j].backend for j in diff])),
                         []).append(i)
    # the reference joins the first batch whose moved placements have its backends
    for (ks, backends), members in moved.items():
        if tuple([ref.placements[j].backend for j in ks]) == backends:
            members.insert(0, 0)
            break
    else:
        moved[((0,), (ref.placements[0].backend,))] = [0]
    out: list[Brief | None] = [None] * len(plans)
    for (ks, _), members in moved.items():
        for i, brief in zip(members, _price_moves(model, [plans[i] for i in members], ks),
                            strict=True):
            out[i] = brief
    for i in alone:
        out[i] = _scalar(model, plans[i])
    return out  # type: ignore[return-value]


def _scalar(model: NeighbourhoodHost, plan: Plan) -> Brief:
    est = model.estimate(plan, check=False)
    model.evaluations -= 1  # (counted by price_plans)
    return Brief(est.iteration_s, est.feasible)


def _price_moves(model: NeighbourhoodHost, plans: list[Plan], ks: tuple[int, ...]
                 ) -> list[Brief]:
    """Plans of one structure that differ in placements ``ks`` only (each of one backend
    there), each priced."""
    first = plans[0]
    _, structure = model._structure(first)
    pl = first.placements
    moving = {g for g, (gi, _) in enumerate(structure) if any(k in gi for k in ks)}
    # the other groups' results, unchanged by the moves (memo hits after the first plan)
    fixed = {g: model._group(tuple([pl[i] for i in gi]), gn)
             for g, (gi, gn) in enumerate(structure) if g not in moving}
    taken = np.zeros(model.cluster.num_devices, dtype=bool)
    for res in fixed.values():
        if taken[res.peak_ids].any():  # groups that overlap: the whole plan is one group
            return [_scalar(model, p) for p in plans]
        taken[res.peak_ids] = True
    overlapping = np.zeros(len(plans), dtype=bool)
    over = np.zeros(len(plans), dtype=bool)
    generation = None
    used_so_far = np.broadcast_to(taken, (len(plans), taken.size))
    for g in sorted(moving):
        idx, names = structure[g]
        (need, _, _, _, kv_left, used), gen_at = _moved_group_rows(model, plans, ks, idx, names)
        # a move whose devices reach another group's: the scalar path prices it as one group
        overlapping |= (used & used_so_far).any(axis=1)
        used_so_far = used_so_far | used
        over |= (used & (need > model._mem_bytes)).any(axis=1)
        if gen_at >= 0:
            generation = _generations(model, plans, ks, idx, gen_at, kv_left)
    fixed_over = any(res.over.size for res in fixed.values())
    if generation is None:
        gen_result = [res.generation for res in fixed.values() if res.generation is not None][0]
        generation = [gen_result] * len(plans)
    fixed_sets = {i: frozenset(pl[i].device_ids) for g in moving for i in structure[g][0]
                  if i not in ks}
    out = []
    for n, plan in enumerate(plans):
        if overlapping[n]:
            out.append(_scalar(model, plan))
            continue
        devices: dict[str, frozenset[int]] = {}
        for g, (gi, _) in enumerate(structure):
            if g in fixed:
                devices.update(fixed[g].device_sets)
            else:
                for i in gi:
                    p = plan.placements[i]
                    s = fixed_sets.get(i)
                    devices[p.task] = frozenset(p.device_ids) if s is None else s
        timing = model.timing(plan, generation[n], devices)
        violated = any(r.violations for r in timing.results.values())
        out.append(Brief(timing.iteration_s, not (bool(over[n]) or fixed_over or violated)))
    return out


def _moved_group_rows(model: NeighbourhoodHost, plans: list[Plan], ks: tuple[int, ...],
                      idx: list[int], names: tuple[str, ...]
                      ) -> tuple[tuple[np.ndarray, ...], int]:
    """A task group's memory rows for every plan (arrays of plans x devices; its placements
    ``idx``, those of ``ks`` differing from plan to plan): (need, trained states, working set,
    resident, the KV budget left, used), as :func:`~hetrl.cost.kernels.group_memory_rows`
    computes them (its operations, in its order: states summed in placement order, a copy's
    weights the largest of its placements', the copies' weights summed in copy order), and the
    generation placement's index in the group (-1: none)."""
    wl = model.workload
    first = plans[0].placements
    members = [first[i] for i in idx]
    copy_of = [names.index(c) for c in copy_names(members, model._info)]
    tasks = [p.task for p in members]
    gen_at = tasks.index("actor_generation") if "actor_generation" in tasks else -1
    async_mode = wl.mode == "async"
    sleeps = wl.mode == "sync" and wl.gen_sleep_level > 0 and gen_at >= 0
    d = model.cluster.num_devices
    dense = []  # per group member: its (weights, states, working, KV per sequence, used) rows
    for i, p in zip(idx, members, strict=True):
        if i in ks:  # (plans x 5 x devices, rows first)
            rows = np.zeros((len(plans), 5, d))
            for n, plan in enumerate(plans):
                q = plan.placements[i]
                rows[n][:, q.device_array] = model._slots(q)
            dense.append(rows.transpose(1, 0, 2))
        else:
            rows = np.zeros((5, 1, d))
            rows[:, 0, p.device_array] = model._slots(p)
            dense.append(rows)
    by_copy: list = [None] * len(names)
    awake: list = [None] * len(names)
    states = working = used = None
    for j, rows in enumerate(dense):
        c = copy_of[j]
        w = rows[0]
        by_copy[c] = w if by_copy[c] is None else np.maximum(by_copy[c], w)
        if sleeps and j != gen_at:
            awake[c] = w if awake[c] is None else np.maximum(awake[c], w)
        if j == 0:
            states, working, used = rows[1], rows[2], rows[4] > 0
        else:
            states = states + rows[1]
            working = np.maximum(working, rows[2])
            used = used | (rows[4] > 0)
    weights = 0.0
    for w in by_copy:
        weights = weights + w
    resident = weights + states
    kv = model._mem_bytes - resident
    if async_mode:
        kv = kv - working
    if sleeps:
        others = 0.0
        for w in awake:
            others = others + (w if w is not None else 0.0)
        need = np.maximum(others + states + working, resident)
    else:
        need = resident + working
    shape = (len(plans), d)
    return tuple(np.broadcast_to(a, shape) for a in (need, states, working, resident, kv,
                                                      used)), gen_at


def _generations(model: NeighbourhoodHost, plans: list[Plan], ks: tuple[int, ...], idx: list[int],
                 gen_at: int, kv_left: np.ndarray) -> list[TaskResult]:
    """The generation task's result in each plan, under the KV budget its group leaves it
    (``kv_left``: bytes per device, one row per plan): where the rollout stays, one priced per
    distinct budget."""
    gi = idx[gen_at]
    if gi not in ks:  # the rollout stays: its KV pool cap is one array, the budgets one array op
        gen = plans[0].placements[gi]
        pools = model._kv_pool(gen, kv_left)
        seen: dict[bytes, TaskResult] = {}
        stage = pools[:, gen.device_array]
        out = []
        for n in range(len(plans)):
            key = stage[n].tobytes()
            res = seen.get(key)
            if res is None:
                res = seen[key] = model.generation_cost(gen, pools[n])
            out.append(res)
        return out
    return [model.generation_cost(p.placements[gi], model._kv_pool(p.placements[gi], kv_left[n]))
            for n, p in enumerate(plans)]


__all__ = ["Brief", "NeighbourhoodHost", "price_plans"]
