"""SHA-EA's warm start (our addition to the paper's method): the device structures of the cheap
heuristics HetRL's space contains, as starting points of its search.

A search must never lose to a plan inside its own space that a cheap rule finds. Each
:class:`Start` fixes levels 1-3 of a genotype (task grouping, group sizes, which GPUs in which
order; the GPUs after the last group idle); the arm that receives it picks each task's layout
by its rule of thumb and the warm start then tunes the layouts by coordinate descent with the
true cost model (:meth:`hetrl.search.ea.Arm.tune`). The starts:

- ``colocated``: every task on every GPU (verl's hybrid engine);
- ``types``: every task on the GPUs of one GPU type, then of the k fastest types (peak bf16
  FLOP/s), the rest idle -- "only the fastest GPU type";
- ``region``: every task on one region's GPUs (its edge nodes left out), for the regions with
  the most peak FLOP/s -- "only the best-connected region" -- and on that region grown by the
  best-connected regions to 2, 4, 8, ... regions (:func:`region_sets`);
- ``verl`` / ``verl-async``: verl's pool structures (the actor's tasks on the first k nodes in
  id order, the rest on the others; generation alone in the async mode) as
  :func:`hetrl.search.pools.verl_pools` makes them, on all GPUs and on the k fastest GPU types
  alone;
- ``streamrl``: StreamRL's two homogeneous single-region pools of whole nodes
  (:func:`hetrl.search.pools.streamrl_pools`), largest first.

The three pool families are interleaved (each family's first structure, then each one's
second, ...), so a warm start that can afford to price only some of them prices each family's
most capable structures.

The baselines' own layouts come from their own searches; here the layouts are tuned by the
arm, with the load balancer, so the start is at least as strong a use of the same GPUs once
tuned (the floor in the benchmark experiments/bench_floor.py checks this).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hetrl.search.base import INFEASIBLE_PENALTY_S, Evaluator
from hetrl.search.pools import streamrl_pools, verl_pools
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.workload import WorkloadSpec

if TYPE_CHECKING:
    from hetrl.search.ea import Arm
    from hetrl.search.options import SHAOptions, WarmStartOptions

#: at most this many regions get a ``region`` start (those with the most peak FLOP/s)
MAX_REGION_STARTS = 4
#: at most this many starts of each pool family (verl, verl-async, streamrl), in their order
MAX_POOL_STARTS = 64


@dataclass(frozen=True)
class Start:
    """Levels 1-3 of a genotype: ``groups`` (canonical: tasks in workflow order, groups by
    their first task), ``sizes`` and ``order`` (each group's GPUs in turn, then the idle ones)."""

    name: str
    groups: tuple[tuple[str, ...], ...]
    sizes: tuple[int, ...]
    order: tuple[int, ...]

    @property
    def key(self) -> tuple:
        """What makes two starts the same plan structure (GPU sets, not their order)."""
        out, at = [], 0
        for n in self.sizes:
            out.append(frozenset(self.order[at:at + n]))
            at += n
        return (self.groups, tuple(out))


def from_pools(name: str, workload: WorkloadSpec, cluster: ClusterSpec,
               pools: list[tuple[tuple[str, ...], tuple[int, ...]]]) -> Start:
    """A start from task pools (task names, device ids), in canonical group order."""
    rank = {t: i for i, t in enumerate(workload.task_names)}
    canon = sorted(((tuple(sorted(tasks, key=rank.__getitem__)), tuple(devices))
                    for tasks, devices in pools), key=lambda p: rank[p[0][0]])
    used = [d for _, devices in canon for d in devices]
    taken = set(used)
    idle = [d for d in range(cluster.num_devices) if d not in taken]
    return Start(name, tuple(t for t, _ in canon), tuple(len(d) for _, d in canon),
                 tuple(used + idle))


def region_sets(cluster: ClusterSpec) -> list[tuple[str, tuple[str, ...]]]:
    """(name, regions) of the region starts: from each of the ``MAX_REGION_STARTS`` regions
    with the most peak FLOP/s (edge nodes left out), that region alone, then grown one region
    at a time by the best link to the set (least latency, then most bandwidth), taking the sets
    of 2, 4, 8, ... regions short of all of them. None on a one-region cluster without edges."""
    devices = cluster.devices
    if len(cluster.regions) == 1 and not any(d.edge for d in devices):
        return []
    power: dict[str, float] = {}
    for d in devices:
        if not d.edge:
            power[d.region] = power.get(d.region, 0.0) + d.gpu.flops
    link: dict[tuple[str, str], tuple[float, float]] = {}
    for rl in cluster.region_links:
        link[(rl.a, rl.b)] = link[(rl.b, rl.a)] = (rl.latency_ms, -rl.bandwidth_gbps)
    out = []
    for seed in sorted(power, key=lambda r: (-power[r], r))[:MAX_REGION_STARTS]:
        chosen = [seed]
        out.append((f"region {seed}", (seed,)))
        while len(chosen) < len(power) - 1:
            rest = [r for r in power if r not in chosen]
            nxt = min(rest, key=lambda r: (min(link.get((c, r), (math.inf, 0.0))
                                               for c in chosen), r))
            chosen.append(nxt)
            if len(chosen) & (len(chosen) - 1) == 0:  # a power of two
                out.append((f"regions {seed}+{len(chosen) - 1}", tuple(chosen)))
    return out


def starts(workload: WorkloadSpec, cluster: ClusterSpec) -> list[Start]:
    """Every warm start for this job and cluster, duplicates (same groups on the same GPU
    sets) removed, in the order listed in the module's docstring."""
    tasks = workload.task_names
    devices = cluster.devices
    out: list[Start] = [from_pools("colocated", workload, cluster,
                                   [(tasks, tuple(range(cluster.num_devices)))])]
    # GPU types alone, then the k fastest types together (peak bf16 FLOP/s), the rest idle
    speed: dict[str, float] = {}
    for d in devices:
        speed[d.gpu.name] = d.gpu.flops
    types = sorted(speed, key=lambda g: (-speed[g], g))
    subsets = [{t} for t in types] + [set(types[:k]) for k in range(2, len(types))]
    for keep in subsets if len(types) > 1 else ():
        ids = tuple(d.id for d in devices if d.gpu.name in keep)
        name = "types " + "+".join(t for t in types if t in keep)
        out.append(from_pools(name, workload, cluster, [(tasks, ids)]))
    # single regions and the best-connected groups of regions (without edge nodes)
    for name, regions in region_sets(cluster):
        keep = set(regions)
        ids = tuple(d.id for d in devices if d.region in keep and not d.edge)
        out.append(from_pools(name, workload, cluster, [(tasks, ids)]))
    # the pool families interleaved, each in its own order (largest pools first)
    node = max(n.count for n in cluster.nodes)
    families = [("verl", verl_pools(workload, cluster.num_devices, node, "sync")),
                ("verl-async", verl_pools(workload, cluster.num_devices, node, "async")),
                ("streamrl", streamrl_pools(workload, cluster))]
    # verl's pool structures also on the k fastest GPU types alone (the rest idle): a verl user
    # who leaves the slow GPUs out
    for k in range(1, len(types)):
        fast = set(types[:k])
        ids = [d.id for d in devices if d.gpu.name in fast]
        for mode, family in (("sync", "verl"), ("async", "verl-async")):
            renamed = [[(tasks_, tuple(ids[i] for i in at)) for tasks_, at in pools]
                       for pools in verl_pools(workload, len(ids), node, mode)]
            families.append((f"{family} on types<={types[k - 1]}", renamed))
    for i in range(MAX_POOL_STARTS):
        for family, pools in families:
            if i < len(pools):
                out.append(from_pools(family, workload, cluster, list(pools[i])))
    seen: set[tuple] = set()
    unique = []
    for s in out:
        if s.key not in seen and all(s.sizes):
            seen.add(s.key)
            unique.append(s)
    return unique


# --- pricing and tuning the starts (what SHA-EA's run calls) ---

def warm_start(ev: Evaluator, by_grouping: dict, make_arm: Callable[..., Arm], budget: int,
               total: int, info: dict[str, Any], options: SHAOptions) -> list[Arm]:
    """SHA-EA's warm start: each start (:func:`starts`), as many as half of ``budget``
    affords, becomes the first individual of the arm of its grouping and sizes (made if
    new) and is priced; then the best-priced starts are tuned (:func:`tune_starts`) with
    the rest of ``budget`` (at small budgets, up to half of ``total``). Returns the warm
    arms, best first."""
    priced: list[Arm] = []
    candidates = starts(ev.workload, ev.cluster)[: max(budget // 2, 1)]
    for start in candidates:
        l1 = by_grouping.get(start.groups)
        if l1 is None:
            continue
        # an arm of this grouping and sizes with room for another start (at most half its
        # population: the rest stays random, for diversity), else a new one
        room = max(options.population // 2, 1)
        arm = next((a for a in l1.arms if a.sizes == start.sizes and not a.population
                    and len(a.starts) < room), None)
        if arm is None:
            arm = make_arm(start.groups, start.sizes)
            l1.arms.append(arm)
        if not arm.warm:
            arm.warm = True
            priced.append(arm)
        arm.starts.append(start.order)
    for arm in priced:  # the starts, one evaluation each
        while len(arm.population) < len(arm.starts):
            arm.step(ev)
    spent = sum(len(a.starts) for a in priced)
    # the tuning may take up to half of the whole budget (it ends sooner at its own fixed
    # point, the halving over the starts): a start tuned is the plan a baseline would have
    # found, and the halving's first rounds are noise next to it at small budgets; cut at
    # four sweeps a start, 3,000 evaluations stopped paper64-multi-country PPO short of
    # its fixed point (docs/search-history.md, "The warm start tuned to its fixed point")
    tune_starts(ev, priced, max(budget - spent, total / 2 - spent), options.warm_start)
    priced.sort(key=lambda a: a.best)
    info["warm_starts"] = len(candidates)
    info["warm_best"] = priced[0].best if priced else None
    return priced


def tune_starts(ev: Evaluator, arms: list[Arm], budget: int, opts: WarmStartOptions) -> None:
    """Successive halving over the priced warm starts. A start's price ranks it only
    roughly: its layouts are a rule of thumb, and the weakest guess is generation's (its
    best tensor-parallel width depends on the KV room; docs/search-history.md, "Numbers
    moved from the docstrings"). So first the ``warm_tuned`` best-priced starts, and the
    ``warm_repaired`` best of the infeasible ones left (generation's guess is what
    overflows memory most often), tune generation's layout alone (:meth:`Arm.tune` over
    one task); then the better half of the best-priced (and each repaired start that
    beats all of them: none takes a best-priced one's place) gets a sweep over every
    task, the better half of those still improving another, and so on while ``budget``
    lasts. The steps do not depend on ``budget``, which only stops them sooner or later,
    so more budget never ends the warm start worse."""
    runs = sorted(((f, i, g, arm) for arm in arms
                   for i, (f, g) in enumerate(arm.population[: len(arm.starts)])
                   if math.isfinite(f)), key=lambda r: (r[0], r[1]))
    if not runs or budget <= 0:
        return
    first = tuple(t.name for t in ev.workload.tasks if t.kind == "generation")
    # the same steps in the same order whatever the budget (a smaller budget stops them
    # sooner), so that more budget never ends the warm start worse
    best = runs[: opts.warm_tuned]
    # an infeasible start's fitness is the penalty plus its seconds: the fastest if it
    # fitted come first
    repaired = [r for r in runs[opts.warm_tuned:]
                if r[0] >= INFEASIBLE_PENALTY_S][: opts.warm_repaired]
    # [fitness, genotype, arm, repaired]
    alive = [[f, g, arm, False] for f, _, g, arm in best] + [
        [f, g, arm, True] for f, _, g, arm in repaired]
    tasks: tuple[str, ...] | None = first or None
    while alive and budget > 0:
        going = []
        for run in alive:
            if budget <= 0:
                break
            before = run[2].evaluations
            run[0], run[1], improved = run[2].tune(ev, (run[0], run[1]), int(budget),
                                                   tasks=tasks)
            budget -= run[2].evaluations - before
            if improved or tasks is not None:
                going.append(run)
        going.sort(key=lambda r: r[0])
        # the better half of the best-priced starts, as without the repaired ones, and
        # each repaired start that does better than all of them (a repaired start never
        # takes a best-priced one's place: the tuning's budget binds at small budgets)
        priced = [r for r in going if not r[3]]
        kept = priced[: max(1, len(priced) // 2)]
        bar = kept[0][0] if kept else math.inf
        alive = [r for r in going if r[3] and r[0] < bar] + kept  # (still in fitness order)
        tasks = None  # after generation's step: sweeps over every task
