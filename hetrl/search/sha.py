"""HetRL (SHA-EA): nested successive halving over task groupings (level 1) and GPU-group sizes
(level 2), driving the evolutionary algorithm of :mod:`hetrl.search.ea` on levels 3-5.

Budget E evaluations (a time budget is turned into evaluations by timing a warm-up on the
all-co-located grouping's arm, which keeps what it found, and each round after the first is
replanned from the rate the last one measured; with both a time and an evaluation budget, E is
the smaller). Before the halving (our additions): the warm start prices the structures of the
cheap heuristics the space contains and tunes the best of them (hetrl/search/warm.py), so the
search never loses to those plans; screening prices every task grouping once, so the
groupings that enter the halving when E cannot afford them all are the best-priced ones.
Level 1 runs R1 = ceil(log2 |groupings|) + 1 rounds of equal budget, split evenly over the
surviving task groupings; after each round the worse half (by the best cost found) is
dropped, so the budget per survivor doubles. Inside a round, each task grouping runs the same
halving over its GPU-group sizes with its share, and at the next level-1 round keeps the best
half of them. The rounds share 30% of what is left; the rest (``exploit_fraction``, and any
rounding left-over) goes, after the best plan so far is carried into the co-located arm on all
GPUs (``carry_best``), to the EAs of the three best arms, the best warm arm and the best
all-co-located arms on all GPUs and on part of them, round robin (our addition: one noisy
early winner is not trusted with everything, and a co-located arm's worth shows only under the
polish; they go first, and polish one after the other), each polished (hetrl/search/polish.py)
whenever its best has changed, at most a third of the budget per call, a pass stopped there
resuming at the arm's next turn; after each turn of the round robin the worse half of the
finalists is dropped (a co-located arm not before its first pass has finished).

HetRL (simple), the ablation: no halving (every arm gets the same share, round robin) and
local search swaps only inside one group.

The rounds' jobs and their runner (serial or on a process pool): :mod:`hetrl.search.rounds`.
Options: :class:`hetrl.search.options.SHAOptions`.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from hetrl.search.base import (
    BudgetExhausted,
    Evaluator,
    Scheduler,
    register,
)
from hetrl.search.ea import Arm, DeviceFacts
from hetrl.search.genome import merged
from hetrl.search.options import SHAOptions
from hetrl.search.rounds import Level1, RoundRunner, affordable, halving_rounds
from hetrl.search.space import task_groupings
from hetrl.search.warm import warm_start


def sample_sizes(n: int, groups: int, k: int, rng: np.random.Generator,
                 node_size: int = 8) -> list[tuple[int, ...]]:
    """``k`` distinct compositions of ``n`` GPUs into ``groups`` parts: the even split, a
    node-aligned split when possible, and Dirichlet draws."""
    out: list[tuple[int, ...]] = []

    def add(sizes: list[int]) -> None:
        t = tuple(int(s) for s in sizes)
        if len(t) == groups and min(t) >= 1 and sum(t) == n and t not in out:
            out.append(t)

    add([n // groups + (1 if i < n % groups else 0) for i in range(groups)])
    if n % node_size == 0 and n // node_size >= groups:
        nodes = n // node_size
        add([(nodes // groups + (1 if i < nodes % groups else 0)) * node_size for i in range(groups)])
    tries = 0
    while len(out) < k and tries < 50 * k:
        tries += 1
        w = rng.dirichlet(np.ones(groups))
        raw = 1 + w * (n - groups)
        sizes = np.floor(raw).astype(int)
        rem = n - sizes.sum()
        for i in np.argsort(-(raw - sizes))[:rem]:
            sizes[i] += 1
        if rng.random() < 0.5 and n >= node_size * groups:
            # snap to whole nodes where it keeps every part >= 1
            snapped = np.maximum(np.round(sizes / node_size) * node_size, 1).astype(int)
            snapped[-1] = n - snapped[:-1].sum()
            if snapped[-1] >= 1:
                sizes = snapped
        add(list(sizes))
    return out[:k]


def choose_finalists(alive: list[Level1], together: list[Arm], colocated: bool = True,
                     count: int = 3, warm: list[Arm] = ()) -> list[Arm]:
    """The arms of the final phase: the ``count`` best arms of the surviving groupings, the
    best warm-start arm (our addition: the floor the search must not lose to goes on being
    searched), and (``colocated``, our addition) from ``together``, the all-co-located
    grouping's arms, the best on all the GPUs and the best on part of them (a warm start's
    fast GPU types or regions), even if the halving dropped them. With part-of-group layouts
    their plans include any side-by-side split of independent tasks, which the polish
    explores and the EA alone rarely reaches, so the loss the halving ranks them by (the EA's)
    understates them (docs/search.md); they come first, the better first. Which of the two
    polishes to the better plan is not known beforehand: on hetero24 all 24 GPUs do, on paper64
    the 48 fast ones (the final phase polishes them one after the other)."""
    out = sorted((a for l1 in alive for a in l1.arms), key=lambda a: a.best)[:count]
    best_warm = min(warm, key=lambda a: a.best, default=None)
    if best_warm is not None and best_warm not in out and math.isfinite(best_warm.best):
        out.append(best_warm)
    if colocated and together:
        size = max(sum(a.sizes) for a in together)
        whole = [a for a in together if sum(a.sizes) == size]
        part = [a for a in together if sum(a.sizes) < size]
        firsts = sorted((min(arms, key=lambda a: a.best) for arms in (whole, part) if arms),
                        key=lambda a: a.best)
        for best in reversed(firsts):
            if math.isfinite(best.best):
                # first in the round robin (even if among the best already): its polish call
                # must not find the final phase spent by the others' (docs/search-history.md,
                # "Notes moved from the code")
                if best in out:
                    out.remove(best)
                out.insert(0, best)
    return out


def _hopeless(arm: Arm, total: int) -> bool:
    """Whether ``arm``'s polish pass costs more than ten times the budget of ``total``
    evaluations (it cannot get far into one: the co-located arm on 1,024 GPUs)."""
    return arm.options.polish is not None and arm.polish_cost() > 10 * total


def _ends_and_sample(items: list, ends: list, count: int, rng: np.random.Generator) -> list:
    """``ends`` (always kept) and a random subset of the other ``items``, ``count`` in all,
    the subset in the items' order."""
    middle = [x for x in items if x not in ends]
    picked = rng.choice(len(middle), size=max(count - len(ends), 0), replace=False)
    return ends + [middle[i] for i in sorted(picked.tolist())]


class _SHABase(Scheduler):
    halve = True
    swaps = "cross"
    Options = SHAOptions
    objectives = True  # every evaluation goes through the Evaluator's fitness

    def run(self, ev: Evaluator) -> dict[str, Any]:
        opts: SHAOptions = self.options
        rng = np.random.default_rng(ev.budget.seed)
        model, wl = ev.model, ev.workload
        n = ev.cluster.num_devices
        facts = DeviceFacts.of(model)
        groupings = [g for g in task_groupings(wl) if len(g) <= n]
        population = opts.population
        halving = opts.halving

        def make_arm(grouping: tuple[tuple[str, ...], ...], sizes: tuple[int, ...]) -> Arm:
            return Arm(grouping, sizes, model, facts, np.random.default_rng(rng.integers(2**63)),
                       options=opts, swaps=self.swaps)

        # With a time budget, the warm-up that turns seconds into evaluations runs on the
        # all-co-located grouping's arm (groupings come ordered by their number of groups), which
        # then goes on searching: its first plans are kept, not thrown away
        # (docs/search-history.md, "Notes moved from the code")
        warm = make_arm(groupings[0], (n,)) if ev.budget.seconds is not None else None
        total = self._evaluation_budget(ev, warm)
        # every grouping starts with one arm, its GPUs split evenly (more arms are added to the
        # groupings that enter the halving, as the budget allows)
        level1 = [Level1(g, [warm if warm is not None and g == warm.groups
                             else make_arm(g, sample_sizes(n, len(g), 1, rng)[0])], self.halve)
                  for g in groupings]
        by_grouping = {l1.grouping: l1 for l1 in level1}
        info: dict[str, Any] = {}
        warm_arms: list[Arm] = []
        if opts.warm_start is not None:
            warm_arms = warm_start(ev, by_grouping, make_arm,
                                   int(total * opts.warm_start.warm_fraction), total, info,
                                   opts)
        if halving.screening:
            self._screen(ev, level1, int(total * halving.screening_fraction), rng, info)
        alive = list(level1)
        # the co-located grouping's arms: on all the GPUs, and on the GPUs a warm start chose
        # (the fastest types, the best-connected regions) -- the halving may drop them; the best
        # on all GPUs and the best on part of them are finalists all the same (choose_finalists)
        together = [a for a in level1[0].arms if len(a.groups) == 1]
        spent0 = ev.evaluations
        # the final phase's share (docs/search-history.md: 0.5 measured better than 0.3 on
        # paper64 at 60 s; 0.7 better than 0.5 once the best plan is carried into the
        # co-located arm and the splits are screened, "The best plan carried, splits screened")
        exploit = halving.exploit_fraction
        budget = max(total - spent0, 0) * (1 - exploit)
        if self.halve:
            # Successive halving needs a minimum resource per arm (as Hyperband's r_min): the
            # first round gives every task grouping at least a population's worth of
            # evaluations, so with a small budget only some groupings enter the halving: the
            # best screened ones (without screening, a random subset with "everything
            # co-located" and "every task apart"), and every grouping a warm start tuned.
            n_arms = affordable(len(alive), budget, 2 * population, least=2)
            if n_arms < len(alive):
                alive = self._entrants(alive, n_arms, warm_arms, halving.screening, rng)
        rounds = halving_rounds(len(alive)) if self.halve else 1
        # level-2 arms per entering grouping: as many as its first round can give a
        # population's worth each (at most 6, or ``gpu_groupings``)
        first_share = budget / rounds / max(len(alive), 1)
        k = halving.gpu_groupings or max(1, min(6, int(first_share // (2 * population))))
        for l1 in alive:
            self._add_sizes(l1, k, n, rng, make_arm, halving.idle_sizes)
        info["gpu_groupings"] = k
        info["groupings_entered"] = len(alive)
        per_round = budget / rounds
        # With a time budget, the rounds also end at (1 - exploit_fraction) of the time: the
        # evaluation count derived from the warm-up can overestimate the rate, and the final
        # phase (three best arms, polish) must not be cut off by the clock.
        seconds = ev.budget.seconds
        deadline = None if seconds is None else max(ev.elapsed(), (1 - exploit) * seconds)
        runner = RoundRunner(ev, ev.budget.workers, deadline)
        completed, round_start = 0, (ev.elapsed(), ev.evaluations)
        try:
            for r in range(rounds):
                if ev.exhausted() or runner.past_deadline():
                    break
                if r > 0 and seconds is not None:
                    per_round = self._replanned(ev, runner.deadline, rounds - r, spent0,
                                                round_start, exploit)
                round_start = (ev.elapsed(), ev.evaluations)
                share = per_round / len(alive)
                for l1 in alive:
                    if r > 0 and self.halve:  # keep the best half of each survivor's GPU groupings
                        l1.arms.sort(key=lambda a: a.best)
                        l1.arms = l1.arms[: max(1, len(l1.arms) // 2)]
                runner.run([(l1, share) for l1 in alive], self.halve)
                if ev.exhausted() or runner.past_deadline():
                    break
                completed += 1
                if self.halve and len(alive) > 1:
                    alive.sort(key=lambda x: x.best)
                    alive = alive[: max(1, len(alive) // 2)]
        finally:
            runner.close()
        # The rest of the budget (``exploit_fraction`` of it, and whatever rounding left): the
        # best few arms keep evolving, round robin -- a single noisy early winner is not trusted
        # with everything.
        if halving.carry_best and together:
            self._carry_best(ev, level1, together, n, total)
        finalists = choose_finalists(alive, together, halving.colocated_finalist,
                                      warm=warm_arms)
        kept = self._final_phase(ev, finalists, total, opts)
        if opts.polish is not None:
            unfinished = [a for a in kept if not a.polish_done_once]
            info["polish_finished"] = not unfinished
            # where the largest unfinished pass fits the final phase's cap (a third of the
            # budget: see cap()), and at least twice this budget (a pass that did fit may have
            # started late, or waited for another finalist's). Not the passes' sum: a pass's
            # count is an upper estimate (docs/search.md, "Convergence")
            info["polish_budget"] = (max(3 * max(a.polish_cost() for a in unfinished), 2 * total)
                                     if unfinished else None)
        return {"halving_rounds": rounds, "halving_rounds_completed": completed, **info}

    @staticmethod
    def _carry_best(ev: Evaluator, level1: list[Level1], together: list[Arm], n: int,
                    total: int) -> None:
        """The best plan of any arm so far that the co-located arm on all ``n`` GPUs can hold,
        carried into it (:func:`~hetrl.search.genome.merged`: the same placements, as one
        group) before the final phase: a multi-group plan is one the co-located arm's
        part-of-group windows can hold, and that arm's polish moves (full-group layouts,
        splits, part-of-group options) can then start from it instead of from its own, often
        worse or infeasible, best. ``total``: the search's evaluation budget."""
        whole = [a for a in together if sum(a.sizes) == n]
        if not whole or ev.exhausted():
            return
        # when that arm's polish is hopeless (:func:`_hopeless`), the co-located arms on part
        # of the GPUs get the plan too, if they can hold it: one of them polishes in its place
        # (carried there always, the part arms lost their own structures: fig3 at 10,000
        # evaluations, 6.31% -> 6.63% above the best known)
        targets = whole[:1] + ([a for a in together if sum(a.sizes) < n]
                               if _hopeless(whole[0], total) else [])
        found = sorted(((f, g) for l1 in level1 for a in l1.arms for f, g in a.population),
                       key=lambda x: x[0])
        for arm in targets:
            # the best plan the arm can hold: a plan whose windows wrap round its group's end
            # where no turn of the group unwraps them cannot be merged (docs/search-history.md,
            # "The inner halving kept to its share"; "Wrapping windows merged")
            for f, g in found:
                if f >= arm.best:
                    break
                h = merged(g, arm.groups[0], sum(arm.sizes))
                if h is not None:
                    try:
                        arm.take(ev, h)
                    except BudgetExhausted:  # (a time budget's clock ran out meanwhile)
                        return
                    break

    @staticmethod
    def _screen(ev: Evaluator, level1: list[Level1], budget: int, rng: np.random.Generator,
                info: dict[str, Any]) -> None:
        """Price each task grouping's structured first individual (one evaluation each) before
        any EA step, so that the halving's entrants are chosen by a price, not at random. With
        fewer evaluations than groupings, a random subset is screened, "everything co-located"
        and "every task apart" always."""
        todo = [l1 for l1 in level1 if not l1.arms[0].population]
        if len(todo) > budget:
            ends = [l1 for l1 in (level1[0], level1[-1]) if l1 in todo]
            todo = _ends_and_sample(todo, ends, budget, rng)
        for l1 in todo:
            l1.arms[0].step(ev)
        info["screened"] = len(todo)

    @staticmethod
    def _entrants(alive: list[Level1], n_arms: int, warm_arms: list[Arm], screened: bool,
                  rng: np.random.Generator) -> list[Level1]:
        """The ``n_arms`` groupings that enter the halving: every grouping holding one of the
        (at most ``n_arms`` // 2) best warm arms, then the best screened groupings; without
        screening, "everything co-located", "every task apart" and a random subset."""
        if not screened:  # groupings are ordered by their number of groups
            return _ends_and_sample(alive, [alive[0], alive[-1]], n_arms, rng)
        out: list[Level1] = []
        for arm in warm_arms[: max(n_arms // 2, 1)]:
            l1 = next(x for x in alive if x.grouping == arm.groups)
            if l1 not in out:
                out.append(l1)
        for l1 in sorted(alive, key=lambda x: x.best):  # a stable sort: ties keep their order
            if len(out) >= n_arms:
                break
            if l1 not in out:
                out.append(l1)
        return out

    @staticmethod
    def _add_sizes(l1: Level1, k: int, n: int, rng: np.random.Generator, make_arm,
                   idle: bool) -> None:
        """Give grouping ``l1`` up to ``k`` level-2 arms of all GPUs (:func:`sample_sizes`)
        besides the ones it has, and (``idle``, with k >= 2) one whose sizes leave the last
        GPUs of the order idle (its structured individual puts the slowest GPU types there)."""
        g = len(l1.grouping)
        have = {a.sizes for a in l1.arms}
        full = [s for s in sample_sizes(n, g, k, rng) if s not in have]
        count = sum(1 for a in l1.arms if sum(a.sizes) == n)
        for sizes in full[: max(k - count, 0)]:
            l1.arms.append(make_arm(l1.grouping, sizes))
            have.add(sizes)
        if idle and k >= 2:
            used = n - max(n // 4, 1)
            if used >= g:
                sizes = sample_sizes(used, g, 1, rng)[0]
                if sizes not in have:
                    l1.arms.append(make_arm(l1.grouping, sizes))

    def _final_phase(self, ev: Evaluator, finalists: list[Arm], total: int,
                     opts: SHAOptions) -> list[Arm]:
        """The finalists' EAs round robin, each polished first and whenever its best changed;
        after each turn the worse half of the finalists is dropped. Returns the finalists
        kept to the end."""
        polish = opts.polish is not None

        def last_hopeless(arms: list[Arm]) -> list[Arm]:
            """A finalist whose pass costs more than ten times the budget (the co-located arm
            on all of 1,024 GPUs: 2.5 million) turns last: first, its call would take a third
            of the budget and find nothing, and the co-located arm after it would wait for a
            first pass that never ends (docs/search-history.md, "The inner halving kept to its
            share")."""
            return sorted(arms, key=lambda a: _hopeless(a, total))  # (stable: else as ranked)

        finalists = last_hopeless(finalists)

        def colocated(arm: Arm) -> bool:
            return polish and len(arm.groups) == 1

        def waiting(arm: Arm) -> bool:
            """A co-located finalist whose first polish waits for another's to finish (two
            polishing at once would halve each one's share; the better-scored goes first)."""
            return (colocated(arm) and not arm.polish_done_once and not arm.in_first_polish
                    and any(a is not arm and colocated(a) and a.in_first_polish
                            for a in finalists))

        def cap() -> int:
            """A third of the budget; with a time budget, of the evaluations the measured rate
            so far projects to the end (the warm-up's estimate can be far off either way)."""
            b = ev.budget
            if b.seconds is None or ev.elapsed() <= 0:
                return total // 3
            rate = ev.evaluations / ev.elapsed()
            projected = int(ev.evaluations + rate * max(b.seconds - ev.elapsed(), 0.0))
            return (projected if b.evaluations is None else min(projected, b.evaluations)) // 3
        try:
            while not ev.exhausted():
                for arm in finalists:
                    if polish and arm.polish_pending() and not waiting(arm):
                        # our addition: coordinate descent on levels 4-5 from the arm's best
                        # (see Arm.polish), started if the budget affords a whole pass or once
                        # the arm's EA has stalled (``stall_steps``, 0: at once); a pass
                        # stopped at its cap resumes at the arm's next turn.
                        c = cap()
                        if (arm.polishing or arm.polish_cost() <= c
                                or arm.stalled(opts.polish.stall_steps)):
                            arm.polish(ev, cap=max(1, c // opts.polish.polish_chunks))
                    arm.run(ev, 32)
                if opts.halving.final_halving and len(finalists) > 1:
                    ranked = sorted(finalists, key=lambda a: a.best)
                    # a co-located arm is a finalist because its EA's loss understates it
                    # until the polish has split its tasks: it stays while its first pass runs
                    # or waits for the other's (docs/search-history.md, "Notes moved from the
                    # code")
                    finalists = last_hopeless(ranked[: len(ranked) // 2] + [
                        a for a in ranked[len(ranked) // 2:]
                        if colocated(a) and (a.in_first_polish or waiting(a))])
        except BudgetExhausted:
            pass
        return finalists

    @staticmethod
    def _replanned(ev: Evaluator, deadline: float, rounds_left: int, spent0: int,
                   last: tuple[float, int], exploit: float) -> float:
        """With a time budget, a round's evaluations from the rate the last round measured
        (``last``: its start, as (elapsed seconds, evaluations)): what it projects to the rounds'
        deadline, split over the rounds left (capped by an evaluation budget's share, if any).
        The warm-up's rate (16 evaluations, caches cold) can be off several times either way;
        planned from it alone, the rounds either ended at the deadline with the halving
        unfinished -- the final phase then picked its arms among dozens of barely tried
        groupings -- or left much of the time unplanned. The last round's rate, not the mean
        so far: rounds speed up as fewer groupings share more evaluations (more cache hits)."""
        rate = (ev.evaluations - last[1]) / max(ev.elapsed() - last[0], 1e-6)
        out = rate * max(deadline - ev.elapsed(), 0.0) / rounds_left
        if ev.budget.evaluations is not None:
            left = (ev.budget.evaluations - spent0) * (1 - exploit) - (ev.evaluations - spent0)
            out = min(out, left / rounds_left)
        return max(out, 0.0)

    @staticmethod
    def _evaluation_budget(ev: Evaluator, warm: Arm | None) -> int:
        """The search's evaluation budget E. With a time budget, E comes from timing a warm-up
        on ``warm`` (an arm the search keeps; required then)."""
        b = ev.budget
        if b.seconds is None:
            return b.evaluations  # an evaluation budget alone: deterministic
        # A time budget (with or without an evaluation cap): time a warm-up (EA steps after
        # the initial population) to turn seconds into evaluations, and plan for whichever of
        # the two runs out first (an evaluation cap far above what the time allows must not
        # stretch the rounds beyond it).
        assert warm is not None, "a time budget needs an arm to time the warm-up on"
        warm.run(ev, 8)  # the first evaluations fill the cost model's caches: not timed
        t0 = time.perf_counter()
        warm.run(ev, 16)
        rate = 16 / max(time.perf_counter() - t0, 1e-6)
        planned = max(16, int(rate * b.seconds))
        return planned if b.evaluations is None else min(planned, b.evaluations)


@register
class HetRLScheduler(_SHABase):
    name = "hetrl"
    description = "HetRL: nested successive halving (task and GPU groupings) + evolutionary search"


@register
class HetRLSimpleScheduler(_SHABase):
    name = "hetrl-simple"
    description = "HetRL ablation: no successive halving, swaps only inside one group"
    halve = False
    swaps = "within"
