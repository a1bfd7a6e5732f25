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

Our additions: warm-start individuals (``Arm.starts``, see hetrl/search/warm.py), a cheap
coordinate descent over full-group layouts (``Arm.tune``), and the polish, a deeper coordinate
descent on levels 4-5 that lives in hetrl/search/polish.py (``Arm.polisher``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any

import numpy as np

from hetrl.cost.batching import micro_batching
from hetrl.cost.flops import LM_HEAD_ROLES, stage_shapes
from hetrl.cost.fsdp import fsdp_memory_bytes
from hetrl.cost.model import CostModel
from hetrl.search.arm_view import PolishSpace
from hetrl.search.base import Evaluator
from hetrl.search.genome import Genotype, candidate_layouts, candidate_sub_layouts, decode
from hetrl.search.kernels import locality_swaps
from hetrl.search.options import SHAOptions
from hetrl.search.polish import Polisher
from hetrl.search.space import Layout, aligned, layout_key, placement_fields

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
        regions and GPU types (for the local search's swap loop)."""
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
        group_of = np.empty(len(order_l), dtype=np.int64)
        for g, (lo, hi) in enumerate(bounds):
            group_of[lo:hi] = g
        arr = np.asarray(order_l, dtype=np.int64)
        locality_swaps(arr, group_of, len(bounds), node, zone, region, gpu, n_node, n_zone,
                       n_region, n_gpu, AFF_NODE, AFF_ZONE, AFF_REGION, max_swaps)
        order_l = arr.tolist()
    # Inside each group: node by node, nodes in order of first appearance (the genotype keeps
    # control of which nodes come first).
    for lo, hi in bounds[: len(sizes)]:
        part = order_l[lo:hi]
        rank: dict[int, int] = {}
        for d in part:
            rank.setdefault(facts.node[d], len(rank))
        order_l[lo:hi] = sorted(part, key=lambda d: rank[facts.node[d]])
    return tuple(order_l)


@lru_cache(maxsize=256)
def _aligned_sub_layouts(workload, task: str, n: int, node_size: int
                         ) -> tuple[tuple[Layout, ...], dict[int, tuple[Layout, ...]]]:
    """Task ``task``'s part-of-group layouts on a group of ``n`` GPUs whose size is aligned
    (:func:`aligned`), and the same by the GPUs each uses (dp * pp * tp). A memo shared by the
    arms of a search (every arm asks, and arms go to worker processes by pickle), so read
    only: tuples, never changed in place."""
    options = tuple(x for x in candidate_sub_layouts(workload, task, n)
                    if aligned(x[0] * x[1] * x[2], n, node_size))
    by_used: dict[int, list[Layout]] = {}
    for x in options:
        by_used.setdefault(x[0] * x[1] * x[2], []).append(x)
    return options, {m: tuple(xs) for m, xs in by_used.items()}


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
        #: whether the search tries the weight sync's relay (a plan-wide gene, flipped by
        #: mutation with probability ``p_relay`` and once per tuning sweep and polish pass):
        #: only where a region holds no training, i.e. on clusters of two or more regions
        self.p_relay = o.p_relay
        self.relay_gene = o.p_relay > 0 and len(model.cluster.regions) > 1
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
        subs = {t: _aligned_sub_layouts(wl, t, sizes[i], self.node_size) if o.sub_layouts
                else ((), {}) for i, g in enumerate(groups) for t in g}
        self.sub_options = {t: sub[0] for t, sub in subs.items()}
        #: per task: the index of its group, and its group's GPU count
        self.group_of = {t: i for i, g in enumerate(groups) for t in g}
        self.group_size = {t: sizes[i] for t, i in self.group_of.items()}
        #: per task: its part-of-group layouts by GPUs used (shared by the arms: read only)
        self.sub_by_used: dict[str, dict[int, tuple[Layout, ...]]] = {
            t: sub[1] for t, sub in subs.items()}
        self._needs: dict[tuple[str, Layout], float] = {}
        self._improved: dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[int, ...]] = {}
        #: the polish of this arm (hetrl/search/polish.py); None without the polish
        self.polisher = None if o.polish is None else Polisher(self, PolishSpace(
            wl, groups, self.group_of, self.group_size, self.layout_options, self.sub_options,
            self.sub_by_used, facts, self.node_size, frozenset(self._training), self.relay_gene,
            self._need, self._room), o.polish)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["model"] = None  # a worker process attaches its own cost model
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
            dp, pp, tp, backend, offload, ep = placement_fields(lay)
            prm = self.model.params
            training = info.kind == "training"
            shape = wl.model(info.role)
            if backend == "fsdp":  # sharded states and one micro-batch's working set
                whole = stage_shapes(shape, (shape.layers,), 1, info.role in LM_HEAD_ROLES,
                                     wl.bytes_per_value)[0]
                mbs = micro_batching(wl, info.kind, task)
                recompute = wl.task_recompute_mode(task)
                need = sum(fsdp_memory_bytes(info.kind, whole, dp, wl.samples / dp, mbs,
                                             self.model.L, prm, recompute, offload))
            else:
                per_param = wl.bytes_per_value + (prm.grad_bytes + prm.optimizer_state_bytes / dp
                                                  if training else 0.0)
                # (the routed experts split over ep as well)
                need = (shape.params - shape.expert_params * (1 - 1 / ep)) / (pp * tp) \
                    * per_param
            self._needs[key] = need
        return need

    @property
    def _room(self) -> float:
        """The share of a GPU's memory a task's own bytes may take in the quick memory filters
        (:meth:`_fitting`, ``TaskMoves.first_guess``): 0.9 of the usable fraction."""
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
        when it can; for a mixture-of-experts model, among those the largest expert
        parallelism whose groups (ep x tp GPUs) fit in one node (the all-to-alls on NVLink),
        else none."""
        f = self.facts
        wl = self.model.workload
        fitting = self._fitting(t, devices)
        if wl.task(t).kind == "generation":
            low = np.minimum.accumulate([f.memory[d] for d in devices])  # the smallest GPU so far
            room = [x for x in fitting if self._need(t, x) <= 0.4 * low[x[0] * x[1] * x[2] - 1]]
            fitting = room or fitting
        if wl.model(wl.task(t).role).moe is None:
            return max(fitting, key=lambda x: (x[0], -x[1], x[0] * x[1] * x[2]))
        node = max(Counter(f.node[d] for d in devices).values())  # most GPUs in one node

        def experts_inside(x: Layout) -> int:
            ep = placement_fields(x)[5]
            return 0 if ep == 1 else ep if ep * x[2] <= node else -ep
        return max(fitting, key=lambda x: (x[0], -x[1], x[0] * x[1] * x[2], experts_inside(x)))

    def mutate(self, g: Genotype) -> Genotype:
        rng, f = self.rng, self.facts
        if self.relay_gene and rng.random() < self.p_relay:  # (no draw on one region)
            return g.with_relay(not g.sync_relay)
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
            t, lay = g.layouts[int(rng.integers(len(g.layouts)))]
            dp, pp, tp = lay[:3]
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
        self._counted(f)
        return f

    def fitness_many(self, ev: Evaluator, gs: Sequence[Genotype]) -> Iterator[float]:
        """The fitness of each of ``gs``, as :meth:`fitness` one after another would say and
        count them, priced together (:meth:`Evaluator.evaluate_many`): one evaluation per
        fitness taken."""
        plans = [decode(self.improve(g), self.model, self.load_balance) for g in gs]
        for f in ev.evaluate_many(plans):
            self._counted(f)
            yield f

    def _counted(self, f: float) -> None:
        """One evaluation of this arm, of fitness ``f``."""
        self.evaluations += 1
        if f < self.best:
            self.best = f
            self.improved_at = self.evaluations

    def tune(self, ev: Evaluator, start: tuple[float, Genotype], cap: int,
             sweeps: int = 1, tasks: tuple[str, ...] | None = None
             ) -> tuple[float, Genotype, bool]:
        """Coordinate descent over the full-group layouts from ``start`` (fitness, genotype):
        with the relay gene, first the relay flipped; then each task (of ``tasks``, default
        all) in turn keeps its best layout given the others',
        for at most ``sweeps`` sweeps (stopping early once one improves nothing) and ``cap``
        evaluations. A sweep over all tasks costs every task's full-group layouts and the shared
        moves in evaluations (far fewer than a polish pass). Used by the warm start
        on the baselines' structures, as StreamRL tunes its pools' layouts. Returns (fitness,
        genotype, whether the last sweep improved); the result joins the population."""
        state = [start[0], start[1]]
        stop = self.evaluations + cap
        improved = False
        try:
            for _ in range(sweeps):
                improved = False
                if self.relay_gene and self.evaluations < stop:  # the relay flipped
                    h = state[1].with_relay(not state[1].sync_relay)
                    f = self.fitness(ev, h)
                    if f < state[0]:
                        state[0], state[1], improved = f, h, True
                if tasks is None:  # a sweep over every task starts with the shared moves
                    for shared, options in self.shared_moves:
                        for lay in options:
                            if self.evaluations >= stop:
                                break
                            h = state[1]
                            for t in shared:
                                h = h.with_layout(t, lay).with_offset(t, 0)
                            if h == state[1]:
                                continue
                            f = self.fitness(ev, h)
                            if f < state[0]:
                                state[0], state[1], improved = f, h, True
                for t in tasks or [t for t, _ in state[1].layouts]:
                    # (one task's layouts: a neighbourhood, priced together; each candidate
                    # sets the task's layout and offset, so it is the same whichever of them
                    # the state holds)
                    base, cur = state[1], state[1].layout(t)
                    hs = [base.with_layout(t, lay).with_offset(t, 0)
                          for lay in self.layout_options[t] if lay != cur]
                    priced = self.fitness_many(ev, hs)
                    for h in hs:
                        if self.evaluations >= stop:
                            break
                        f = next(priced)
                        if f < state[0]:
                            state[0], state[1], improved = f, h, True
                if not improved or self.evaluations >= stop:
                    break
        finally:
            self.adopt(state)
        return state[0], state[1], improved

    @cached_property
    def shared_moves(self) -> list[tuple[tuple[str, ...], list[Layout]]]:
        """:meth:`tune`'s shared moves: per group, its tasks but generation (when there are
        two or more) and the full-group layouts they all have; a move puts them all on one
        layout at once (as verl gives the actor and the reference one layout, and the critic's
        tasks another). Tasks co-located on a group share its memory, so the layout that pays
        for one often pays only when all move together, which one-task moves cannot cross
        (measured: docs/search-history.md, "Numbers moved from the docstrings")."""
        kinds = {t.name: t.kind for t in self.model.workload.tasks}
        out = []
        for group in self.groups:
            rest = tuple(t for t in group if kinds[t] != "generation")
            if len(rest) >= 2:
                common = set(self.layout_options[rest[0]])
                for t in rest[1:]:
                    common &= set(self.layout_options[t])
                out.append((rest, sorted(common, key=layout_key)))
        return out

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

    # --- polish (our addition, hetrl/search/polish.py): what SHA-EA's final phase calls ---
    def polish(self, ev: Evaluator, max_passes: int = 2, cap: int | None = None) -> None:
        """Coordinate descent on levels 4-5 from the best genotype (:meth:`Polisher.polish`)."""
        self.polisher.polish(ev, max_passes, cap)

    def polish_pending(self) -> bool:
        return self.polisher.polish_pending()

    def polish_cost(self) -> int:
        return self.polisher.polish_cost()

    @property
    def polishing(self) -> bool:
        return self.polisher.polishing

    @property
    def in_first_polish(self) -> bool:
        return self.polisher.in_first_polish

    @property
    def polish_done_once(self) -> bool:
        return self.polisher.done_once

    def adopt(self, state: list) -> None:
        """Put the polish's best genotype into the population in place of the worst."""
        best_f, best = state
        worst = max(range(len(self.population)), key=lambda k: self.population[k][0])
        if best_f < self.population[worst][0] and all(g != best for _, g in self.population):
            self.population[worst] = (best_f, best)

    def take(self, ev: Evaluator, g: Genotype) -> None:
        """Price ``g`` (a genotype of this arm's groups and sizes found elsewhere) and put it
        in the population: in a free place, else in place of the worst if it is better."""
        f = self.fitness(ev, g)
        if len(self.population) < self.population_size:
            self.population.append((f, g))
        else:
            self.adopt([f, g])

    def run(self, ev: Evaluator, evaluations: int) -> None:
        """Spend ``evaluations`` steps (or until the global budget ends: BudgetExhausted)."""
        for _ in range(max(int(evaluations), 0)):
            self.step(ev)
