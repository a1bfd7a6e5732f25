"""A task's moves in the polish (:mod:`hetrl.search.polish`): its (layout, offset) options on
its group's GPUs -- the full-group layouts, and the aligned part-of-group layouts at each
aligned offset -- priced one by one, or screened by window: each window (the GPUs a layout
runs on) priced on a guess or two, and only the best-priced windows, the task's own and the
fastest that broke memory turned over all their layouts (``sweep_screen``; the splits' screen
does the same for windows of several tasks). docs/search.md, "The polish"."""

from __future__ import annotations

import math
from collections.abc import Callable, Generator

from hetrl.search.arm_view import PolishArm, PolishSpace
from hetrl.search.base import INFEASIBLE_PENALTY_S, Evaluator
from hetrl.search.genome import Genotype
from hetrl.search.options import PolishOptions
from hetrl.search.space import Layout


def offsets(used: int, n: int) -> range:
    """Offsets of a task using ``used`` of its group's ``n`` GPUs: multiples of gcd(used, n),
    so windows stay aligned to the blocks the group divides into (wrapping round)."""
    return range(0, n, math.gcd(used, n))


def rank(fitness: float, need: float) -> tuple[float, ...]:
    """How the polish compares one task's options: by fitness, ties to the option that needs
    less memory; while the plan breaks memory, by that need first (get feasible, then fast)."""
    if fitness >= INFEASIBLE_PENALTY_S:
        return (INFEASIBLE_PENALTY_S, need, fitness)
    return (fitness, need)


class TaskMoves:
    """One arm's task moves (what its polish's sweeps and coordinate passes try)."""

    def __init__(self, arm: PolishArm, space: PolishSpace, options: PolishOptions):
        self.arm, self.space = arm, space
        #: ``sweep_screen``: the windows turned after the screen (0: no screen)
        self.screen = options.sweep_screen

    def options(self, t: str, n: int) -> list[tuple[Layout, int]]:
        """(layout, offset) pairs for task ``t`` in a group of ``n`` GPUs: full-group layouts
        at offset 0, smaller ones at every offset that is a multiple of the GPUs they use."""
        out = [(x, 0) for x in self.space.layout_options[t]]
        for x in self.space.sub_options[t]:
            out += [(x, o) for o in offsets(x[0] * x[1] * x[2], n)]
        return out

    def windows(self, t: str, n: int) -> list[tuple[int, int, list[Layout]]]:
        """Task ``t``'s windows in a group of ``n`` GPUs, as (offset, GPUs, layouts): the whole
        group (its full-group layouts, offset 0), then each aligned part at each of its
        offsets -- :meth:`options` grouped by the GPUs they run on (docs/search.md counts them
        for Qwen3-8B's 666 options)."""
        out = [(0, n, list(self.space.layout_options[t]))]
        for m, lays in self.space.sub_by_used[t].items():
            out += [(o, m, lays) for o in offsets(m, n)]
        return out

    def first_guess(self, t: str, options: list[Layout], g: Genotype, start: int) -> Layout:
        """A layout of ``options`` for task ``t`` on the window of its group's GPUs from
        ``start`` on, chosen without an evaluation: the most data-parallel one whose own memory
        fits the window's smallest GPU (as the EA's seeded genotype), else the one needing
        least. (A split's other task picks its layout against this one first: against a layout
        that cannot fit, it would pick by memory alone.)"""
        part = g.slices()[self.space.group_of[t]]
        used = options[0][0] * options[0][1] * options[0][2]
        room = min(self.space.facts.memory[part[(start + k) % len(part)]]
                   for k in range(used)) * self.space.room
        fitting = [x for x in options if self.space.need(t, x) < room]
        if not fitting:
            return min(options, key=lambda x: self.space.need(t, x))
        return max(fitting, key=lambda x: (x[0], -x[1]))

    def guesses(self, t: str, options: list[Layout], g: Genotype, start: int,
                like: Layout) -> list[Layout]:
        """The layouts of ``options`` (one window's) the screen prices task ``t`` on:
        :meth:`first_guess`, and where it differs the one most like ``like`` (the task's
        layout now: the same pipeline and tensor widths and backend, the most data
        replicas)."""
        out = [self.first_guess(t, options, g, start)]
        same = [x for x in options if x[1:] == like[1:]]
        if same and max(same, key=lambda x: x[0]) != out[0]:
            out.append(max(same, key=lambda x: x[0]))
        return out

    def sweep(self, ev: Evaluator, t: str, g: Genotype, f0: float,
              trial: Callable[[Genotype, float], None]
              ) -> Generator[None, None, tuple[float, Genotype]]:
        """Task ``t``'s moves from ``g`` (fitness ``f0``), each priced (one evaluation, handed
        to ``trial``; a generator that yields after each); returns the best (fitness,
        genotype), ``g`` included, by :func:`rank`. Without ``sweep_screen``, every option.
        With it, by window (:meth:`windows`): each window but the task's own priced on its
        guesses (:meth:`guesses`), then the ``sweep_screen`` best-priced windows, the task's
        own and the window whose guess broke memory but would be the fastest had it fitted,
        each over all its layouts."""
        n = self.space.group_size[t]
        need = self.space.need
        cur = (g.layout(t), g.offset(t))
        best = (rank(f0, need(t, cur[0])), f0, g)
        seen = {cur}

        def price(moves: list[tuple[Layout, int]]) -> Generator[tuple[float, ...], None, None]:
            """Each of ``moves`` priced (together, one evaluation each as it is taken): its rank,
            the best kept."""
            nonlocal best
            hs = [g.with_layout(t, lay).with_offset(t, off) for lay, off in moves]
            for (lay, off), h, f in zip(moves, hs, self.arm.fitness_many(ev, hs), strict=True):
                seen.add((lay, off))
                trial(h, f)
                r = rank(f, need(t, lay))
                if r < best[0]:
                    best = (r, f, h)
                yield r

        def unseen(moves: list[tuple[Layout, int]]) -> list[tuple[Layout, int]]:
            """``moves`` not priced yet, each once, in order."""
            return list(dict.fromkeys(m for m in moves if m not in seen))

        if not self.screen:
            for _ in price(unseen(self.options(t, n))):
                yield
            return best[1], best[2]
        windows = self.windows(t, n)
        own, guessed = [], []
        for i, (off, _, lays) in enumerate(windows):
            if off == cur[1] and cur[0] in lays:
                own.append(i)
                continue
            guessed += [(i, (lay, off)) for lay in self.guesses(t, lays, g, off, cur[0])]
        by_window: dict[int, tuple[float, ...]] = {}
        for (i, _), r in zip(guessed, price([m for _, m in guessed]), strict=True):
            by_window[i] = r if i not in by_window else min(by_window[i], r)
            yield
        ranked = sorted((r, i) for i, r in by_window.items())
        # a guess that breaks memory ranks after every one that fits, though another layout
        # on its window (more pipeline stages or tensor ranks) may fit
        broken = [(r[2], i) for r, i in ranked if r[0] >= INFEASIBLE_PENALTY_S]
        turned = [i for _, i in ranked[:self.screen]] + own + ([min(broken)[1]] if broken else [])
        for _ in price(unseen([(lay, windows[i][0]) for i in turned for lay in windows[i][2]])):
            yield
        return best[1], best[2]

    def cost(self, t: str) -> int:
        """About how many evaluations :meth:`sweep` of task ``t`` takes (counted, not priced):
        every option, or with ``sweep_screen`` two guesses a window and the layouts of the
        largest windows it may turn (an upper estimate)."""
        n = self.space.group_size[t]
        if not self.screen:
            return len(self.options(t, n))
        sizes = sorted((len(lays) for _, _, lays in self.windows(t, n)), reverse=True)
        return 2 * len(sizes) + sum(sizes[: self.screen + 2])
