"""The polish's task moves (``Polisher.moves``, :class:`hetrl.search.moves.TaskMoves`): every (layout, offset) option of a task, or
with ``sweep_screen`` each window priced on its guesses and only the best-priced windows, the
task's own and the fastest one that broke memory turned over all their layouts."""

from __future__ import annotations

import numpy as np
import pytest

from hetrl.cost.model import CostModel
from hetrl.search import Budget
from hetrl.search.base import INFEASIBLE_PENALTY_S, Evaluator
from hetrl.search.ea import Arm, DeviceFacts
from hetrl.search.moves import rank
from hetrl.search.options import PolishOptions, SHAOptions
from hetrl.spec.presets import cluster_preset, workload_preset


@pytest.fixture(scope="module")
def job():
    wl = workload_preset("qwen3-8b-ppo-sync")
    cluster = cluster_preset("hetero24-two-region")
    return wl, cluster, CostModel(wl, cluster)


def _moves(job, screen: int, task: str = "critic_training"):
    """Run one task's moves from a co-located arm's seeded genotype on hetero24: (arm, base
    genotype, its fitness, [(fitness, genotype)] priced in order, returned (fitness,
    genotype))."""
    wl, cluster, model = job
    arm = Arm((tuple(wl.task_names),), (24,), model, DeviceFacts.of(model),
              np.random.default_rng(0),
              options=SHAOptions(polish=PolishOptions(sweep_screen=screen)))
    ev = Evaluator(wl, cluster, Budget(evaluations=10**6), model=model)
    base = arm.seeded_genotype()
    f0 = arm.fitness(ev, base)
    seen: list = []
    gen = arm.polisher.moves.sweep(ev, task, base, f0, lambda g, f: seen.append((f, g)))
    while True:
        try:
            next(gen)
        except StopIteration as stop:
            return arm, base, f0, seen, stop.value


def test_unscreened_moves_price_every_option_once_and_return_the_best(job):
    arm, base, f0, seen, (f, g) = _moves(job, 0)
    t = "critic_training"
    options = arm.polisher.moves.options(t, 24)
    priced = [(h.layout(t), h.offset(t)) for _, h in seen]
    assert len(priced) == len(set(priced)) == len(options) - 1  # all but the task's own
    assert set(priced) | {(base.layout(t), base.offset(t))} == set(options)
    need = arm.polisher.space.need
    ranked = [(rank(x, need(t, h.layout(t))), x) for x, h in seen]
    assert f == min(ranked + [(rank(f0, need(t, base.layout(t))), f0)])[1]
    assert arm.polisher.moves.cost(t) == len(options)


def test_screened_moves_turn_the_best_windows_the_own_and_the_fastest_broken(job):
    t = "critic_training"
    arm, base, f0, seen, (f, g) = _moves(job, 3)
    p = arm.polisher
    need = p.space.need
    cur = base.layout(t)
    windows = p.moves.windows(t, 24)
    own = {i for i, (off, _, lays) in enumerate(windows) if off == base.offset(t) and cur in lays}
    # first the screen: every window but the task's own, priced on its guesses, in order
    guesses = [(i, lay, off) for i, (off, _, lays) in enumerate(windows) if i not in own
               for lay in p.moves.guesses(t, lays, base, off, cur)]
    k = len(guesses)
    assert [(h.layout(t), h.offset(t)) for _, h in seen[:k]] == [(x, o) for _, x, o in guesses]
    ranks: dict[int, tuple] = {}
    for (i, x, _), (fit, _) in zip(guesses, seen[:k], strict=True):
        ranks[i] = min(ranks.get(i, rank(fit, need(t, x))), rank(fit, need(t, x)))
    # then the turns: the 3 best-ranked windows, the task's own, and the window whose guess
    # broke memory and would be the fastest had it fitted, each over all its layouts
    expected = set(sorted(ranks, key=lambda i: (ranks[i], i))[:3]) | own
    broken = [i for i in ranks if ranks[i][0] >= INFEASIBLE_PENALTY_S]
    if broken:
        expected.add(min(broken, key=lambda i: ranks[i][2]))
    turned = {next(i for i, (off, _, lays) in enumerate(windows)
                   if off == h.offset(t) and h.layout(t) in lays) for _, h in seen[k:]}
    assert turned <= expected
    priced = {(h.layout(t), h.offset(t)) for _, h in seen} | {(cur, base.offset(t))}
    for i in expected:
        off, _, lays = windows[i]
        assert all((x, off) in priced for x in lays)
    # fewer evaluations than every option (on 24 GPUs 75 of 120; on 64 GPUs, below, under a
    # half), and the count the final phase plans with is of the same order
    assert len(seen) < len(p.moves.options(t, 24)) - 1
    assert 0.5 * len(seen) <= p.moves.cost(t) <= 2 * len(seen)
    # what it returns is the best it priced, or where it started
    assert f == min([(rank(x, need(t, h.layout(t))), x) for x, h in seen]
                    + [(rank(f0, need(t, cur)), f0)])[1]


def test_screened_moves_count_a_fraction_of_the_options_on_64_gpus():
    wl = workload_preset("qwen3-8b-ppo-sync")
    model = CostModel(wl, cluster_preset("paper64-multi-country"))
    counts = {}
    for screen in (0, 3):
        arm = Arm((tuple(wl.task_names),), (64,), model, DeviceFacts.of(model),
                  np.random.default_rng(0),
                  options=SHAOptions(polish=PolishOptions(sweep_screen=screen)))
        counts[screen] = arm.polisher.moves.cost("actor_training")
    assert counts[0] == 666  # 56 full-group layouts, 610 aligned part-of-group (layout, offset)
    assert counts[3] < counts[0] / 2  # an upper estimate: 222


def test_sweep_screen_option_is_checked():
    from hetrl.errors import SpecError
    from hetrl.search import get_scheduler

    with pytest.raises(SpecError, match="sweep_screen"):
        get_scheduler("hetrl", sweep_screen=-1)
    with pytest.raises(SpecError, match="sweep_screen"):
        get_scheduler("hetrl", polish=False, sweep_screen=2)
