"""Iterated local search's kicks for the polish (:mod:`hetrl.search.polish`): once a polish pass
from an arm's best finds nothing (a local optimum of every move the polish has), the next pass
starts from the best kicked. Three kinds of kick take turns: one task moved onto a type window
of its group, the group's GPUs put in type blocks in another order of their types, and a few
random moves (docs/search.md, "The polish"; docs/search-history.md, "Passes chained, type
orders as kicks"; "Type windows as kicks")."""

from __future__ import annotations

from hetrl.search.arm_view import KickSource
from hetrl.search.base import Evaluator
from hetrl.search.genome import Genotype
from hetrl.search.options import PolishOptions


class Kicks:
    """The kicks of one polisher: how many were made, and what is left to try since its arm's
    best last improved (:meth:`new_best` starts over)."""

    def __init__(self, polisher: KickSource):
        self.polisher = polisher
        #: kicks so far, and type-block orders tried since the best last improved
        self.count = 0
        self.orders_tried = 0
        #: the type-window moves not yet tried since the best last improved, best-priced first
        #: (None: not priced yet)
        self.windows: list[Genotype] | None = None

    @property
    def options(self) -> PolishOptions:
        """The polisher's options (``kick_*``)."""
        return self.polisher.options

    def new_best(self) -> None:
        """The arm's best improved: every type order and type window is new to it."""
        self.orders_tried, self.windows = 0, None

    def kicked(self, ev: Evaluator, g: Genotype) -> Genotype:
        """The kick from the local optimum ``g``. The kinds take turns: with ``kick_windows``,
        one task moved onto a type window (:meth:`window_kick`); with ``kick_orders``, each
        group's GPUs put in type blocks in the next order of its GPU types not yet tried
        (:meth:`Polisher.type_reordered`: the node order along a group decides which windows
        exist and which links a pipeline crosses, and no polish move changes it together with
        the layouts that pay on it); then ``kick_moves`` random moves -- also in place of a
        kind that has nothing left to try."""
        self.count += 1
        kinds = ((["windows"] if self.options.kick_windows else [])
                 + (["orders"] if self.options.kick_orders else []) + ["moves"])
        kind = kinds[(self.count - 1) % len(kinds)]
        out = None
        if kind == "windows":
            out = self.window_kick(ev, g)
        elif kind == "orders":
            self.orders_tried += 1
            out = self.polisher.type_reordered(g, self.orders_tried)
        if out is not None:
            return out
        for _ in range(self.options.kick_moves):
            g = self.polisher.arm.mutate(g)
        return g

    def window_kick(self, ev: Evaluator, g: Genotype) -> Genotype | None:
        """The next of ``g``'s tasks moved alone onto a type window of its group
        (:meth:`Polisher.window_runs <hetrl.search.polish.Polisher.window_runs>`) it is not on, its layout a first guess there: every such
        move is priced once (one evaluation each) when the first is asked for, and they come
        best-priced first, each once; None when none is left. A pass from such a start splits
        and sweeps from another base, which can lead where no pass from the local optimum
        itself does."""
        p = self.polisher
        if self.windows is None:
            # the moves the pass's type-window screen builds, priced together
            hs = [run.genotype for t, _ in g.layouts for run in p.window_runs(t, g)
                  if run.genotype != g]
            priced = zip(hs, p.arm.fitness_many(ev, hs), strict=True)
            moves = [(f, i, h) for i, (h, f) in enumerate(priced)]
            self.windows = [h for _, _, h in sorted(moves, key=lambda x: x[:2])]
        return self.windows.pop(0) if self.windows else None
