"""The polish (our addition to SHA-EA): coordinate descent on levels 4-5 from an arm's best
genotype, run by SHA-EA's final phase. A pass: the weight sync's relay flipped (on clusters of
several regions), a quick sweep over each task's full-group layouts, then each group's GPUs put
in blocks of one type, pairs (then triples) of independent
tasks of a group split over consecutive windows of it (the tasks taking turns at their
layouts) and each task alone on the windows of one type or all but one (screened together:
the sets whose first-priced splits pay go first), then each task's moves over its full-group
and aligned part-of-group (layout, offset) options (:mod:`hetrl.search.moves`: screened by
window, as the splits are). What it finds joins the arm's population as a genotype. A pass
that ended below where it started is followed by one from its end; once a whole pass finds
nothing, the next starts from the best kicked (iterated local search, :mod:`hetrl.search.kicks`).
docs/search.md says what each step does; docs/search-history.md why.

A :class:`Polisher` belongs to one arm of :mod:`hetrl.search.ea`, which it sees through two narrow
interfaces (:mod:`hetrl.search.arm_view`): :class:`PolishArm` (price, move, adopt) and
:class:`PolishSpace` (the arm's layouts and facts); it takes its own
:class:`~hetrl.search.options.PolishOptions`. Imports go one way: ``polish`` -> ``kicks``,
``moves`` -> ``arm_view``. The pass is a
generator, so a pass stopped at a cap resumes later.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from hetrl.search.arm_view import PolishArm, PolishSpace
from hetrl.search.base import Evaluator
from hetrl.search.genome import Genotype
from hetrl.search.kicks import Kicks
from hetrl.search.moves import TaskMoves, offsets, rank
from hetrl.search.options import PolishOptions
from hetrl.search.space import Layout

#: Splits the screen builds and prices together (:meth:`Polisher._screen`): a chunk is built
#: before the first of it is priced, so that a time budget's clock is still looked at between
#: chunks on 1,024 GPUs, where a triple has very many splits.
SCREEN_CHUNK = 64


@dataclass
class _SplitRun:
    """One split of :meth:`Polisher._split` while its tasks take turns (working state)."""

    shape: tuple[tuple[str, ...], tuple[int, ...]]  #: (task order, window sizes)
    options: list[list[Layout]]  #: each task's layouts on its window, in ``shape``'s order
    genotype: Genotype
    fitness: float = math.inf  #: of ``genotype``, once a turn has run (seconds)
    kept: int = 0  #: turns in a row whose task kept its layout


class Polisher:
    """The polish of one arm: its pass in progress and what the last pass ended with."""

    def __init__(self, arm: PolishArm, space: PolishSpace, options: PolishOptions):
        self.arm, self.space, self.options = arm, space, options
        #: a task's moves: its (layout, offset) options, priced all or screened by window
        self.moves = TaskMoves(arm, space, options)
        self._polish_cost: int | None = None
        #: the polish pass in progress (a generator, see :meth:`polish`), its [best fitness,
        #: best genotype], and the arm's best when the last pass finished
        self._polisher: Iterator[None] | None = None
        self._polish_state: list = [float("inf"), None]
        self._polished_best = float("nan")
        #: the arm's best when the pass in progress started
        self._pass_from = float("inf")
        #: the fitness the pass in progress started from (a kicked genotype's, a chain's end)
        self._pass_start = float("inf")
        #: (fitness, genotype) where the last finished pass ended, if it improved on where it
        #: started: the next pass goes on from there (None: from the arm's best, kicked)
        self._chain: tuple[float, Genotype] | None = None
        #: iterated local search's kicks: where a pass starts once one from the best found
        #: nothing
        self.kicks = Kicks(self)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_polisher"] = None  # a generator does not pickle: a pass in progress restarts
        return state

    def _independent_sets(self, k: int) -> list[tuple[str, ...]]:
        """Sets of ``k`` tasks of one group no two of which depend (transitively) on each other:
        they can run side by side on disjoint windows of the group. Sets with more training
        tasks first (the costliest tasks of an RL iteration), then in workflow order."""
        wl = self.space.workload
        before: dict[str, set[str]] = {}
        for info in wl.tasks:  # workflow order: dependencies come first
            deps = set(info.depends_on)
            for d in info.depends_on:
                deps |= before.get(d, set())
            before[info.name] = deps
        out = []
        for grp in self.space.groups:
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
        if not self.options.split_triples:
            return pairs
        out, triples = list(pairs), []
        for t in self._independent_sets(3):
            n = self.space.group_size[t[0]]
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
        blocked = self.type_reordered(g, 0)
        assert blocked is not None  # (every group has its first order)
        return blocked

    def type_reordered(self, g: Genotype, turn: int) -> Genotype | None:
        """``g`` with each group's GPUs in type blocks (:meth:`type_blocked`), the types in the
        ``turn``-th order of ``itertools.permutations`` over their order of first appearance
        (``turn`` 0: that order; nodes within a type keep theirs). A group with fewer orders
        keeps its GPUs as they are; None when no group has a ``turn``-th order."""
        f = self.space.facts
        order, start, reordered = list(g.order), 0, False
        for n in g.sizes:
            part = order[start:start + n]
            types = list(dict.fromkeys(f.gpu[d] for d in part))
            ranked = next(itertools.islice(itertools.permutations(types), turn, None), None)
            if ranked is not None:
                reordered = True
                type_rank = {t: i for i, t in enumerate(ranked)}
                node_rank = {m: i for i, m in enumerate(dict.fromkeys(f.node[d] for d in part))}
                order[start:start + n] = sorted(part, key=lambda d: (type_rank[f.gpu[d]],
                                                                     node_rank[f.node[d]]))
            start += n
        return g.with_order(tuple(order)) if reordered else None

    def type_windows(self, g: Genotype, group: int) -> list[tuple[int, int]]:
        """(offset, size) of the windows of ``g``'s group ``group`` that hold whole runs of one
        GPU type: each run alone and each run's complement (wrapping round), aligned sizes
        only. On a type-blocked group (:meth:`type_blocked`) each type's GPUs, and all but
        one type's."""
        part = g.slices()[group]
        n, gpu = len(part), self.space.facts.gpu
        starts = [i for i in range(n) if gpu[part[i]] != gpu[part[i - 1]]]
        r = len(starts)
        out: list[tuple[int, int]] = []
        for i in range(r):
            size = (starts[(i + 1) % r] - starts[i]) % n
            for off, m in ((starts[i], size), (starts[(i + 1) % r], n - size)):
                if 0 < m < n and self.space.aligned(m, n) and (off, m) not in out:
                    out.append((off, m))
        return out

    def light_base(self, g: Genotype, tasks: tuple[str, ...]) -> Genotype:
        """``g`` with every task but ``tasks`` in its least-memory (layout, offset) option (the
        least own bytes per GPU; ties: its own offset, then the most GPUs). A pair split moves
        two tasks onto windows where the group's other tasks may already hold their weights: on
        a crowded base the fastest splits break memory and rank last, though the sweep that
        follows could move what crowds them. The sweep then gives the other tasks back their
        best options. Used for pairs with a training task (``split_light``): training keeps
        gradients and optimizer states besides its weights, so its windows are the ones other
        tasks' weights fill. Not for other pairs, nor in addition to the base's split (the
        measurements: docs/search-history.md, "Light bases for pair splits")."""
        group = self.space.groups[self.space.group_of[tasks[0]]]
        for t, _ in g.layouts:
            if t in tasks or t not in group:
                continue
            own = g.offset(t)
            lay, off = min(self.moves.options(t, self.space.group_size[t]),
                           key=lambda o: (self.space.need(t, o[0]), o[1] != own,
                                          -o[0][0] * o[0][1] * o[0][2]))
            g = g.with_layout(t, lay).with_offset(t, off)
        return g

    def _split_shapes(self, tasks: tuple[str, ...], n: int
                      ) -> Iterator[tuple[tuple[str, ...], tuple[int, ...], list[list[Layout]]]]:
        """The ways :meth:`_split` puts ``tasks`` on consecutive windows of a group of ``n``
        GPUs: (order along the group, window sizes, each task's layouts on its window). Window
        sizes are aligned (a multiple of the node size, or n / 2) and sum to ``n``. A pair comes
        in both orders; for three tasks the first stays first (the offsets rotate the rest)."""
        exact = self.space.sub_by_used
        sizes = sorted({m for m in range(1, n) if self.space.aligned(m, n)})
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
        return range(0, n, math.gcd(self.space.node_size, n))

    def _split_runs(self, tasks: tuple[str, ...], n: int, base: Genotype
                    ) -> Iterator[_SplitRun]:
        """One :class:`_SplitRun` per (shape, offset) of ``tasks`` on a group of ``n`` GPUs
        (:meth:`_split_shapes`, :meth:`_split_offsets`), from ``base``: each task on its
        window, each but the first on a first guess (``TaskMoves.first_guess``). No evaluation;
        a generator, so that a split is priced as it is built and a time budget's clock is looked
        at between them (on 1,024 GPUs a triple has very many splits; docs/search-history.md,
        "The best plan carried, splits screened")."""
        k = len(tasks)
        for order, ms, opts in self._split_shapes(tasks, n):
            for off in self._split_offsets(ms, n):
                at = [(off + sum(ms[:i])) % n for i in range(k)]  # where each window starts
                g = base
                for t, s in zip(order, at, strict=True):
                    g = g.with_offset(t, s)
                for t, s, o in zip(order[1:], at[1:], opts[1:], strict=True):
                    g = g.with_layout(t, self.moves.first_guess(t, o, g, s))
                yield _SplitRun((order, ms), opts, g)

    def window_runs(self, t: str, base: Genotype) -> Iterator[_SplitRun]:
        """One :class:`_SplitRun` per type window of task ``t``'s group (:meth:`type_windows`):
        ``t`` on the window, on a first guess (``TaskMoves.first_guess``); no evaluation."""
        for off, m in self.type_windows(base, self.space.group_of[t]):
            opts = self.space.sub_by_used[t].get(m)
            if opts:
                g = base.with_offset(t, off)
                yield _SplitRun(((t,), (m,)), [opts],
                                g.with_layout(t, self.moves.first_guess(t, opts, g, off)))

    def _screen(self, ev: Evaluator, runs: Iterator[_SplitRun], trial,
                out: list[_SplitRun]) -> Iterator[None]:
        """Price each split of ``runs`` as it is built (one evaluation each; built and priced
        together :data:`SCREEN_CHUNK` at a time), appending it to ``out``: ``split_screen``'s
        ranking."""
        runs = iter(runs)
        while chunk := list(itertools.islice(runs, SCREEN_CHUNK)):
            priced = self.arm.fitness_many(ev, [r.genotype for r in chunk])
            for run, f in zip(chunk, priced, strict=True):
                run.fitness = f
                trial(run.genotype, f)
                out.append(run)
                yield

    def _split(self, ev: Evaluator, tasks: tuple[str, ...], splits: list[_SplitRun],
               base: Genotype, trial, screened: bool = False) -> Iterator[None]:
        """One task on type windows (:meth:`window_runs`): one turn over its layouts on each
        window that turns, nothing after. Tasks ``tasks`` (two or three) side by side on
        consecutive windows of their group (:meth:`_split_shapes`; the first window at every
        offset of :meth:`_split_offsets`): each task but the first starts on a first guess
        (``TaskMoves.first_guess``), then the tasks take turns, each its best layout on its
        window given the others', until all but one kept theirs in a row (at most
        ``split_turns``).
        The turns go breadth first over all the splits and, with ``split_halving``, after each
        turn only the better half of the splits still turning goes on (successive halving, the
        turns being the resource: a split whose first turns are poor rarely ends best). From
        the best split of each of the
        ``split_starts`` best mixes (:meth:`_mix`: window sizes and the GPU types under each
        task, with ``split_mixes``; else of each shape), one pass over the other tasks'
        (layout, offset) options: a group's tasks are coupled through memory (a task that
        needs less leaves more KV cache to generation), so single-task moves alone miss such
        plans. A pair comes in both orders, so two shapes often hold the same windows: per
        shape, the two starts were then often one split twice, and a split with other GPU types
        under the tasks was never swept (docs/search-history.md, "Sweep starts per mix")."""
        k = len(tasks)
        turning = list(range(len(splits)))
        if screened:  # only the best-priced splits turn (``split_screen``)
            cut = self.options.split_screen if k > 1 else self.options.window_screen
            turning = sorted(turning, key=lambda i: (splits[i].fitness, i))[: cut]
        for turn in range(max(k, self.options.split_turns)):
            for i in turning:
                run = splits[i]
                t, o, g = run.shape[0][turn % k], run.options[turn % k], run.genotype
                before = g.layout(t)
                best_t = None
                hs = [g.with_layout(t, x) for x in o]
                for x, h, f in zip(o, hs, self.arm.fitness_many(ev, hs), strict=True):
                    trial(h, f)
                    yield
                    # ties (common: the task is off the critical path) go to the layout that
                    # needs the least memory, leaving room to the others
                    r = rank(f, self.space.need(t, x))
                    if best_t is None or r < best_t[0]:
                        best_t = (r, f, h)
                run.fitness, run.genotype = best_t[1], best_t[2]
                run.kept = run.kept + 1 if run.genotype.layout(t) == before else 0
            # a split stops turning at a fixed point (all but one task kept their layouts in
            # a row)
            turning = [i for i in turning
                       if not (k == 1 or (turn >= k and splits[i].kept >= k - 1))]
            if self.options.split_halving and len(turning) > 1:
                turning = sorted(turning, key=lambda i: (splits[i].fitness, i))[
                    : (len(turning) + 1) // 2]
            if not turning:
                break
        if k == 1:
            return
        others = [t for t, _ in base.layouts if t not in tasks]
        starts, seen = [], set()
        # a stable sort: ties keep the order the splits were made in
        for run in sorted(splits, key=lambda r: r.fitness):
            key = self._mix(run) if self.options.split_mixes else run.shape
            if key not in seen:  # the best split of each mix (of each shape)
                seen.add(key)
                starts.append((run.fitness, run.genotype))
        for f0, g in starts[: self.options.split_starts]:
            for t in others * self.options.split_sweeps:  # greedily, each task keeping its best option
                f0, g = yield from self.moves.sweep(ev, t, g, f0, trial)

    def _mix(self, run: _SplitRun) -> frozenset[tuple[str, int, tuple[tuple[int, int], ...]]]:
        """What a split puts where, whatever the order its tasks were taken in: per task its
        window's size and the GPU types in that window (type index, count)."""
        order, sizes = run.shape
        g = run.genotype
        part = self._part(g, order[0])
        n, gpu = len(part), self.space.facts.gpu

        def types(t: str, m: int) -> tuple[tuple[int, int], ...]:
            start = g.offset(t)
            return tuple(sorted(Counter(gpu[part[(start + k) % n]] for k in range(m)).items()))
        return frozenset((t, m, types(t, m)) for t, m in zip(order, sizes, strict=True))

    def _part(self, g: Genotype, task: str) -> tuple[int, ...]:
        """The GPUs of ``task``'s group in ``g``, in order."""
        return g.slices()[self.space.group_of[task]]

    def polish_cost(self) -> int:
        """About how many evaluations one polish pass takes (counted, not evaluated): the pair
        splits, the sweeps from the best split of each shape, and one coordinate pass."""
        if self._polish_cost is None:
            self._polish_cost = self._count_polish()
        return self._polish_cost

    def _count_polish(self) -> int:
        size = self.space.group_size
        options = {t: self.moves.cost(t) for t in size}
        quick = sum(len(self.space.layout_options[t]) for t in size) if self.options.quick_sweep else 0
        return (quick + sum(options.values()) + int(self.options.type_blocks)
                + int(self.space.relay_gene) + self.window_cost()
                + sum(self.split_cost(tasks) for tasks in self._splits()))

    def window_cost(self) -> int:
        """About how many evaluations the type windows of a pass take (counted): with T GPU
        types, at most 2T windows a task, each priced once, then ``window_screen`` of them
        over the task's layouts on a window (none unscreened: the windows go with the
        splits' screen)."""
        types = len(set(self.space.facts.gpu))
        if not (self.options.window_screen and self.options.split_screen) or types < 2:
            return 0
        return sum(2 * types + self.options.window_screen * max(map(len, by.values()), default=0)
                   for by in self.space.sub_by_used.values())

    def split_cost(self, tasks: tuple[str, ...]) -> int:
        """About how many evaluations :meth:`_split` of ``tasks`` takes (counted): the turns
        over all the splits, then the sweeps."""
        size = self.space.group_size
        n, k = size[tasks[0]], len(tasks)
        shapes = count = 0  # shapes, and splits (one per shape and offset)
        # evaluations of each turn over all the splits; 2k - 1 turns: the usual fixed point
        # (the others keep their layouts when they pick again)
        turns = [0] * min(2 * k - 1, self.options.split_turns)
        for _, ms, opts in self._split_shapes(tasks, n):
            shapes += 1
            at = len(self._split_offsets(ms, n))
            count += at
            for r in range(len(turns)):
                turns[r] += at * len(opts[r % k])
        screen = self.options.split_screen
        if screen and count:  # each split priced once, then only the best-priced turn
            turns = [c * min(screen, count) // count for c in turns]
        # with halving, half the splits go on after each turn
        total = (count if screen else 0) + sum(
            c // 2 ** r if self.options.split_halving else c for r, c in enumerate(turns))
        others = sum(self.moves.cost(t) for t in size if t not in tasks)
        return total + min(shapes, self.options.split_starts) * self.options.split_sweeps * others

    def polish_pending(self) -> bool:
        """Whether :meth:`polish` has work: a pass in progress, an arm's best other than the
        one the last finished pass ended with, a pass to go on from, or -- with kicks --
        always."""
        return self._polisher is not None or (bool(self.arm.population) and (
            self.options.kick_moves > 0 or self._chain is not None
            or self.arm.best != self._polished_best))

    @property
    def in_first_polish(self) -> bool:
        """Whether the arm's first polish pass has started and not yet finished."""
        return self._polisher is not None and math.isnan(self._polished_best)

    @property
    def done_once(self) -> bool:
        """Whether a polish pass has finished."""
        return not math.isnan(self._polished_best)

    @property
    def polishing(self) -> bool:
        """Whether a polish pass is in progress (stopped at a cap, resumed by the next call)."""
        return self._polisher is not None

    def polish(self, ev: Evaluator, max_passes: int = 2, cap: int | None = None) -> None:
        """Coordinate descent from the population's best genotype (see :meth:`_descend`), for at
        most ``cap`` evaluations. A pass stopped at the cap resumes where it stopped at the next
        call; if the EA has meanwhile found a better genotype than the pass's best, the pass
        goes on from that one. After a finished pass, the next starts from the arm's best
        once it differs from what that pass ended with; until then from where that pass ended,
        if it improved on where it started, else, with ``kick_moves`` > 0, from the best
        kicked (:meth:`Kicks.kicked`; iterated local search). The best genotype a pass found joins
        the population (replacing the worst, if it is better)."""
        if not self.arm.population:
            return
        state = self._polish_state
        best_f, best = min(self.arm.population, key=lambda x: x[0])
        if self._polisher is not None and best_f < min(state[0], self._pass_from):
            # the EA found better meanwhile: the pass goes on from it (its later moves start
            # from ``current()``); neither resuming from its stale base nor restarting from the
            # EA's best did as well (docs/search-history.md, "Notes moved from the code")
            state[0], state[1] = best_f, best
        if self._polisher is None:
            self._pass_from = best_f
            if best_f == self._polished_best:  # the EA found nothing better since that pass
                if self._chain is not None:
                    # the last pass improved on where it started: the next goes on from its
                    # end, as a pass's splits start from its base only (a local optimum is
                    # where a whole pass finds nothing)
                    best_f, best = self._chain
                elif self.options.kick_moves <= 0:
                    return  # converged: nothing new to start from
                else:
                    # converged: iterated local search -- a new pass from the best kicked (the
                    # pass may end worse than the best: what it finds still joins the
                    # population if it beats the worst)
                    best = self.kicks.kicked(ev, best)
                    best_f = self.arm.fitness(ev, best)
            self._chain = None
            self._pass_start = best_f
            state = self._polish_state = [best_f, best]

            def trial(g: Genotype, f: float | None = None) -> None:
                if f is None:
                    f = self.arm.fitness(ev, g)
                if f < state[0]:
                    state[0], state[1] = f, g

            self._polisher = self._descend(ev, max_passes, self.space.group_size, trial,
                                           lambda: (state[0], state[1]))
        stop = self.arm.evaluations + (cap if cap is not None else 10**12)
        finished = False
        try:
            while self.arm.evaluations < stop:
                next(self._polisher)
        except StopIteration:
            finished = True
        except BaseException:
            self._polisher = None  # e.g. the budget ran out mid-move: the pass cannot resume
            self.arm.adopt(state)
            raise
        self.arm.adopt(state)
        if finished:
            self._polisher = None
            self._chain = (state[0], state[1]) if state[0] < self._pass_start else None
            if self.arm.best < self._polished_best:  # (False after the first pass: 0 then)
                self.kicks.new_best()
            self._polished_best = self.arm.best

    def _split_base(self, base: Genotype, tasks: tuple[str, ...]) -> Genotype:
        """The base a split of ``tasks`` starts from: ``base``, or (``split_light``, a pair with
        a training task) :meth:`light_base` of it."""
        if self.options.split_light and len(tasks) == 2 and self.space.training & set(tasks):
            return self.light_base(base, tasks)
        return base

    def _screened_splits(self, ev: Evaluator, base: Genotype, trial) -> Iterator[None]:
        """``split_screen``: every split of every task set priced as built first (and, with
        ``window_screen``, each task alone on each type window: :meth:`window_runs`), then
        the task sets in order of their best-priced split, each turning its ``split_screen``
        (a task alone: ``window_screen``) best-priced splits only: a split's first guesses
        already tell the windows that pay from those that do not, and the task set whose
        splits pay no longer waits for the turns of those before it (docs/search-history.md,
        "The best plan carried, splits screened"; "Type windows in the screen")."""
        size = self.space.group_size
        todo = [(tasks, self._split_base(base, tasks)) for tasks in self._splits()]
        if self.options.window_screen:  # each task alone on each type window
            todo += [((t,), base) for t, _ in base.layouts]
        sets = []
        for tasks, split_base in todo:
            runs: list[_SplitRun] = []
            built = (self.window_runs(tasks[0], split_base) if len(tasks) == 1
                     else self._split_runs(tasks, size[tasks[0]], split_base))
            yield from self._screen(ev, built, trial, runs)
            sets.append((min((r.fitness for r in runs), default=math.inf), len(sets), tasks,
                         runs, split_base))
        for _, _, tasks, runs, split_base in sorted(sets, key=lambda x: x[:2]):
            yield from self._split(ev, tasks, runs, split_base, trial, screened=True)

    def _descend(self, ev: Evaluator, max_passes: int, size: dict[str, int], trial,
                 current) -> Iterator[None]:
        """Pair splits (first pass), then each task's (layout, offset) in turn, from the best
        so far (``current()``), while a pass improves. A generator: it yields after each
        evaluation, so a pass can stop at a cap and resume later."""
        for pass_ in range(max_passes):
            start = current()[0]
            if self.space.relay_gene:  # the weight sync's relay flipped (one evaluation)
                base = current()[1]
                trial(base.with_relay(not base.sync_relay))
                yield
            if pass_ == 0 and self.options.quick_sweep:
                # first, each task's full-group layouts in turn (cheap: the full-group layouts
                # of every task, summed), so that a pass cut short by a small budget has tuned
                # every task before the costly splits
                for t in [t for t, _ in current()[1].layouts]:
                    base = current()[1]
                    hs = [base.with_layout(t, lay).with_offset(t, 0)
                          for lay in self.space.layout_options[t]
                          if (lay, 0) != (base.layout(t), base.offset(t))]
                    for h, f in zip(hs, self.arm.fitness_many(ev, hs), strict=True):
                        trial(h, f)
                        yield
            if pass_ == 0:
                base = current()[1]
                if self.options.type_blocks:  # the splits start from GPUs in blocks of one type
                    blocked = self.type_blocked(base)
                    if blocked.order != base.order:
                        trial(blocked)
                        yield
                        base = blocked
                if self.options.split_screen:
                    yield from self._screened_splits(ev, base, trial)
                else:
                    for i, tasks in enumerate(self._splits()):
                        split_base = base if i == 0 else current()[1]
                        split_base = self._split_base(split_base, tasks)
                        yield from self._split(ev, tasks, list(self._split_runs(
                            tasks, size[tasks[0]], split_base)), split_base, trial)
            for t in [t for t, _ in current()[1].layouts]:
                yield from self.moves.sweep(ev, t, current()[1], current()[0], trial)
            if current()[0] >= start:
                break
