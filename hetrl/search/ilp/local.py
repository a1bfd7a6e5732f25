"""A first incumbent for the phased ILP: best-response descent with random kicks.

The phased solve proves a pattern optimal faster the lower its incumbent U (candidates that
cannot beat U are pruned before any model is built), and its deepening finds no plan until its
targets pass the optimum. So before it starts, a cheap local search looks for a good plan in the
same space and under the same objective and memory rule:

- descent: task after task, switch to the candidate that makes the phased objective
  (:func:`~hetrl.search.ilp.phased.phased_objective_ms`) least with the other tasks fixed,
  among those that fit in memory beside them; until no task improves. One task's best response
  is a vector computation over all its candidates.
- kicks: from the best plan so far, two tasks (chosen at random) take a random candidate that
  fits; descend again; keep the result if better (iterated local search).

The plan it returns is an ordinary solution of the ILP, never a bound. Units: integer ms.
"""

from __future__ import annotations

import itertools

import numpy as np

from hetrl.search.ilp.data import Candidate
from hetrl.search.ilp.pairwise import GEN, TRAIN, Pairwise

_INF = np.iinfo(np.int64).max


class Descent:
    """Best responses over one candidate list per task (``pw``'s), for barrier ``stages``."""

    def __init__(self, pw: Pairwise, stages: tuple[tuple[str, ...], ...]):
        self.pw, self.stages = pw, stages
        self.tasks = pw.tasks
        self.stage_of = {t: k for k, ts in enumerate(stages) for t in ts}

    def _shares(self, ch: dict[str, int], a: str, b: str) -> bool:
        return bool(self.pw.use[a][ch[a]] @ self.pw.use[b][ch[b]] > 0)

    def _span(self, ch: dict[str, int], k: int, sync: int | None = None) -> int:
        """Stage k's length (ms) under the choice ``ch``: its heaviest clique of tasks that
        share devices; with actor training, at least its duration + ``sync`` (if given)."""
        ts = self.stages[k]
        ms = {t: int(self.pw.ms[t][ch[t]]) for t in ts}
        span = max(sum(ms[t] for t in q) for n in range(1, len(ts) + 1)
                   for q in itertools.combinations(ts, n)
                   if all(self._shares(ch, a, b) for a, b in itertools.combinations(q, 2)))
        if sync is not None and TRAIN in ts:
            span = max(span, ms[TRAIN] + sync)
        return span

    def value(self, ch: dict[str, int]) -> int:
        """The phased objective (ms) of the choice ``ch`` (a candidate index per task)."""
        sync = int(self.pw.sync(np.array([ch[GEN]]), np.array([ch[TRAIN]]))[0, 0])
        return sum(self._span(ch, k, sync) for k in range(len(self.stages)))

    def responses(self, ch: dict[str, int], t: str) -> np.ndarray:
        """The objective (ms) with task t switched to each of its candidates, the others kept;
        the largest int64 where the candidate does not fit in memory beside them."""
        pw = self.pw
        others = [u for u in self.tasks if u != t]
        used = sum(pw.mb[u][ch[u]].astype(np.int64) for u in others)
        fits = np.all(pw.mb[t] + used <= pw.cap, axis=1)
        k = self.stage_of[t]
        mates = [u for u in self.stages[k] if u != t]
        shares = {u: (pw.use[t] @ pw.use[u][ch[u]]) > 0 for u in mates}
        # stage k: the heaviest clique, with t's sharing a vector over its candidates
        span = np.zeros(len(pw.ms[t]), dtype=np.int64)
        for n in range(0, len(mates) + 1):
            for q in itertools.combinations(mates, n):
                if not all(self._shares(ch, a, b) for a, b in itertools.combinations(q, 2)):
                    continue
                rest = sum(int(pw.ms[u][ch[u]]) for u in q)
                span = np.maximum(span, rest)  # the clique without t
                with_t = np.ones(len(span), dtype=bool)
                for u in q:
                    with_t &= shares[u]
                span = np.maximum(span, np.where(with_t, pw.ms[t] + rest, 0))
        sync = int(pw.sync(np.array([ch[GEN]]), np.array([ch[TRAIN]]))[0, 0])
        last = self.stage_of[TRAIN]
        if t == TRAIN:
            sync_t = pw.sync(np.array([ch[GEN]]), np.arange(len(pw.ms[TRAIN])))[0]
            span = np.maximum(span, pw.ms[TRAIN] + sync_t)
        elif k == last:
            span = np.maximum(span, int(pw.ms[TRAIN][ch[TRAIN]]) + sync)
        total = span
        for kk in range(len(self.stages)):
            if kk == k:
                continue
            if t == GEN and kk == last:  # the sync depends on generation's candidate
                sync_g = pw.sync(np.arange(len(pw.ms[GEN])), np.array([ch[TRAIN]]))[:, 0]
                total = total + np.maximum(self._span(ch, kk), pw.ms[TRAIN][ch[TRAIN]] + sync_g)
            else:
                total = total + self._span(ch, kk, sync)
        return np.where(fits, total, _INF)

    def descend(self, ch: dict[str, int], value: int) -> tuple[dict[str, int], int]:
        """Best responses task after task until none improves the objective."""
        ch = dict(ch)
        improved = True
        while improved:
            improved = False
            for t in self.tasks:
                r = self.responses(ch, t)
                i = int(np.argmin(r))
                if r[i] < value:
                    ch[t], value, improved = i, int(r[i]), True
        return ch, value

    def search(self, start: dict[str, int], kicks: int, seed: int) -> tuple[dict[str, int], int]:
        """Descend from ``start`` (which must fit in memory), then ``kicks`` times kick two
        tasks of the best plan to random candidates that fit and descend again; the best plan
        found and its objective (ms). Deterministic for a seed."""
        rng = np.random.default_rng(seed)
        best, value = self.descend(start, self.value(start))
        for _ in range(kicks):
            ch = dict(best)
            for t in rng.choice(self.tasks, size=min(2, len(self.tasks)), replace=False):
                fitting = np.flatnonzero(self.responses(ch, str(t)) < _INF)
                ch[str(t)] = int(rng.choice(fitting))
            ch, v = self.descend(ch, self.value(ch))
            if v < value:
                best, value = ch, v
        return best, value


def local_search(pw: Pairwise, stages: tuple[tuple[str, ...], ...],
                 start: dict[str, Candidate], kicks: int, seed: int
                 ) -> tuple[dict[str, Candidate], int]:
    """:meth:`Descent.search` from the plan ``start`` (candidates of ``pw``'s lists that fit in
    memory): the best plan found and its phased objective (ms)."""
    index = {t: {id(c): i for i, c in enumerate(cs)} for t, cs in pw.cands.items()}
    ch, value = Descent(pw, stages).search({t: index[t][id(c)] for t, c in start.items()},
                                           kicks, seed)
    return {t: pw.cands[t][i] for t, i in ch.items()}, value
