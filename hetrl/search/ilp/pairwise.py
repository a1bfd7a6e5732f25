"""Pairwise bounds for the phased ILP: which candidates can be in a plan of objective <= T.

For a candidate i of task t, every other task u must pick a candidate compatible with i: the two
fit together in every device's memory, and, where the sharing pattern keeps t and u apart, they
use disjoint devices. So u lasts at least f_u(i), the shortest compatible candidate's duration,
and the plan's objective at least LB(t = i): the stages' heaviest cliques with those durations,
the weight sync coupled with the generation or actor-training candidate that pays it (see
:meth:`Pairwise.bounds`). A candidate with LB(t = i) > T cannot be in a plan of objective <= T
and goes; that shortens other tasks' lists, so this repeats until nothing changes (a form of
CP-SAT's probing, in numpy, before the model is built). Exact: it removes only candidates that
no plan of objective <= T uses.

Units: durations in integer ms, memory in whole MB (as the CP-SAT models count them).
"""

from __future__ import annotations

import numpy as np

from hetrl.cost.model import CostModel
from hetrl.search.ilp.data import Candidate, node_blocks
from hetrl.search.ilp.model import durations_ms, layout_key, memory_mb, sync_pull_ms, usable_mb

GEN, TRAIN = "actor_generation", "actor_training"
#: Memory compatibility is computed for candidates of one task against the other task's
#: candidates still in play (:meth:`Pairwise.restrict`) only when that is at most this many
#: cells; the bounds stay valid without it, only weaker.
MEMORY_CELLS = 20_000_000
_INF = np.iinfo(np.int64).max // 4


class Pairwise:
    """The arrays the bounds need, built once per solve: durations (ms), memory (MB), device
    sets, and the weight sync of (generation, actor training) pairs (memoised per generation
    candidate). Memory compatibility is memoised per pair of tasks."""

    def __init__(self, model: CostModel, cands: dict[str, list[Candidate]]):
        self.model, self.cands = model, cands
        self.tasks = list(cands)
        n_dev = model.cluster.num_devices
        self.cap = usable_mb(model).astype(np.int32)
        self.ms = {t: np.array(v, dtype=np.int64) for t, v in durations_ms(cands).items()}
        self.mb = {t: v.astype(np.int32) for t, v in memory_mb(cands, n_dev).items()}
        self.use = {t: (v > 0).astype(np.float32) for t, v in self.mb.items()}
        self.universe = {t: np.arange(len(cs), dtype=np.int64) for t, cs in cands.items()}
        self._memory: dict[tuple[str, str], tuple] = {}
        self._init_sync(model, cands)
        self._init_sets(model, cands)

    def restrict(self, universe: dict[str, np.ndarray]) -> None:
        """Candidates outside ``universe`` (per task, sorted indices) will not be asked about
        again (none can be in a plan better than the incumbent): memory compatibility computed
        from now on is computed against the universe only."""
        self.universe = {t: np.asarray(v, dtype=np.int64) for t, v in universe.items()}

    # --- weight sync ----------------------------------------------------------------------------

    def _init_sync(self, model: CostModel, cands: dict[str, list[Candidate]]) -> None:
        """Actor training's node sets (as indices into the distinct ones) and the generation
        candidate each equals (weights shared in place: no sync), if any."""
        node_of = model.cluster.topology.node_of
        node_sets: dict[tuple[int, ...], int] = {}
        self._train_set = np.array(
            [node_sets.setdefault(tuple(sorted({int(node_of[d]) for d in c.devices})),
                                  len(node_sets)) for c in cands[TRAIN]], dtype=np.int64)
        self._node_sets = np.zeros((len(node_sets), len(model.cluster.nodes)), dtype=bool)
        for nodes, k in node_sets.items():
            self._node_sets[k, list(nodes)] = True
        gen_of = {layout_key(c): i for i, c in enumerate(cands[GEN])}
        in_place = model.workload.mode == "sync"
        self._same = np.array([gen_of.get(layout_key(c), -1) if in_place else -1
                               for c in cands[TRAIN]], dtype=np.int64)
        self._sync_rows: dict[int, np.ndarray] = {}

    def _sync_row(self, g: int) -> np.ndarray:
        """Generation candidate g's sync (ms) against each distinct node set of actor training:
        for every node g uses, the quickest pull from a node of the set; the slowest of those."""
        row = self._sync_rows.get(g)
        if row is None:
            pulls = sync_pull_ms(self.model, self.cands[GEN][g])
            n_nodes = self._node_sets.shape[1]
            p = np.array([[r[m] for m in range(n_nodes)] for r in pulls.values()], dtype=np.int64)
            pull = np.where(self._node_sets[:, None, :], p[None, :, :], _INF)  # sets, g's, all
            row = self._sync_rows[g] = pull.min(axis=2).max(axis=1)
        return row

    def longest_sync(self) -> int:
        """The longest weight sync (ms) of any (generation, actor training) pair."""
        return max((int(self._sync_row(g).max()) for g in range(len(self.cands[GEN]))),
                   default=0)

    def sync(self, gens: np.ndarray, trains: np.ndarray) -> np.ndarray:
        """The weight sync (ms) of every (generation, actor training) pair: a (gens, trains)
        array, as :func:`hetrl.search.ilp.model.sync_ms`."""
        rows = np.array([self._sync_row(int(g)) for g in gens]).reshape(len(gens), -1)
        out = rows[:, self._train_set[trains]]
        return np.where(self._same[trains][None, :] == np.asarray(gens)[:, None], 0, out)

    # --- disjoint device sets -------------------------------------------------------------------

    def _init_sets(self, model: CostModel, cands: dict[str, list[Candidate]]) -> None:
        """Each candidate's device set as its choice in every node (nothing or one block: an
        index into a tensor with one axis per node), so that "the least over sets disjoint from
        S" is a min-transform along each axis in turn: about (options per node) x (sets) steps,
        instead of (sets) x (sets). None where a set is not one block per node."""
        options = [[()] + blocks for blocks in node_blocks(model.cluster)]
        index = [{frozenset(b): k for k, b in enumerate(opts)} for opts in options]
        node_of = model.cluster.topology.node_of
        self._shape = tuple(len(o) for o in options)
        self._disjoint = [np.array([[not set(a) & set(b) for b in opts] for a in opts])
                          for opts in options]
        self._flat: dict[str, np.ndarray] | None = {}
        for t, cs in cands.items():
            flat = []
            for c in cs:
                per_node = [index[n].get(frozenset(d for d in c.devices if node_of[d] == n))
                            for n in range(len(options))]
                if None in per_node:
                    self._flat = None
                    return
                flat.append(int(np.ravel_multi_index(per_node, self._shape)))
            self._flat[t] = np.array(flat, dtype=np.int64)

    def _least_apart(self, t: str, rows: np.ndarray, u: str, cols: np.ndarray,
                     values: np.ndarray) -> np.ndarray:
        """Per row of t, the least of ``values`` (aligned with cols) over u's cols on devices
        disjoint from the row's."""
        if self._flat is None:
            apart = (self.use[t][rows] @ self.use[u][cols].T) == 0
            return np.where(apart, values[None, :], _INF).min(axis=1)
        least = np.full(int(np.prod(self._shape)), _INF, dtype=np.int64)
        np.minimum.at(least, self._flat[u][cols], values)
        least = least.reshape(self._shape)
        for axis, disjoint in enumerate(self._disjoint):
            moved = np.moveaxis(least, axis, 0)  # options of this node first
            moved = np.where(disjoint[:, :, None], moved.reshape(len(disjoint), 1, -1),
                             _INF).min(axis=0).reshape(moved.shape)
            least = np.moveaxis(moved, 0, axis)
        return least.reshape(-1)[self._flat[t][rows]]

    # --- memory ---------------------------------------------------------------------------------

    def _fit_table(self, t: str, rows: np.ndarray, u: str, cols: np.ndarray):
        """Whether candidate rows of t and cols of u fit together in every device's memory, as
        (a, table, positions of the table's rows, positions of its columns) for the candidates
        asked: a == t when the table's rows are t's (then rows, cols), else u's (cols, rows). None where that is too costly (:data:`MEMORY_CELLS`) or asked outside the
        universe. Computed per candidate of one task against the other's universe (the way that
        costs fewer new cells) as candidates are first asked for."""
        missing = {}
        for a, b, ask in ((t, u, rows), (u, t, cols)):
            memo = self._memory.get((a, b))
            missing[(a, b)] = ask if memo is None else ask[memo[0][ask] < 0]
        width = {k: len(self._memory[k][1]) if k in self._memory else len(self.universe[k[1]])
                 for k in missing}
        a, b = min(missing, key=lambda k: (len(missing[k]) * width[k], k != (t, u)))
        if len(missing[(a, b)]) * width[(a, b)] > MEMORY_CELLS:
            return None
        if len(missing[(a, b)]):
            self._add_rows(a, b, missing[(a, b)])
        row_pos, _, col_pos, table = self._memory[(a, b)]
        ask_rows, ask_cols = (rows, cols) if a == t else (cols, rows)
        if np.any(col_pos[ask_cols] < 0):
            return None
        return a, table, row_pos[ask_rows], col_pos[ask_cols]

    def _add_rows(self, a: str, b: str, new: np.ndarray) -> None:
        """Memoise candidates ``new`` of task a against the memo's columns of b (b's universe
        when the memo starts): (row positions, columns, column positions, table)."""
        memo = self._memory.get((a, b))
        if memo is None:  # the columns in order of duration (see _least_fitting)
            cols = self.universe[b][np.argsort(self.ms[b][self.universe[b]], kind="stable")]
            col_pos = np.full(len(self.ms[b]), -1, dtype=np.int64)
            col_pos[cols] = np.arange(len(cols))
            memo = (np.full(len(self.ms[a]), -1, dtype=np.int64), cols, col_pos,
                    np.zeros((0, len(cols)), dtype=bool))
        row_pos, cols, col_pos, table = memo
        x, y = self.mb[a][new], self.mb[b][cols]
        fit = np.ones((len(new), len(cols)), dtype=bool)
        if len(cols):
            # only devices where the two tasks' largest needs together can pass the capacity
            for d in np.flatnonzero(x.max(axis=0) + y.max(axis=0) > self.cap):
                fit &= np.add.outer(x[:, d], y[:, d]) <= self.cap[d]
        row_pos[new] = np.arange(len(table), len(table) + len(new))
        self._memory[(a, b)] = (row_pos, cols, col_pos, np.concatenate([table, fit]))

    def _fits(self, t: str, rows: np.ndarray, u: str, cols: np.ndarray) -> np.ndarray | None:
        """The (rows, cols) memory compatibility, or None (see :meth:`_fit_table`)."""
        memo = self._fit_table(t, rows, u, cols)
        if memo is None:
            return None
        a, table, r, c = memo
        return table[np.ix_(r, c)] if a == t else table[np.ix_(r, c)].T

    def _least_fitting(self, t: str, rows: np.ndarray, u: str, cols: np.ndarray,
                       values: np.ndarray | None = None) -> np.ndarray:
        """Per row of t, the least of ``values`` (aligned with cols; None: u's durations) over
        u's cols that fit with it in memory (over all cols where that is not known): the first
        fitting column in the values' order."""
        memo = self._fit_table(t, rows, u, cols)
        by_duration = values is None
        if values is None:
            values = self.ms[u][cols]
        if memo is None or not len(cols):
            return np.full(len(rows), values.min() if len(values) else _INF, dtype=np.int64)
        a, table, r, c = memo  # r: the table's rows, c: its columns
        if a == t and by_duration:  # the table's columns are in order of duration already
            wanted = np.zeros(table.shape[1], dtype=bool)
            wanted[c] = True
            fit = table[r] & wanted
            first = fit.argmax(axis=1)
            found = fit[np.arange(len(rows)), first]
            return np.where(found, self.ms[u][self._memory[(t, u)][1][first]], _INF)
        order = np.argsort(values, kind="stable")
        fit = table[np.ix_(r, c[order])] if a == t else table[np.ix_(r[order], c)].T
        first = fit.argmax(axis=1)
        return np.where(fit[np.arange(len(rows)), first], values[order][first], _INF)

    # --- bounds ---------------------------------------------------------------------------------

    def prune(self, keep: dict[str, np.ndarray], stages: tuple[tuple[str, ...], ...],
              cliques: list[list[tuple[str, ...]]], apart: set[tuple[str, str]], limit: int
              ) -> tuple[dict[str, np.ndarray] | None, int]:
        """Drop from ``keep`` (per task, sorted candidate indices) every candidate whose
        :meth:`bounds` exceed ``limit`` (ms), until nothing changes. Returns the lists left (None
        when a task has none left) and the pattern's lower bound (ms): the largest over the
        tasks of the least bound of a candidate left."""
        keep = {t: np.asarray(v, dtype=np.int64) for t, v in keep.items()}
        least: dict[str, int] = {}
        stale = set(self.tasks)  # tasks whose bounds may have risen since last computed
        while stale:
            for t in self.tasks:
                if t not in stale:
                    continue
                stale.discard(t)
                lb = self.bounds(t, keep, stages, cliques, apart)
                ok = lb <= limit
                if not ok.any():
                    return None, limit + 1
                least[t] = int(lb[ok].min())
                if not ok.all():
                    keep[t] = keep[t][ok]
                    stale |= set(self.tasks) - {t}
        return keep, max(least.values())

    def bounds(self, t: str, keep: dict[str, np.ndarray], stages, cliques,
               apart: set[tuple[str, str]]) -> np.ndarray:
        """LB(t = i) (ms) for every candidate i in ``keep[t]``: every other task u at its
        shortest candidate compatible with i, each stage its heaviest clique of those durations,
        summed. The last stage also lasts actor training + the weight sync: for t = actor
        training, the least over compatible generation candidates g of dur(g) + max(the stage's
        cliques, dur(i) + sync(g, i)) stands for the first and last stages; for t = generation,
        the least over compatible actor training a of dur(a) + sync(i, a); else, the least over
        compatible a of dur(a) + a's least sync over the generation candidates left."""
        rows = keep[t]

        def least(u: str, values: np.ndarray | None = None) -> np.ndarray:
            """Per row, the least of ``values`` (u's durations if None) over u's compatible
            candidates."""
            if (t, u) in apart:
                return self._least_apart(t, rows, u, keep[u],
                                         self.ms[u][keep[u]] if values is None else values)
            return self._least_fitting(t, rows, u, keep[u], values)

        best = {u: least(u) for u in self.tasks if u != t}
        best[t] = self.ms[t][rows]
        spans = [np.max([sum(best[u] for u in k) for k in cl], axis=0) for cl in cliques]
        last = len(stages) - 1
        middle = sum(spans[1:last]) if last > 1 else 0
        gens, trains = keep[GEN], keep[TRAIN]
        if t == TRAIN:  # generation and the sync it pays, per pair
            paid = (self.ms[GEN][gens][None, :]
                    + np.maximum(spans[last][:, None],
                                 self.ms[TRAIN][rows][:, None] + self.sync(gens, rows).T))
            return _least(paid, self._fits(t, rows, GEN, gens)) + middle
        if t == GEN:
            paid = self.ms[TRAIN][trains][None, :] + self.sync(rows, trains)
            synced = _least(paid, self._fits(t, rows, TRAIN, trains))
        else:  # actor training's duration + its least sync over the generation candidates left
            synced = least(TRAIN, self.ms[TRAIN][trains] + self.sync(gens, trains).min(axis=0))
        return spans[0] + middle + np.maximum(spans[last], synced)


def _least(values: np.ndarray, ok: np.ndarray | None) -> np.ndarray:
    """Per row, the least of ``values`` where ``ok`` (everywhere if None)."""
    return (values if ok is None else np.where(ok, values, _INF)).min(axis=1)
