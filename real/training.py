"""One training step of the run's training tasks, one dispatcher per way a task trains:

* :class:`SingleStage` -- whole-model (pp = 1) torch replicas: each replica's worker runs its
  micro-batches, all-reduces gradients with its DP peers (gloo) and steps;
* :class:`GPipe` -- pipelined (pp > 1) torch replicas: GPipe micro-batches over the stage
  workers, then per stage a DP all-reduce that returns its squared gradient norm, then a step
  clipped by the whole model's norm;
* :class:`MegatronStep` -- a megatron trainer: every rank of the (dp, pp, tp) grid in one
  Megatron step.

They share one small interface (:class:`Dispatcher`): :meth:`~Dispatcher.dispatch` submits a
task's replicas and returns its futures; once all tasks' futures are in,
:meth:`~Dispatcher.step` submits what follows (GPipe's clipped steps) and
:meth:`~Dispatcher.stats` reads the task's loss statistics off the results.
:func:`train_step` drives them for every training task at once, so the tasks' replicas run in
parallel. The workers are a :class:`real.worker_group.WorkerGroup`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from hetrl.plan import TaskPlacement
from real.placement import expert_dp_group_name, expert_group_name, expert_groups
from real.worker_group import Job, WorkerGroup


@dataclass(frozen=True)
class ReplicaInput:
    """One replica's share of the batch: its micro-batches (batch, extras: role key -> tensor),
    each one's loss scale (its share of the whole batch's response tokens) and where its
    rollout data comes from (device -> bytes)."""

    replica: int
    micro: list[tuple[Any, dict[str, Any]]]
    scales: list[float]
    sources: dict[int, float]


class Dispatcher:
    """The training step of one task placed as ``placement``, on ``workers``. One iteration at
    a time: :meth:`dispatch`, then (after the futures are in) :meth:`step` and :meth:`stats`."""

    def __init__(self, workers: WorkerGroup, placement: TaskPlacement):
        self.workers, self.placement, self.task = workers, placement, placement.task
        self._jobs: dict[Any, Job] = {}

    def dispatch(self, it: int, replicas: Sequence[ReplicaInput]) -> dict[Any, Job]:
        """Submit iteration ``it``'s work of every replica; returns the futures to wait for."""
        raise NotImplementedError

    def step(self, it: int, results: Mapping[Any, Any]) -> dict[Any, Job]:
        """Submit what follows once ``results`` (future -> result) are in; returns its futures
        (none unless the optimizer step waits on the driver)."""
        return {}

    def stats(self, results: Mapping[Any, Any]) -> dict[str, float]:
        """``task/statistic`` -> value: the replicas' share-weighted statistics, summed."""
        out: dict[str, float] = {}
        for ref in self._jobs:
            for k, v in results[ref].items():
                out[f"{self.task}/{k}"] = out.get(f"{self.task}/{k}", 0.0) + v
        return out


class SingleStage(Dispatcher):
    """Whole-model replicas (pp = 1): one ``train`` call per replica; with dp > 1 the replicas
    sum their gradients over the task's ``task/stage0`` group."""

    def dispatch(self, it: int, replicas: Sequence[ReplicaInput]) -> dict[Any, Job]:
        p = self.placement
        group = f"{self.task}/stage0" if p.dp > 1 else None
        group_devs = tuple(rr[0][0] for rr in p.devices)
        self._jobs = {}
        experts = expert_groups(p) if p.ep > 1 else {}
        for rep in expert_padded(p, replicas):
            d = p.devices[rep.replica][0][0]
            ep_devs, expert_dp = (), ()
            if p.ep > 1:
                ep_devs = experts[expert_group_name(self.task, rep.replica, p.ep)]
                expert_dp = experts.get(expert_dp_group_name(self.task, rep.replica, p.ep), ())
            ref = self.workers[d].train.remote(self.task, it, rep.micro, rep.scales, rep.sources,
                                               group, group_devs, ep_devs, expert_dp)
            self._jobs[ref] = (d, self.task, it)
        return dict(self._jobs)


def expert_padded(p: TaskPlacement, replicas: Sequence[ReplicaInput]) -> list[ReplicaInput]:
    """``replicas`` as they train under ``p``'s expert parallelism: the replicas of an expert
    group exchange tokens in every micro-batch, so each runs as many as the group's busiest,
    the extra ones repeating its last micro-batch at loss scale 0 (no gradient, the same
    collectives). Unchanged without expert parallelism."""
    if p.ep == 1:
        return list(replicas)
    most: dict[int, int] = {}
    for rep in replicas:
        most[rep.replica // p.ep] = max(most.get(rep.replica // p.ep, 0), len(rep.micro))
    out = []
    for rep in replicas:
        extra = most[rep.replica // p.ep] - len(rep.micro)
        out.append(replace(rep, micro=list(rep.micro) + [rep.micro[-1]] * extra,
                           scales=list(rep.scales) + [0.0] * extra))
    return out


class MegatronStep(Dispatcher):
    """A megatron trainer: every rank of a replica gets its micro-batches (one object-store
    copy per replica) and runs the replica's step; the first stage receives the rollout data."""

    def dispatch(self, it: int, replicas: Sequence[ReplicaInput]) -> dict[Any, Job]:
        import ray

        self._jobs = {}
        for rep in expert_padded(self.placement, replicas):
            shared = ray.put(rep.micro)  # one copy in the object store for all ranks
            for s, stage in enumerate(self.placement.devices[rep.replica]):
                for d in stage:
                    ref = self.workers[d].train_grid.remote(self.task, it, shared, rep.scales,
                                                            rep.sources if s == 0 else {})
                    self._jobs[ref] = (d, self.task, it)
        return dict(self._jobs)


class GPipe(Dispatcher):
    """Pipelined torch replicas (pp > 1): per replica all forwards, then all backwards, over
    its stage workers; then per stage a gradient all-reduce over the stage's DP group (the
    ``task/stage{s}`` group when dp > 1) returning the squared norm; :meth:`step` clips every
    stage by its replica's whole-model norm."""

    def dispatch(self, it: int, replicas: Sequence[ReplicaInput]) -> dict[Any, Job]:
        p = self.placement
        self._jobs, self._loss_scale, self._reduces = {}, {}, {}
        for rep in replicas:
            self._pipeline(it, rep, tuple(s[0] for s in p.devices[rep.replica]))
        for r in range(p.dp):
            for s in range(p.pp):
                d = p.devices[r][s][0]
                group = f"{self.task}/stage{s}" if p.dp > 1 else None
                ref = self.workers[d].stage_reduce.remote(self.task, it, group,
                                                          tuple(rr[s][0] for rr in p.devices))
                self._reduces[ref] = (d, r)
        return {**self._jobs, **{ref: (d, self.task, it) for ref, (d, _) in self._reduces.items()}}

    def _pipeline(self, it: int, rep: ReplicaInput, devs: tuple[int, ...]) -> None:
        """GPipe over the stage workers ``devs``: all forwards, then all backwards; the first
        stage receives the rollout data before its first micro-batch. A last-stage forward's
        result is its micro-batch's loss (weighted by its scale in :meth:`stats`)."""
        task, last = self.task, len(devs) - 1
        for m, (mb, ext) in enumerate(rep.micro):
            x, src = mb.input_ids, None
            for s, d in enumerate(devs):
                x = self.workers[d].stage_forward.remote(
                    task, it, m, x, mb, ext if s == last else None, src, rep.scales[m],
                    rep.sources if m == 0 else None)
                src = d
            self._jobs[x] = (devs[-1], task, it)
            self._loss_scale[x] = rep.scales[m]
        for m in range(len(rep.micro)):
            g, src = None, None
            for s in range(last, -1, -1):
                d = devs[s]
                g = self.workers[d].stage_backward.remote(task, it, m, g, src)
                src = d
            self._jobs[g] = (devs[0], task, it)

    def step(self, it: int, results: Mapping[Any, Any]) -> dict[Any, Job]:
        norms: dict[int, float] = {}  # replica -> sum of its stages' squared gradient norms
        for ref, (_, r) in self._reduces.items():
            norms[r] = norms.get(r, 0.0) + results[ref]
        return {self.workers[d].stage_step.remote(self.task, it, math.sqrt(norms[r])):
                (d, self.task, it) for d, r in self._reduces.values()}

    def stats(self, results: Mapping[Any, Any]) -> dict[str, float]:
        out: dict[str, float] = {}
        for ref in self._jobs:
            if ref in self._loss_scale:  # a last-stage forward: one micro-batch's loss
                out[f"{self.task}/loss"] = (out.get(f"{self.task}/loss", 0.0)
                                            + results[ref] * self._loss_scale[ref])
        return out


def dispatcher(workers: WorkerGroup, placement: TaskPlacement, megatron: bool) -> Dispatcher:
    """The dispatcher of a training task: ``megatron`` (the task runs on the megatron engine),
    else by its pipeline depth."""
    if megatron:
        return MegatronStep(workers, placement)
    return GPipe(workers, placement) if placement.pp > 1 else SingleStage(workers, placement)


def train_step(workers: WorkerGroup, it: int,
               inputs: Sequence[tuple[Dispatcher, Sequence[ReplicaInput]]]) -> dict[str, float]:
    """Iteration ``it``'s step of every training task (dispatcher, its replicas' inputs): all
    tasks' replicas submitted before any wait, then the follow-up steps; returns every task's
    statistics (``task/statistic`` -> value), in the order of ``inputs``."""
    futures: dict[Any, Job] = {}
    for disp, replicas in inputs:
        futures.update(disp.dispatch(it, replicas))
    results = dict(zip(futures, workers.get(futures), strict=True))
    steps: dict[Any, Job] = {}
    for disp, _ in inputs:
        steps.update(disp.step(it, results))
    workers.get(steps)
    stats: dict[str, float] = {}
    for disp, _ in inputs:
        stats.update(disp.stats(results))
    return stats
