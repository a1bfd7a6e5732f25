"""The generation task of :class:`~hetrl.cost.model.CostModel`: each rollout replica priced by
its engine (:func:`hetrl.cost.tasks.generation_engine`) under the KV budget its devices leave,
the slowest replica counting (docs/cost-model.md, "Generation tasks"). A mixin."""

from __future__ import annotations

from typing import Any

import numpy as np

from hetrl.cost.memo import STAGE_STARTS
from hetrl.cost.result import TaskResult
from hetrl.cost.tasks import ReplicaCost
from hetrl.plan import TaskPlacement


class GenerationTerms:
    """The generation task (mixed into CostModel)."""

    def generation_cost(self, p: TaskPlacement, kv_budget: np.ndarray) -> TaskResult:
        """The generation task on ``p`` when each device gives its engine's KV cache
        ``kv_budget`` bytes (an array over all devices of the cluster; a stage's budget is the
        smallest of its devices', rounded to 1e6 bytes): the slowest replica's seconds and parts
        plus the framework's per-call seconds, every replica's violations, and the slowest's
        concurrency and phases. Memoised per (placement, rounded budgets)."""
        shapes = self.shapes(p.task, p)
        flat, starts = self._stage_index(p)
        mins = np.minimum.reduceat(kv_budget[flat], starts).round(-6).reshape(p.dp, p.pp)
        budgets = tuple(map(tuple, mins.tolist()))
        key = (p, budgets)
        out = self._tasks.get(key)
        if out is not None:
            return out
        engine_of = self._engine
        samples, max_conc = self.workload.samples, self.workload.gen_max_concurrency
        # A replica's time rises with its sequence count for a given engine (hardware) and KV
        # budget (docs/cost-model.md), so per (engine, budget) only the replica with the most
        # sequences (the first of equals) can be the slowest: price that one. Violations depend
        # on the engine and budget alone and are reported for every replica.
        classes: dict[Any, list] = {}  # (engine, budget) -> [most sequences, its index, engine]
        members: list[Any] = []
        for i, (share, hw, budget) in enumerate(zip(p.data_shares, self.replica_hws(p),
                                                     budgets, strict=True)):
            engine = engine_of("generation", shapes, hw)
            cls_key = (id(engine), budget)
            n = samples * share
            cls = classes.get(cls_key)
            if cls is None:
                classes[cls_key] = [n, i, engine, budget]
            elif n > cls[0]:
                cls[0], cls[1] = n, i
            members.append(cls_key)
        worst: ReplicaCost | None = None
        worst_i = -1
        priced: dict[Any, ReplicaCost] = {}
        for cls_key, (n, i, engine, budget) in classes.items():
            rc = priced[cls_key] = engine.replica(n, budget, max_conc)
            if worst is None or rc.seconds > worst.seconds or (
                    rc.seconds == worst.seconds and i < worst_i):
                worst, worst_i = rc, i
        assert worst is not None
        violations: list[str] = []
        for replica, cls_key in zip(p.devices, members, strict=True):
            rc = priced[cls_key]
            if rc.violations:
                violations += [f"actor_generation replica {replica[0][0]}..: {v}"
                               for v in rc.violations]
        parts = dict(worst.parts)
        fw = self._framework["generation"]
        parts["framework"] = fw
        out = TaskResult(worst.seconds + fw, parts, tuple(violations), worst.concurrency,
                         worst.phases)
        self._tasks[key] = out
        return out

    def _stage_index(self, p: TaskPlacement) -> tuple[np.ndarray, np.ndarray]:
        """Device ids flattened (replica, stage, rank) and the start of each (replica, stage)."""
        key = (len(p.device_ids), p.tp)
        starts = STAGE_STARTS.get(key)
        if starts is None:
            starts = STAGE_STARTS.put(key, np.arange(0, key[0], key[1]))
            starts.setflags(write=False)
        return p.device_array, starts
