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

Polish (our addition, ``Arm.polish``): coordinate descent on levels 4-5 from the best genotype --
its groups' GPUs put in blocks of one type, pairs (then triples) of independent tasks of a group
split over consecutive windows of it (the tasks taking turns at their layouts), then each task's
(layout, offset) over the full-group and the aligned part-of-group layouts -- run by SHA-EA's
final phase; what it finds joins the population as a genotype. Once a pass has converged, the
next starts from the best after a few random moves (iterated local search; see
docs/search.md).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from hetrl.cost.model import CostModel
from hetrl.search.base import INFEASIBLE_PENALTY_S, Evaluator
from hetrl.search.genome import Genotype, candidate_layouts, candidate_sub_layouts, decode
from hetrl.search.options import SHAOptions
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

    @cached_property
    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                              int, int, int, int]:
        """``node``, ``zone``, ``region`` and ``gpu`` as arrays, and the counts of nodes, zones,
        regions and GPU types (for the local search's vectorised scores)."""
        arrays = [np.asarray(x) for x in (self.node, self.zone, self.region, self.gpu)]
        return (*arrays, *(int(a.max()) + 1 for a in arrays))

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
        node, zone, region, gpu, n_node, n_zone, n_region, n_gpu = facts.arrays
        n_groups = len(bounds)
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
            # (np.unique's first indices, without its overhead: a stable sort keeps positions
            # in order inside a class, and classes sorted by (group, node, gpu type))
            keys = (group_of * n_node + node[arr]) * n_gpu + gpu[arr]
            by_key = np.argsort(keys, kind="stable")
            sorted_keys = keys[by_key]
            starts = np.empty(sorted_keys.size, dtype=bool)
            starts[0] = True
            np.not_equal(sorted_keys[1:], sorted_keys[:-1], out=starts[1:])
            first = by_key[starts]
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


@dataclass
class _SplitRun:
    """One split of :meth:`Arm._split` while its tasks take turns (working state)."""

    shape: tuple[tuple[str, ...], tuple[int, ...]]  #: (task order, window sizes)
    options: list[list[Layout]]  #: each task's layouts on its window, in ``shape``'s order
    genotype: Genotype
    fitness: float = math.inf  #: of ``genotype``, once a turn has run (seconds)
    kept: int = 0  #: turns in a row whose task kept its layout


def offsets(used: int, n: int) -> range:
    """Offsets of a task using ``used`` of its group's ``n`` GPUs: multiples of gcd(used, n),
    so windows stay aligned to the blocks the group divides into (wrapping round)."""
    return range(0, n, math.gcd(used, n))


def _rank(fitness: float, need: float) -> tuple[float, ...]:
    """How the polish compares one task's options: by fitness, ties to the option that needs
    less memory; while the plan breaks memory, by that need first (get feasible, then fast)."""
    if fitness >= INFEASIBLE_PENALTY_S:
        return (INFEASIBLE_PENALTY_S, need, fitness)
    return (fitness, need)


class Arm:
    """An EA population for one (task grouping, GPU-group sizes) pair."""

    def __init__(self, groups: tuple[tuple[str, ...], ...], sizes: tuple[int, ...],
                 model: CostModel, facts: DeviceFacts, rng: np.random.Generator,
                 options: SHAOptions | None = None, swaps: str = "cross", seeded: int = 1):
        self.groups, self.sizes = groups, sizes
        self.model, self.facts, self.rng = model, facts, rng
        o = self.options = options or SHAOptions()
        self.population_size = o.population
        self.p_upgrade = o.p_upgrade
        self.swaps = swaps
        self.load_balance = o.load_balance
        self.p_sub = o.p_sub  # share of layout mutations that draw a part-of-group layout
        #: the polish's pair splits: from how many of the best split shapes, and how many
        #: greedy sweeps over the other tasks' options from each
        self.split_starts, self.split_sweeps = o.split_starts, o.split_sweeps
        #: whether a polish pass starts from the best genotype with each group's GPUs in blocks
        #: of one type (see :meth:`type_blocked`)
        self.type_blocks = o.type_blocks
        #: at most this many turns of a split: each task of the pair (triple) in turn takes its
        #: best layout on its window given the others', until a fixed point (at least 2 (3))
        self.split_turns = o.split_turns
        #: whether a pass also splits independent triples of a group's tasks over three
        #: windows (PPO's reward, reference and critic inference), after the pairs or in place
        #: of the pairs inside them (see :meth:`_splits`)
        self.split_triples = o.split_triples
        #: whether only the better half of a split's (shape, offset) candidates still turning
        #: goes on after each turn (see :meth:`_split`)
        self.split_halving = o.split_halving
        #: whether a pair split with a training task starts from its base with every other
        #: task of the group in its least-memory option (see :meth:`light_base`)
        self.split_light = o.split_light
        #: whether the sweeps after a split start from the best split of each mix (window
        #: sizes and GPU types per task, see :meth:`_mix`) rather than of each shape
        self.split_mixes = o.split_mixes
        #: device orders of the first individuals (warm starts, see hetrl/search/warm.py),
        #: each task on its rule-of-thumb layout (:meth:`seeded_genotype`)
        self.starts: list[tuple[int, ...]] = []
        #: whether a warm start put this arm in the search (its starts are the floor)
        self.warm = False
        self.seeded = seeded  # how many initial individuals start structured (seeded_genotype)
        self.population: list[tuple[float, Genotype]] = []
        self.best: float = float("inf")
        self.evaluations = 0
        #: the arm's evaluation count when its best last improved (see :meth:`stalled`)
        self.improved_at = 0
        self._polish_cost: int | None = None
        #: the polish pass in progress (a generator, see :meth:`polish`), its [best fitness,
        #: best genotype], and the arm's best when the last pass finished
        self._polisher: Iterator[None] | None = None
        self._polish_state: list = [float("inf"), None]
        self._polished_best = float("nan")
        #: the arm's best when the pass in progress started
        self._pass_from = float("inf")
        #: iterated local search: once a pass has converged, the next one starts from the best
        #: genotype after this many random moves (:meth:`mutate`); 0: no further passes
        self.kick_moves = o.kick_moves
        wl = model.workload
        self._training = {t.name for t in wl.tasks if t.kind == "training"}
        self.training_groups = [i for i, g in enumerate(groups) if self._training & set(g)]
        self.layout_options = {t: candidate_layouts(wl, t, sizes[i])
                               for i, g in enumerate(groups) for t in g}
        # Layouts on at most half of the group (our addition, see space.sub_layouts): tasks of
        # one group may then run side by side on disjoint parts of it.
        # Only parts aligned to the cluster's blocks: a multiple of the node size, or half the
        # group (see ``aligned``).
        self.node_size = max(n.count for n in model.cluster.nodes)
        self.sub_options = {t: tuple(x for x in candidate_sub_layouts(wl, t, sizes[i])
                                     if self.aligned(x[0] * x[1] * x[2], sizes[i]))
                            if o.sub_layouts else () for i, g in enumerate(groups) for t in g}
        #: per task: its group's GPU count, and its part-of-group layouts by GPUs used
        #: per task: the index of its group, and its group's GPU count
        self.group_of = {t: i for i, g in enumerate(groups) for t in g}
        self.group_size = {t: sizes[i] for t, i in self.group_of.items()}
        self.sub_by_used: dict[str, dict[int, list[Layout]]] = {}
        for t, opts in self.sub_options.items():
            by_used = self.sub_by_used[t] = {}
            for x in opts:
                by_used.setdefault(x[0] * x[1] * x[2], []).append(x)
        self._needs: dict[tuple[str, Layout], float] = {}
        self._improved: dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[int, ...]] = {}

    def aligned(self, used: int, n: int) -> bool:
        """Whether a part of ``used`` GPUs of a group of ``n`` is one the EA considers: a
        multiple of the node size, or half the group."""
        return used % self.node_size == 0 or 2 * used == n

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["model"] = None  # a worker process attaches its own cost model
        state["_polisher"] = None  # a generator does not pickle: a pass in progress restarts
        state["_improved"] = {}  # a memo (up to 4096 device orders): rebuilt where it runs
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

    @property
    def _room(self) -> float:
        """The share of a GPU's memory a task's own bytes may take in the quick memory filters
        (:meth:`_fitting`, :meth:`_first_guess`): 0.9 of the usable fraction."""
        return 0.9 * self.model.params.usable_memory_fraction

    def _fitting(self, task: str, devices: tuple[int, ...]) -> list[Layout]:
        """Layouts whose own memory fits the smallest GPU they would use (a quick filter)."""
        room = np.minimum.accumulate([self.facts.memory[d] for d in devices]) * self._room
        options = self.layout_options[task]
        fitting = [x for x in options if self._need(task, x) < room[x[0] * x[1] * x[2] - 1]]
        return fitting or list(options)

    def _genotype(self, order: tuple[int, ...], choose: Any, fit: bool = False) -> Genotype:
        """The genotype of ``order`` with each task's layout ``choose(task, its group's slice)``
        (``fit``: then made to fit together, :meth:`_fit_group`)."""
        start, lays = 0, []
        for g, n in zip(self.groups, self.sizes, strict=True):
            devices = order[start:start + n]
            start += n
            chosen = {t: choose(t, devices) for t in g}
            if fit:
                chosen = self._fit_group(chosen, devices)
            lays += [(t, chosen[t]) for t in g]
        return Genotype(self.groups, self.sizes, order, tuple(lays))

    def _fit_group(self, lays: dict[str, Layout], devices: tuple[int, ...]) -> dict[str, Layout]:
        """``lays`` (one group's tasks) changed until their own bytes per GPU, summed, fit the
        group's smallest GPU (the quick filter's room), a rule of thumb without evaluations:
        co-located tasks hold their models side by side, so each fitting alone is not enough.
        Each step moves the task holding the most that can hold less to its layout needing the
        most below what it needs now (the most data-parallel among equals)."""
        room = min(self.facts.memory[d] for d in devices) * self._room
        lays = dict(lays)
        for _ in range(8 * len(lays) * 8):
            if sum(self._need(t, x) for t, x in lays.items()) <= room:
                break
            for t in sorted(lays, key=lambda t: -self._need(t, lays[t])):
                now = self._need(t, lays[t])
                less = [x for x in self.layout_options[t] if self._need(t, x) < now]
                if less:
                    lays[t] = max(less, key=lambda x: (self._need(t, x), x[0], -x[1]))
                    break
            else:
                break  # nothing can hold less
        return lays

    def random_genotype(self) -> Genotype:
        order = tuple(int(d) for d in self.rng.permutation(self.model.cluster.num_devices))

        def choose(t: str, devices: tuple[int, ...]) -> Layout:
            fitting = self._fitting(t, devices)
            return fitting[int(self.rng.integers(len(fitting)))]
        return self._genotype(order, choose)

    def seeded_genotype(self) -> Genotype:
        """A structured start (our addition to the paper's random one): GPUs of one type kept
        together node by node, the types in a random order over the groups (in an arm that
        leaves GPUs idle, the fastest types first, so the slowest idle), and each task on its
        rule-of-thumb layout (:meth:`_rule_of_thumb`)."""
        f = self.facts
        types = sorted(set(f.gpu))
        if sum(self.sizes) < len(f.gpu):
            # GPUs idle: the fastest types (peak FLOP/s) used, the slowest left idle
            best = {t: -max(f.flops[d] for d in range(len(f.gpu)) if f.gpu[d] == t) for t in types}
            rank = {t: r for r, t in enumerate(sorted(types, key=lambda t: (best[t], t)))}
        else:
            rank = {t: int(r) for t, r in zip(types, self.rng.permutation(len(types)),
                                               strict=True)}
        order = tuple(sorted(range(len(f.gpu)), key=lambda d: (rank[f.gpu[d]], f.node[d], d)))
        return self._genotype(order, self._rule_of_thumb, fit=True)

    def start_genotype(self, order: tuple[int, ...]) -> Genotype:
        """A warm start's device order with each task on its rule-of-thumb layout."""
        return self._genotype(order, self._rule_of_thumb, fit=True)

    def _rule_of_thumb(self, t: str, devices: tuple[int, ...]) -> Layout:
        """Task ``t``'s layout on its group's ``devices`` without an evaluation: among layouts
        whose own memory fits, the most data-parallel one (least communication), and for
        generation one that leaves at least 60% of the smallest GPU's memory to the KV cache
        when it can."""
        f = self.facts
        wl = self.model.workload
        fitting = self._fitting(t, devices)
        if wl.task(t).kind == "generation":
            room = [x for x in fitting if self._need(t, x) <= 0.4 * min(
                f.memory[d] for d in devices[: x[0] * x[1] * x[2]])]
            fitting = room or fitting
        return max(fitting, key=lambda x: (x[0], -x[1], x[0] * x[1] * x[2]))

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
            pool = self.layout_options[t]
            if self.sub_options[t] and self.p_sub > 0 and rng.random() < self.p_sub:
                pool = self.sub_options[t]
            options = [x for x in pool if x != lay]
            if options:
                return g.with_layout(t, options[int(rng.integers(len(options)))])
        if r < 0.75:  # move a task to another part of its group's GPUs (level 5)
            t, (dp, pp, tp) = g.layouts[int(rng.integers(len(g.layouts)))]
            n = self.group_size[t]
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
        """``g`` with its order improved by :func:`local_search` (a pure function of the order
        and the group sizes: memoised, since layout moves keep the order)."""
        key = (g.order, g.sizes)
        order = self._improved.get(key)
        if order is None:
            order = local_search(g.order, g.sizes, self.facts, self.swaps)
            if len(self._improved) >= 4096:
                self._improved.clear()
            self._improved[key] = order
        return g.with_order(order)

    def fitness(self, ev: Evaluator, g: Genotype) -> float:
        f = ev.evaluate(decode(self.improve(g), self.model, self.load_balance))
        self.evaluations += 1
        if f < self.best:
            self.best = f
            self.improved_at = self.evaluations
        return f

    def tune(self, ev: Evaluator, cap: int) -> None:
        """Coordinate descent over the full-group layouts from the arm's best genotype: each
        task in turn keeps its best layout given the others', while a sweep improves, for at
        most ``cap`` evaluations (a sweep costs the full-group layouts of every task, summed:
        about 90 for Qwen3-8B PPO on 64 GPUs, where a polish pass costs thousands). Used by the
        warm start on the baselines' structures, as StreamRL tunes its pools' layouts. The
        best joins the population."""
        if not self.population:
            return
        state = list(min(self.population, key=lambda x: x[0]))
        stop = self.evaluations + cap
        try:
            improved = True
            while improved and self.evaluations < stop:
                improved = False
                for t in [t for t, _ in state[1].layouts]:
                    cur = state[1].layout(t)
                    for lay in self.layout_options[t]:
                        if lay == cur or self.evaluations >= stop:
                            continue
                        h = state[1].with_layout(t, lay).with_offset(t, 0)
                        f = self.fitness(ev, h)
                        if f < state[0]:
                            state[0], state[1], improved = f, h, True
        finally:
            self._adopt(state)

    def stalled(self, steps: int) -> bool:
        """Whether the arm's last ``steps`` evaluations found nothing better than its best."""
        return self.evaluations - self.improved_at >= steps

    # --- evolution ---
    def step(self, ev: Evaluator) -> None:
        """Fill the initial population, then one mutation + local search + replacement."""
        if len(self.population) < self.population_size:
            i = len(self.population)
            if i < len(self.starts):
                g = self.start_genotype(self.starts[i])
            elif i < len(self.starts) + self.seeded:
                g = self.seeded_genotype()
            else:
                g = self.random_genotype()
            self.population.append((self.fitness(ev, g), g))
            return
        i, j = self.rng.integers(len(self.population), size=2)
        parent = min(self.population[i], self.population[j], key=lambda x: x[0])[1]
        child = self.mutate(parent)
        f = self.fitness(ev, child)
        worst = max(range(len(self.population)), key=lambda k: self.population[k][0])
        if f < self.population[worst][0]:
            self.population[worst] = (f, child)

    # --- polish (our addition): coordinate descent on levels 4-5 of the best individual ---
    def _independent_sets(self, k: int) -> list[tuple[str, ...]]:
        """Sets of ``k`` tasks of one group no two of which depend (transitively) on each other:
        they can run side by side on disjoint windows of the group. Sets with more training
        tasks first (the costliest tasks of an RL iteration), then in workflow order."""
        wl = self.model.workload
        before: dict[str, set[str]] = {}
        for info in wl.tasks:  # workflow order: dependencies come first
            deps = set(info.depends_on)
            for d in info.depends_on:
                deps |= before.get(d, set())
            before[info.name] = deps
        out = []
        for grp in self.groups:
            for combo in itertools.combinations(grp, k):
                if all(a not in before[b] and b not in before[a]
                       for a, b in itertools.combinations(combo, 2)):
                    out.append(combo)
        training = {t.name for t in wl.tasks if t.kind == "training"}
        return sorted(out, key=lambda ts: -sum(t in training for t in ts))

    def _splits(self) -> list[tuple[str, ...]]:
        """The task sets a polish pass splits: every independent pair, then (``split_triples``)
        every independent triple its group can split over three aligned windows. A triple with
        at least as many split shapes as the pairs inside it together replaces them (its split
        and sweep then cover what they would find at less cost; measured on paper64, kept on
        hetero24: docs/search-history.md, "Triple splits")."""
        pairs = self._independent_sets(2)
        if not self.split_triples:
            return pairs
        out, triples = list(pairs), []
        for t in self._independent_sets(3):
            n = self.group_size[t[0]]
            shapes = sum(1 for _ in self._split_shapes(t, n))
            if not shapes:
                continue
            triples.append(t)
            inner = [p for p in pairs if set(p) <= set(t)]
            if shapes >= sum(1 for p in inner for _ in self._split_shapes(p, n)):
                out = [p for p in out if p not in inner]
        return out + triples

    def type_blocked(self, g: Genotype) -> Genotype:
        """``g`` with each group's GPUs reordered into blocks of one GPU type (types, and nodes
        within a type, in order of first appearance; a stable sort). The polish's windows are
        runs of consecutive GPUs of a group, so only in this order can every union of whole
        types be a window (any union, on the wrap-around, with up to three types): a replica
        runs at its slowest GPU, so the splits that pay put a task on one type's GPUs."""
        f = self.facts
        order, start = list(g.order), 0
        for n in g.sizes:
            part = order[start:start + n]
            type_rank: dict[int, int] = {}
            node_rank: dict[int, int] = {}
            for d in part:
                type_rank.setdefault(f.gpu[d], len(type_rank))
                node_rank.setdefault(f.node[d], len(node_rank))
            order[start:start + n] = sorted(part, key=lambda d: (type_rank[f.gpu[d]],
                                                                 node_rank[f.node[d]]))
            start += n
        return g.with_order(tuple(order))

    def _options(self, t: str, n: int) -> list[tuple[Layout, int]]:
        """(layout, offset) pairs for task ``t`` in a group of ``n`` GPUs: full-group layouts at
        offset 0, smaller ones at every offset that is a multiple of the GPUs they use."""
        out = [(x, 0) for x in self.layout_options[t]]
        for x in self.sub_options[t]:
            out += [(x, o) for o in offsets(x[0] * x[1] * x[2], n)]
        return out

    def light_base(self, g: Genotype, tasks: tuple[str, ...]) -> Genotype:
        """``g`` with every task but ``tasks`` in its least-memory (layout, offset) option (the
        least own bytes per GPU; ties: its own offset, then the most GPUs). A pair split moves
        two tasks onto windows where the group's other tasks may already hold their weights: on
        a crowded base the fastest splits break memory and rank last, though the sweep that
        follows could move what crowds them (measured: paper64, a co-located arm stuck at
        103.12 s, its critic inference's whole model on the L4s the training split wanted;
        from the light base the same pass found 82.40 s). The sweep then gives the other tasks
        back their best options. Used for pairs with a training task (``split_light``): training
        keeps gradients and optimizer states besides its weights, so its windows are the ones
        other tasks' weights fill. Not for other pairs, whose splits a light base ranks in a
        context far from the plan's (hetero16 GRPO's inference pair: 139.11 s, where its split
        from the base finds 137.61 s), nor in addition to the base's split (paper64: the extra
        split slowed the passes, 25,000 evaluations, seeds 0-7: mean 87.8 s against 82.9 s).
        Lightening only the tasks that hold over half the smallest GPU, or splitting again from
        this base only when the base's split found nothing, kept none of paper64's gain; the
        cost: hetero16 PPO, 20 s, 202.36 s against 198.72 s (docs/search-history.md)."""
        group = self.groups[self.group_of[tasks[0]]]
        for t, _ in g.layouts:
            if t in tasks or t not in group:
                continue
            own = g.offset(t)
            lay, off = min(self._options(t, self.group_size[t]),
                           key=lambda o: (self._need(t, o[0]), o[1] != own,
                                          -o[0][0] * o[0][1] * o[0][2]))
            g = g.with_layout(t, lay).with_offset(t, off)
        return g

    def _split_shapes(self, tasks: tuple[str, ...], n: int
                      ) -> Iterator[tuple[tuple[str, ...], tuple[int, ...], list[list[Layout]]]]:
        """The ways :meth:`_split` puts ``tasks`` on consecutive windows of a group of ``n``
        GPUs: (order along the group, window sizes, each task's layouts on its window). Window
        sizes are aligned (a multiple of the node size, or n / 2) and sum to ``n``. A pair comes
        in both orders; for three tasks the first stays first (the offsets rotate the rest)."""
        exact = self.sub_by_used
        sizes = sorted({m for m in range(1, n) if self.aligned(m, n)})
        k = len(tasks)
        orders = (list(itertools.permutations(tasks)) if k == 2
                  else [(tasks[0],) + rest for rest in itertools.permutations(tasks[1:])])
        for order in orders:
            for head in itertools.product(sizes, repeat=k - 1):
                ms = head + (n - sum(head),)
                if ms[-1] not in sizes:
                    continue
                opts = [exact[t].get(m) for t, m in zip(order, ms, strict=True)]
                if all(opts):
                    yield order, ms, opts

    def _split_offsets(self, sizes: tuple[int, ...], n: int) -> range:
        """Where the first window of a split starts. A pair: every offset aligned to its size
        (:func:`offsets`; the pair also comes in the other order). Three tasks: every multiple
        of the node size (or of gcd(node size, n)), so windows can begin at any node -- e.g. on
        a 64-GPU group typed 24 + 24 + 16, windows of 16 + 32 + 16 GPUs starting at GPU 40,
        which no size-aligned offset of any order reaches."""
        if len(sizes) == 2:
            return offsets(sizes[0], n)
        return range(0, n, math.gcd(self.node_size, n))

    def _split(self, ev: Evaluator, tasks: tuple[str, ...], n: int, base: Genotype, trial
               ) -> Iterator[None]:
        """Tasks ``tasks`` (two or three) side by side on consecutive windows of their group
        (:meth:`_split_shapes`; the first window at every offset of :meth:`_split_offsets`): each
        task but the first starts on a first guess (:meth:`_first_guess`), then the tasks take
        turns, each its best layout on its window given the others', until all but one kept
        theirs in a row (at most ``split_turns``). The turns go breadth first over all the
        splits and, with ``split_halving``, after each turn only the better half of the splits
        still turning goes on (successive halving, the turns being the resource: a split whose
        first turns are poor rarely ends best). From the best split of each of the
        ``split_starts`` best mixes (:meth:`_mix`: window sizes and the GPU types under each
        task, with ``split_mixes``; else of each shape), one pass over the other tasks'
        (layout, offset) options: a group's tasks are coupled through memory (a task that
        needs less leaves more KV cache to generation), so single-task moves alone miss such
        plans. A pair comes in both orders, so two shapes often hold the same windows: per
        shape, the two starts were then often one split twice, and a split with other GPU
        types under the tasks, a close third, was never swept (paper64, 15 s, seed 7: the
        training pair's best split, actor training on 16 A100 + 16 L4 + 8 L40S, at 940.47 s
        from the light base in both orders; on 24 A100 + 16 L4 at 940.54 s; the pass ended at
        93.21 s, and at 82.40 s with mixes)."""
        k = len(tasks)
        splits: list[_SplitRun] = []  # one per (shape, offset)
        for order, ms, opts in self._split_shapes(tasks, n):
            for off in self._split_offsets(ms, n):
                at = [(off + sum(ms[:i])) % n for i in range(k)]  # where each window starts
                g = base
                for t, s in zip(order, at, strict=True):
                    g = g.with_offset(t, s)
                for t, s, o in zip(order[1:], at[1:], opts[1:], strict=True):
                    g = g.with_layout(t, self._first_guess(t, o, g, s))
                splits.append(_SplitRun((order, ms), opts, g))
        turning = list(range(len(splits)))
        for turn in range(max(k, self.split_turns)):
            for i in turning:
                run = splits[i]
                t, o, g = run.shape[0][turn % k], run.options[turn % k], run.genotype
                before = g.layout(t)
                best_t = None
                for x in o:
                    h = g.with_layout(t, x)
                    f = self.fitness(ev, h)
                    trial(h, f)
                    yield
                    # ties (common: the task is off the critical path) go to the layout that
                    # needs the least memory, leaving room to the others
                    rank = _rank(f, self._need(t, x))
                    if best_t is None or rank < best_t[0]:
                        best_t = (rank, f, h)
                run.fitness, run.genotype = best_t[1], best_t[2]
                run.kept = run.kept + 1 if run.genotype.layout(t) == before else 0
            # a split stops turning at a fixed point (all but one task kept their layouts in
            # a row)
            turning = [i for i in turning if not (turn >= k and splits[i].kept >= k - 1)]
            if self.split_halving and len(turning) > 1:
                turning = sorted(turning, key=lambda i: (splits[i].fitness, i))[
                    : (len(turning) + 1) // 2]
            if not turning:
                break
        size = self.group_size
        others = [t for t, _ in base.layouts if t not in tasks]
        starts, seen = [], set()
        # a stable sort: ties keep the order the splits were made in
        for run in sorted(splits, key=lambda r: r.fitness):
            key = self._mix(run) if self.split_mixes else run.shape
            if key not in seen:  # the best split of each mix (of each shape)
                seen.add(key)
                starts.append((run.fitness, run.genotype))
        for f0, g in starts[: self.split_starts]:
            for t in others * self.split_sweeps:  # greedily, each task keeping its best option
                cur = (g.layout(t), g.offset(t))
                here = (_rank(f0, self._need(t, cur[0])), f0, g)
                for lay, off in self._options(t, size[t]):
                    if (lay, off) != cur:
                        h = g.with_layout(t, lay).with_offset(t, off)
                        f = self.fitness(ev, h)
                        trial(h, f)
                        yield
                        rank = _rank(f, self._need(t, lay))
                        if rank < here[0]:
                            here = (rank, f, h)
                f0, g = here[1], here[2]

    def _mix(self, run: _SplitRun) -> frozenset[tuple[str, int, tuple[tuple[int, int], ...]]]:
        """What a split puts where, whatever the order its tasks were taken in: per task its
        window's size and the GPU types in that window (type index, count)."""
        order, sizes = run.shape
        g = run.genotype
        part = self._part(g, order[0])
        n, gpu = len(part), self.facts.gpu

        def types(t: str, m: int) -> tuple[tuple[int, int], ...]:
            start = g.offset(t)
            return tuple(sorted(Counter(gpu[part[(start + k) % n]] for k in range(m)).items()))
        return frozenset((t, m, types(t, m)) for t, m in zip(order, sizes, strict=True))

    def _part(self, g: Genotype, task: str) -> tuple[int, ...]:
        """The GPUs of ``task``'s group in ``g``, in order."""
        return g.slices()[self.group_of[task]]

    def _first_guess(self, t: str, options: list[Layout], g: Genotype, start: int) -> Layout:
        """A layout of ``options`` for task ``t`` on the window of its group's GPUs from
        ``start`` on, chosen without an evaluation: the most data-parallel one whose own memory
        fits the window's smallest GPU (as :meth:`seeded_genotype`), else the one needing least.
        The pair's other task picks its layout against this one first: against a layout that
        cannot fit, it would pick by memory alone."""
        part = self._part(g, t)
        used = options[0][0] * options[0][1] * options[0][2]
        room = min(self.facts.memory[part[(start + k) % len(part)]] for k in range(used)) * (
            self._room)
        fitting = [x for x in options if self._need(t, x) < room]
        if not fitting:
            return min(options, key=lambda x: self._need(t, x))
        return max(fitting, key=lambda x: (x[0], -x[1]))

    def polish_cost(self) -> int:
        """About how many evaluations one polish pass takes (counted, not evaluated): the pair
        splits, the sweeps from the best split of each shape, and one coordinate pass."""
        if self._polish_cost is None:
            self._polish_cost = self._count_polish()
        return self._polish_cost

    def _count_polish(self) -> int:
        size = self.group_size
        options = {t: len(self._options(t, size[t])) for t in size}
        quick = sum(len(self.layout_options[t]) for t in size) if self.options.quick_sweep else 0
        return (quick + sum(options.values()) + int(self.type_blocks)
                + sum(self.split_cost(tasks) for tasks in self._splits()))

    def split_cost(self, tasks: tuple[str, ...]) -> int:
        """About how many evaluations :meth:`_split` of ``tasks`` takes (counted): the turns
        over all the splits, then the sweeps."""
        size = self.group_size
        n, k = size[tasks[0]], len(tasks)
        shapes = 0
        # evaluations of each turn over all the splits; 2k - 1 turns: the usual fixed point
        # (the others keep their layouts when they pick again)
        turns = [0] * min(2 * k - 1, self.split_turns)
        for _, ms, opts in self._split_shapes(tasks, n):
            shapes += 1
            at = len(self._split_offsets(ms, n))
            for r in range(len(turns)):
                turns[r] += at * len(opts[r % k])
        # with halving, half the splits go on after each turn
        total = sum(c // 2 ** r if self.split_halving else c for r, c in enumerate(turns))
        others = sum(len(self._options(t, size[t])) for t in size if t not in tasks)
        return total + min(shapes, self.split_starts) * self.split_sweeps * others

    def polish_pending(self) -> bool:
        """Whether :meth:`polish` has work: a pass in progress, an arm's best other than the
        one the last finished pass ended with, or -- with kicks -- always."""
        return self._polisher is not None or (bool(self.population) and (
            self.kick_moves > 0 or self.best != self._polished_best))

    @property
    def in_first_polish(self) -> bool:
        """Whether the arm's first polish pass has started and not yet finished."""
        return self._polisher is not None and math.isnan(self._polished_best)

    @property
    def polishing(self) -> bool:
        """Whether a polish pass is in progress (stopped at a cap, resumed by the next call)."""
        return self._polisher is not None

    def polish(self, ev: Evaluator, max_passes: int = 2, cap: int | None = None) -> None:
        """Coordinate descent from the population's best genotype (see :meth:`_descend`), for at
        most ``cap`` evaluations. A pass stopped at the cap resumes where it stopped at the next
        call; if the EA has meanwhile found a better genotype than the pass's best, the pass
        goes on from that one. After a finished pass, the next starts from the arm's best
        once it differs from what that pass ended with; until then, with ``kick_moves`` > 0,
        from the best after that many random moves (iterated local search). The best genotype
        a pass found joins the population (replacing the worst, if it is better)."""
        if not self.population:
            return
        state = self._polish_state
        best_f, best = min(self.population, key=lambda x: x[0])
        if self._polisher is not None and best_f < min(state[0], self._pass_from):
            # the EA found better meanwhile: the pass goes on from it (its later moves start
            # from ``current()``). A pass resumed from its stale base stalled on paper64; one
            # restarted from the EA's best lost the splits already done, and with short
            # budgets (small caps, EA steps in between) never got past its first splits:
            # 30 s, seed 0, five runs 84.66-95.99 s (mean 90.5); going on, three runs 84.66 s.
            state[0], state[1] = best_f, best
        if self._polisher is None:
            self._pass_from = best_f
            if best_f == self._polished_best:
                if self.kick_moves <= 0:
                    return  # converged: nothing new to start from
                # converged: iterated local search -- a new pass from the best kicked by a few
                # random moves (the pass may end worse than the best: what it finds still
                # joins the population if it beats the worst)
                for _ in range(self.kick_moves):
                    best = self.mutate(best)
                best_f = self.fitness(ev, best)
            state = self._polish_state = [best_f, best]

            def trial(g: Genotype, f: float | None = None) -> None:
                if f is None:
                    f = self.fitness(ev, g)
                if f < state[0]:
                    state[0], state[1] = f, g

            self._polisher = self._descend(ev, max_passes, self.group_size, trial,
                                           lambda: (state[0], state[1]))
        stop = self.evaluations + (cap if cap is not None else 10**12)
        finished = False
        try:
            while self.evaluations < stop:
                next(self._polisher)
        except StopIteration:
            finished = True
        except BaseException:
            self._polisher = None  # e.g. the budget ran out mid-move: the pass cannot resume
            self._adopt(state)
            raise
        self._adopt(state)
        if finished:
            self._polisher = None
            self._polished_best = self.best

    def _adopt(self, state: list) -> None:
        """Put the polish's best genotype into the population in place of the worst."""
        best_f, best = state
        worst = max(range(len(self.population)), key=lambda k: self.population[k][0])
        if best_f < self.population[worst][0] and all(g != best for _, g in self.population):
            self.population[worst] = (best_f, best)

    def _descend(self, ev: Evaluator, max_passes: int, size: dict[str, int], trial,
                 current) -> Iterator[None]:
        """Pair splits (first pass), then each task's (layout, offset) in turn, from the best
        so far (``current()``), while a pass improves. A generator: it yields after each
        evaluation, so a pass can stop at a cap and resume later."""
        for pass_ in range(max_passes):
            start = current()[0]
            if pass_ == 0 and self.options.quick_sweep:
                # first, each task's full-group layouts in turn (cheap: the full-group layouts
                # of every task, summed), so that a pass cut short by a small budget has tuned
                # every task before the costly splits
                for t in [t for t, _ in current()[1].layouts]:
                    base = current()[1]
                    for lay in self.layout_options[t]:
                        if (lay, 0) != (base.layout(t), base.offset(t)):
                            trial(base.with_layout(t, lay).with_offset(t, 0))
                            yield
            if pass_ == 0:
                base = current()[1]
                if self.type_blocks:  # the splits start from GPUs in blocks of one type
                    blocked = self.type_blocked(base)
                    if blocked.order != base.order:
                        trial(blocked)
                        yield
                        base = blocked
                for i, tasks in enumerate(self._splits()):
                    split_base = base if i == 0 else current()[1]
                    if self.split_light and len(tasks) == 2 and self._training & set(tasks):
                        split_base = self.light_base(split_base, tasks)
                    yield from self._split(ev, tasks, size[tasks[0]], split_base, trial)
            for t in [t for t, _ in current()[1].layouts]:
                base = current()[1]
                cur = (base.layout(t), base.offset(t))
                for lay, off in self._options(t, size[t]):
                    if (lay, off) != cur:
                        trial(base.with_layout(t, lay).with_offset(t, off))
                        yield
            if current()[0] >= start:
                break

    def run(self, ev: Evaluator, evaluations: int) -> None:
        """Spend ``evaluations`` steps (or until the global budget ends: BudgetExhausted)."""
        for _ in range(max(int(evaluations), 0)):
            self.step(ev)
