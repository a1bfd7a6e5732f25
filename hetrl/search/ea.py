"""HetRL's evolutionary algorithm on levels 3-5 for one (task grouping, GPU-group sizes) arm.

The initial population is random, as in the paper, except its first individual: GPUs of a type
kept together and a rule-of-thumb layout per task (``seeded_genotype``, our addition). Each step
mutates one individual into an offspring o, improves o by swap-based local search into
o*, evaluates o* with the cost model, and replaces the worst individual if o* is better. The
population keeps o's genotype with o*'s fitness (Baldwinian evolution: the improvement is not
written back, which keeps diversity). Mutation, with probability ``p_upgrade``, moves a GPU of a
training group out for a higher-TFLOPS GPU that no training group uses.

Local search (``swaps="cross"``): greedy cross-group swaps of GPUs of one type, taking each time
the swap with the largest gain in a locality score (4 per pair of a group's GPUs in one node, 2 in
one zone, 1 in one region), until no swap gains; then each group's GPUs are ordered node by node
so tensor-parallel groups stay inside nodes. ``swaps="within"`` (HetRL-simple) only reorders
inside each group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hetrl.cost.model import CostModel
from hetrl.search.base import Evaluator
from hetrl.search.genome import Genotype, candidate_layouts, decode
from hetrl.search.space import Layout

AFF_NODE, AFF_ZONE, AFF_REGION = 4, 2, 1


@dataclass
class DeviceFacts:
    """Per-device keys used by mutation and local search."""

    node: list[int]
    zone: list[int]
    region: list[int]
    gpu: list[int]
    flops: list[float]
    memory: list[float]

    @classmethod
    def of(cls, model: CostModel) -> DeviceFacts:
        devs = model.cluster.devices
        idx: dict[str, dict] = {"node": {}, "zone": {}, "region": {}, "gpu": {}}

        def key(kind: str, value: object) -> int:
            return idx[kind].setdefault(value, len(idx[kind]))

        return cls(
            node=[key("node", d.node) for d in devs],
            zone=[key("zone", (d.region, d.zone)) for d in devs],
            region=[key("region", d.region) for d in devs],
            gpu=[key("gpu", d.gpu.name) for d in devs],
            flops=[d.gpu.flops for d in devs],
            memory=[d.gpu.memory_bytes for d in devs],
        )

    def affinity(self, a: int, b: int) -> int:
        if self.node[a] == self.node[b]:
            return AFF_NODE
        if self.zone[a] == self.zone[b]:
            return AFF_ZONE
        return AFF_REGION if self.region[a] == self.region[b] else 0


def local_search(order: tuple[int, ...], sizes: tuple[int, ...], facts: DeviceFacts,
                 swaps: str = "cross", max_swaps: int = 16) -> tuple[int, ...]:
    """Swap-based local search on a device order (see module docstring)."""
    order_l = list(order)
    bounds = []
    start = 0
    for n in sizes:
        bounds.append((start, start + n))
        start += n
    if start < len(order_l):
        bounds.append((start, len(order_l)))  # the unused devices form a group of their own
    if swaps == "cross" and len(bounds) > 1:
        node = np.asarray(facts.node)
        zone = np.asarray(facts.zone)
        region = np.asarray(facts.region)
        gpu = np.asarray(facts.gpu)
        n_groups = len(bounds)
        n_node, n_zone, n_region = node.max() + 1, zone.max() + 1, region.max() + 1
        group_of = np.empty(len(order_l), dtype=np.int64)
        for g, (lo, hi) in enumerate(bounds):
            group_of[lo:hi] = g
        for _ in range(max_swaps):
            arr = np.asarray(order_l)
            # counts of each group's devices per node / zone / region
            cn = np.bincount(group_of * n_node + node[arr], minlength=n_groups * n_node
                             ).reshape(n_groups, n_node)
            cz = np.bincount(group_of * n_zone + zone[arr], minlength=n_groups * n_zone
                             ).reshape(n_groups, n_zone)
            cr = np.bincount(group_of * n_region + region[arr], minlength=n_groups * n_region
                             ).reshape(n_groups, n_region)
            # one representative position per (group, node, gpu type) class
            keys = group_of * 10**8 + node[arr] * 10**4 + gpu[arr]
            _, first = np.unique(keys, return_index=True)
            reps = arr[first]
            rg = group_of[first]
            rn, rz, rr, rt = node[reps], zone[reps], region[reps], gpu[reps]
            # NM[g, i]: locality of rep i with group g as a non-member; a member scores AFF_NODE less
            n_ = cn[:, rn]
            z_ = cz[:, rz]
            r_ = cr[:, rr]
            nm = AFF_NODE * n_ + AFF_ZONE * (z_ - n_) + AFF_REGION * (r_ - z_)
            same_node = rn[:, None] == rn[None, :]
            aff = np.where(same_node, AFF_NODE, np.where(
                rz[:, None] == rz[None, :], AFF_ZONE,
                np.where(rr[:, None] == rr[None, :], AFF_REGION, 0)))
            own = nm[rg, np.arange(len(reps))] - AFF_NODE  # member score in its own group
            # gain of swapping rep i (group rg[i]) with rep j (group rg[j])
            gain = (nm[rg[None, :], np.arange(len(reps))[:, None]] + nm[rg[:, None],
                    np.arange(len(reps))[None, :]] - 2 * aff - own[:, None] - own[None, :])
            valid = (rg[:, None] < rg[None, :]) & (rt[:, None] == rt[None, :]) & ~same_node
            gain = np.where(valid, gain, 0)
            k = int(np.argmax(gain))
            if gain.flat[k] <= 0:
                break
            i, j = divmod(k, len(reps))
            pa, pb = int(first[i]), int(first[j])
            order_l[pa], order_l[pb] = order_l[pb], order_l[pa]
    # Inside each group: node by node, nodes in order of first appearance (the genotype keeps
    # control of which nodes come first).
    for lo, hi in bounds[: len(sizes)]:
        part = order_l[lo:hi]
        rank: dict[int, int] = {}
        for d in part:
            rank.setdefault(facts.node[d], len(rank))
        order_l[lo:hi] = sorted(part, key=lambda d: rank[facts.node[d]])
    return tuple(order_l)


class Arm:
    """An EA population for one (task grouping, GPU-group sizes) pair."""

    def __init__(self, groups: tuple[tuple[str, ...], ...], sizes: tuple[int, ...],
                 model: CostModel, facts: DeviceFacts, rng: np.random.Generator,
                 population: int = 8, p_upgrade: float = 0.3, swaps: str = "cross",
                 load_balance: bool = True, seeded: int = 1):
        self.groups, self.sizes = groups, sizes
        self.model, self.facts, self.rng = model, facts, rng
        self.population_size = population
        self.p_upgrade = p_upgrade
        self.swaps = swaps
        self.load_balance = load_balance
        self.seeded = seeded  # how many initial individuals start structured (seeded_genotype)
        self.population: list[tuple[float, Genotype]] = []
        self.best: float = float("inf")
        self.evaluations = 0
        wl = model.workload
        self.training_groups = [i for i, g in enumerate(groups)
                                if any(wl.task(t).kind == "training" for t in g)]
        self.layout_options = {t: candidate_layouts(wl, t, sizes[i])
                               for i, g in enumerate(groups) for t in g}
        self._needs: dict[tuple[str, Layout], float] = {}

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["model"] = None  # a worker process attaches its own cost model
        return state

    # --- genotypes ---
    def _need(self, task: str, lay: Layout) -> float:
        """A task's own weights (+ gradients and sharded optimizer states) per GPU, bytes."""
        key = (task, lay)
        need = self._needs.get(key)
        if need is None:
            wl = self.model.workload
            info = wl.task(task)
            dp, pp, tp = lay
            per_param = wl.bytes_per_value
            if info.kind == "training":
                per_param += (self.model.params.grad_bytes
                              + self.model.params.optimizer_state_bytes / dp)
            need = wl.model(info.role).params / (pp * tp) * per_param
            self._needs[key] = need
        return need

    def _fitting(self, task: str, devices: tuple[int, ...]) -> list[Layout]:
        """Layouts whose own memory fits the smallest GPU they would use (a quick filter)."""
        room = np.minimum.accumulate([self.facts.memory[d] for d in devices]) * (
            0.9 * self.model.params.usable_memory_fraction)
        options = self.layout_options[task]
        fitting = [x for x in options if self._need(task, x) < room[x[0] * x[1] * x[2] - 1]]
        return fitting or list(options)

    def _genotype(self, order: tuple[int, ...], choose: Any) -> Genotype:
        """The genotype of ``order`` with each task's layout ``choose(task, its group's slice)``."""
        start, lays = 0, []
        for g, n in zip(self.groups, self.sizes, strict=True):
            devices = order[start:start + n]
            start += n
            lays += [(t, choose(t, devices)) for t in g]
        return Genotype(self.groups, self.sizes, order, tuple(lays))

    def random_genotype(self) -> Genotype:
        order = tuple(int(d) for d in self.rng.permutation(self.model.cluster.num_devices))

        def choose(t: str, devices: tuple[int, ...]) -> Layout:
            fitting = self._fitting(t, devices)
            return fitting[int(self.rng.integers(len(fitting)))]
        return self._genotype(order, choose)

    def seeded_genotype(self) -> Genotype:
        """A structured start (our addition to the paper's random one): GPUs of one type kept
        together node by node, the types in a random order over the groups, and each task's
        layout chosen by a rule of thumb that needs no evaluation: among layouts whose own
        memory fits, the most data-parallel one (least communication), and for generation one
        that leaves at least 60% of the smallest GPU's memory to the KV cache when it can."""
        f = self.facts
        types = sorted(set(f.gpu))
        rank = {t: int(r) for t, r in zip(types, self.rng.permutation(len(types)), strict=True)}
        order = tuple(sorted(range(len(f.gpu)), key=lambda d: (rank[f.gpu[d]], f.node[d], d)))
        wl = self.model.workload

        def choose(t: str, devices: tuple[int, ...]) -> Layout:
            fitting = self._fitting(t, devices)
            if wl.task(t).kind == "generation":
                room = [x for x in fitting if self._need(t, x) <= 0.4 * min(
                    f.memory[d] for d in devices[: x[0] * x[1] * x[2]])]
                fitting = room or fitting
            return max(fitting, key=lambda x: (x[0], -x[1], x[0] * x[1] * x[2]))
        return self._genotype(order, choose)

    def mutate(self, g: Genotype) -> Genotype:
        rng, f = self.rng, self.facts
        order = list(g.order)
        bounds, start = [], 0
        for n in self.sizes:
            bounds.append((start, start + n))
            start += n
        used = start
        r = rng.random()
        if r < self.p_upgrade and self.training_groups:
            train_pos = [p for i in self.training_groups for p in range(*bounds[i])]
            pa = train_pos[int(rng.integers(len(train_pos)))]
            in_train = set(train_pos)
            stronger = [p for p in range(len(order)) if p not in in_train
                        and f.flops[order[p]] > f.flops[order[pa]]]
            if stronger:
                pb = stronger[int(rng.integers(len(stronger)))]
                order[pa], order[pb] = order[pb], order[pa]
                return g.with_order(tuple(order))
            r = self.p_upgrade  # no stronger GPU left: fall through to another operator
        r = (r - self.p_upgrade) / (1 - self.p_upgrade) if self.p_upgrade < 1 else r
        if r < 0.4 and (len(bounds) > 1 or used < len(order)):
            ga = int(rng.integers(len(bounds)))
            pa = int(rng.integers(*bounds[ga]))
            others = [p for p in range(len(order)) if not bounds[ga][0] <= p < bounds[ga][1]]
            pb = others[int(rng.integers(len(others)))]
            order[pa], order[pb] = order[pb], order[pa]
            return g.with_order(tuple(order))
        if r < 0.65:
            t, lay = g.layouts[int(rng.integers(len(g.layouts)))]
            options = [x for x in self.layout_options[t] if x != lay]
            if options:
                return g.with_layout(t, options[int(rng.integers(len(options)))])
        if r < 0.75:  # move a task to another part of its group's GPUs (level 5)
            t, (dp, pp, tp) = g.layouts[int(rng.integers(len(g.layouts)))]
            n = next(self.sizes[i] for i, grp in enumerate(self.groups) if t in grp)
            used = dp * pp * tp
            if used < n:
                steps = [o for o in range(0, n, used) if o != g.offset(t)] or [0]
                return g.with_offset(t, steps[int(rng.integers(len(steps)))])
        ga = int(rng.integers(len(bounds)))
        lo, hi = bounds[ga]
        if hi - lo >= 2:
            pa, pb = (int(x) for x in rng.choice(np.arange(lo, hi), size=2, replace=False))
            order[pa], order[pb] = order[pb], order[pa]
        return g.with_order(tuple(order))

    def improve(self, g: Genotype) -> Genotype:
        order = local_search(g.order, g.sizes, self.facts, self.swaps)
        return g.with_order(order)

    def fitness(self, ev: Evaluator, g: Genotype) -> float:
        f = ev.evaluate(decode(self.improve(g), self.model, self.load_balance))
        self.evaluations += 1
        self.best = min(self.best, f)
        return f

    # --- evolution ---
    def step(self, ev: Evaluator) -> None:
        """Fill the initial population, then one mutation + local search + replacement."""
        if len(self.population) < self.population_size:
            g = self.seeded_genotype() if len(self.population) < self.seeded else self.random_genotype()
            self.population.append((self.fitness(ev, g), g))
            return
        i, j = self.rng.integers(len(self.population), size=2)
        parent = min(self.population[i], self.population[j], key=lambda x: x[0])[1]
        child = self.mutate(parent)
        f = self.fitness(ev, child)
        worst = max(range(len(self.population)), key=lambda k: self.population[k][0])
        if f < self.population[worst][0]:
            self.population[worst] = (f, child)

    def run(self, ev: Evaluator, evaluations: int) -> None:
        """Spend ``evaluations`` steps (or until the global budget ends: BudgetExhausted)."""
        for _ in range(max(int(evaluations), 0)):
            self.step(ev)
