"""Search baselines over the same space, cost model and budget as HetRL:

- ``deap``: a plain DEAP evolutionary algorithm (eaSimple-style: tournament selection, two-point
  crossover, polynomial-bounded mutation) over the flat encoding of all five levels; no SHA, no
  swaps.
- ``random``: random plans from the flat encoding, keeping the best.
The heterogeneity-unaware ``verl`` and two-pool ``streamrl`` baselines live in
:mod:`hetrl.search.pools`.
"""

from __future__ import annotations

import random as pyrandom
from typing import Any

import numpy as np

from hetrl.search.base import Evaluator, Scheduler, register
from hetrl.search.flat import FlatCodec
from hetrl.search.genome import decode
from hetrl.search.options import DeapOptions, FlatOptions


@register
class RandomScheduler(Scheduler):
    name = "random"
    description = "random plans from a flat encoding of all five levels; the best is kept"
    Options = FlatOptions

    def run(self, ev: Evaluator) -> dict[str, Any]:
        rng = np.random.default_rng(ev.budget.seed)
        codec = FlatCodec(ev.workload, ev.cluster.num_devices)
        lb = self.options.load_balance
        while True:
            ev.evaluate(decode(codec.decode(codec.random(rng)), ev.model, lb))


@register
class DeapScheduler(Scheduler):
    name = "deap"
    description = "plain DEAP GA (eaSimple-style) over a flat encoding of all five levels"
    Options = DeapOptions

    def run(self, ev: Evaluator) -> dict[str, Any]:
        from deap import base, creator, tools

        opts = self.options
        pop_size, cxpb, mutpb = opts.population, opts.cxpb, opts.mutpb
        lb = opts.load_balance
        codec = FlatCodec(ev.workload, ev.cluster.num_devices)
        rnd = pyrandom.Random(ev.budget.seed)  # DEAP's operators draw from `random`
        np_rng = np.random.default_rng(ev.budget.seed)
        if not hasattr(creator, "HetrlFitnessMin"):
            creator.create("HetrlFitnessMin", base.Fitness, weights=(-1.0,))
            creator.create("HetrlIndividual", list, fitness=creator.HetrlFitnessMin)
        tb = base.Toolbox()
        tb.register("mate", tools.cxTwoPoint)
        tb.register("mutate", tools.mutPolynomialBounded, eta=20.0, low=0.0, up=1.0,
                    indpb=1.0 / codec.length)
        tb.register("select", tools.selTournament, tournsize=3)

        def evaluate(ind: list[float]) -> tuple[float]:
            return (ev.evaluate(decode(codec.decode(ind), ev.model, lb)),)

        state = pyrandom.getstate()
        pyrandom.setstate(rnd.getstate())
        try:
            pop = [creator.HetrlIndividual(codec.random(np_rng)) for _ in range(pop_size)]
            for ind in pop:
                ind.fitness.values = evaluate(ind)
            while True:  # eaSimple: select, vary (crossover + mutation), evaluate the changed
                offspring = [tb.clone(x) for x in tb.select(pop, len(pop))]
                for a, b in zip(offspring[::2], offspring[1::2], strict=False):
                    if pyrandom.random() < cxpb:
                        tb.mate(a, b)
                        del a.fitness.values, b.fitness.values
                for ind in offspring:
                    if pyrandom.random() < mutpb:
                        tb.mutate(ind)
                        del ind.fitness.values
                for ind in offspring:
                    if not ind.fitness.valid:
                        ind.fitness.values = evaluate(ind)
                pop[:] = offspring
        finally:
            pyrandom.setstate(state)
