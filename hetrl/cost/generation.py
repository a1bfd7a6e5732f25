"""The generation task's formulas over explicit inputs (docs/cost-model.md, "Generation
tasks"): each replica's KV budget per pipeline stage, and the task's result as the slowest
replica's under those budgets. No memo tables here: :class:`~hetrl.cost.model_generation.
GenerationTerms` looks them up and stores what these return."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hetrl.cost.result import TaskResult
from hetrl.cost.tasks import ReplicaCost


def stage_kv_budgets(kv_budget: np.ndarray, device_ids: np.ndarray, stage_starts: np.ndarray,
                     dp: int, pp: int) -> tuple[tuple[float, ...], ...]:
    """Per replica, per stage the KV bytes its engine may allocate: the smallest of the stage's
    devices' ``kv_budget`` (bytes, an array over all devices of the cluster), rounded to 1e6
    bytes. ``device_ids``: the placement's devices flattened (replica, stage, tp rank);
    ``stage_starts``: the index of each (replica, stage)'s first device in it."""
    mins = np.minimum.reduceat(kv_budget[device_ids], stage_starts).round(-6).reshape(dp, pp)
    return tuple(map(tuple, mins.tolist()))


def slowest_generation(engines: Sequence[Any], data_shares: Sequence[float],
                       budgets: Sequence[tuple[float, ...]], replicas: Sequence[Any],
                       samples: int, max_concurrency: int | None,
                       framework_s: float) -> TaskResult:
    """The generation task's result: the slowest replica's seconds and parts plus the
    framework's per-call ``framework_s`` (seconds), its concurrency and phases, and every
    replica's violations. Per replica: its engine (:func:`hetrl.cost.tasks.generation_engine`
    of its layout and hardware), data share (of ``samples`` sequences), KV budget per stage
    (bytes, :func:`stage_kv_budgets`) and device grid (``replicas``, for the messages). Each
    drain runs until the longest of all ``samples`` ends (the slowest replica holds it).

    A replica's time rises with its sequence count for a given engine and KV budget
    (docs/cost-model.md), so per (engine, budget) only the replica with the most sequences (the
    first of equals) can be the slowest: that one is priced. Violations depend on the engine and
    budget alone and are reported for every replica."""
    classes: dict[Any, list] = {}  # (engine, budget) -> [most sequences, its index, engine, budget]
    members: list[Any] = []
    for i, (share, engine, budget) in enumerate(zip(data_shares, engines, budgets,
                                                     strict=True)):
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
        rc = priced[cls_key] = engine.replica(n, budget, max_concurrency, samples)
        if worst is None or rc.seconds > worst.seconds or (
                rc.seconds == worst.seconds and i < worst_i):
            worst, worst_i = rc, i
    assert worst is not None
    violations: list[str] = []
    for replica, cls_key in zip(replicas, members, strict=True):
        rc = priced[cls_key]
        if rc.violations:
            violations += [f"actor_generation replica {replica[0][0]}..: {v}"
                           for v in rc.violations]
    parts = dict(worst.parts)
    parts["framework"] = framework_s
    return TaskResult(worst.seconds + framework_s, parts, tuple(violations), worst.concurrency,
                      worst.phases)
