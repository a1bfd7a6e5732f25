"""Workflow aggregation: from task times to the time of one iteration.

Sync (a barrier per iteration): T = T_gen + Phi(inference tasks) + Phi(training tasks) + T_sync.
Phi over a stage's tasks: tasks whose device sets overlap (transitively) run one after another,
disjoint ones in parallel -- the makespan is the largest sum over such clusters. With an explicit
eta (CostParams.eta), Phi = eta * max + (1 - eta) * sum, as in the paper.

Async with staleness k: generation of batch j may use weights up to k versions older than sync
would (batch j waits for training of batch j-1-k plus the sync). In steady state the period P is
the larger of (a) the dependency cycle through k+1 iterations, (T_gen + T_inf + T_train +
T_sync) / (k + 1), (b) the busiest device's work per iteration (every task on it, plus the
weight load on generation devices), and (c) the training stage plus the inference tasks of
trained models and those on the trainer's GPUs (training consumes batches in order; critic
inference and the actor's log-prob recomputation of batch i+1 need the model trained on batch
i; a task holds all its GPUs while it runs, so inference of batch i+1 that shares GPUs with
training, directly or through another inference task, runs between training on batch i and
on batch i+1): overlap is limited by shared devices, weight sync and those tasks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hetrl.spec.tasks import NEEDS_TRAINED


def stage_makespan(names: Sequence[str], seconds: Mapping[str, float],
                   devices: Mapping[str, frozenset[int]], eta: float | None,
                   memo: dict | None = None) -> float:
    """Phi: the time for independent tasks ``names`` of one workflow stage. ``memo``: a dict
    that keeps the merge steps per (names, device sets), replayed on new times (same sums)."""
    times = [seconds[n] for n in names]
    if not times:
        return 0.0
    if eta is not None:
        return eta * max(times) + (1 - eta) * sum(times)
    if memo is not None:
        key = (tuple(names), tuple([devices[n] for n in names]))
        steps = memo.get(key)
        if steps is None:
            steps = memo[key] = _merge_steps(names, devices)
        return _replay(times, steps)
    clusters: list[tuple[set[int], float]] = []
    for name in names:
        devs, t = set(devices[name]), seconds[name]
        merged = [c for c in clusters if c[0] & devs]
        for c in merged:
            clusters.remove(c)
            devs |= c[0]
            t += c[1]
        clusters.append((devs, t))
    return max(t for _, t in clusters)


def _replay(times: list[float], steps: list[tuple[int, ...]]) -> float:
    """The makespan of tasks taking ``times`` seconds, merged into clusters by ``steps`` (see
    :func:`_merge_steps`): the largest sum over the clusters."""
    sums: list[float] = []
    for t, merged in zip(times, steps, strict=True):
        for i in merged:
            t += sums[i]
        if merged:
            sums = [s for i, s in enumerate(sums) if i not in merged]
        sums.append(t)
    return max(sums)


def _merge_steps(names: Sequence[str], devices: Mapping[str, frozenset[int]]
                 ) -> list[tuple[int, ...]]:
    """Per task of ``names`` the positions of the clusters it merges with, as
    :func:`stage_makespan` builds them (the positions in its current list of clusters)."""
    clusters: list[frozenset[int]] = []
    steps = []
    for name in names:
        devs = devices[name]
        merged = tuple([i for i, c in enumerate(clusters) if not c.isdisjoint(devs)])
        if merged:
            devs = devs.union(*[clusters[i] for i in merged])
            clusters = [c for i, c in enumerate(clusters) if i not in merged]
        clusters.append(devs)
        steps.append(merged)
    return steps


def _on_trainer(stages: Sequence[Sequence[str]], devices: Mapping[str, frozenset[int]]
                ) -> set[str]:
    """The inference tasks (``stages[1]``) that share GPUs with a training task, directly or
    through other inference tasks sharing GPUs with one that does."""
    reach = frozenset().union(*[devices[n] for n in stages[-1]])
    out: set[str] = set()
    grown = True
    while grown:
        grown = False
        for n in stages[1]:
            if n not in out and not devices[n].isdisjoint(reach):
                out.add(n)
                reach = reach | devices[n]
                grown = True
    return out


def iteration_time(stages: Sequence[Sequence[str]], seconds: Mapping[str, float],
                   devices: Mapping[str, frozenset[int]], sync_s: float, mode: str,
                   staleness: int, eta: float | None, memo: dict | None = None
                   ) -> tuple[float, float]:
    """(iteration seconds, the sync-mode dependency chain seconds) for the given task times
    (``memo``: see :func:`stage_makespan`)."""
    if memo is not None and eta is None:
        # one memo look-up for all stages: their merge steps per (task names, device sets)
        names = tuple([n for stage in stages for n in stage])
        key = (names, tuple([devices[n] for n in names]))
        steps = memo.get(key)
        if steps is None:
            steps = memo[key] = [_merge_steps(stage, devices) for stage in stages]
        spans = [_replay([seconds[n] for n in stage], s) if stage else 0.0
                 for stage, s in zip(stages, steps, strict=True)]
    else:
        spans = [stage_makespan(names, seconds, devices, eta, memo) for names in stages]
    chain = sum(spans) + sync_s
    if mode == "sync":
        return chain, chain
    # Training consumes batches in order, and inference by a trained model (critic values, the
    # actor's old log-probs) of batch i+1 needs it trained on batch i: a cycle of one
    # iteration through the training stage.
    trained = [n for n in NEEDS_TRAINED if n in seconds]
    # ... and inference of batch i+1 on GPUs that training holds (with the tasks that share
    # GPUs with it, transitively: a task holds all its GPUs while it runs) waits for training
    # on batch i, and training on batch i+1 waits for it: one cycle through the trainer's GPUs
    on_trainer = _on_trainer(stages, devices)
    waiting = [n for n in stages[1] if n in trained or n in on_trainer]
    cycle = spans[-1] + (stage_makespan(waiting, seconds, devices, eta) if waiting else 0.0)
    busy: dict[int, float] = {}
    for stage in stages:
        for name in stage:
            for d in devices[name]:
                busy[d] = busy.get(d, 0.0) + seconds[name]
    for d in devices[stages[0][0]]:
        busy[d] = busy.get(d, 0.0) + sync_s
    period = max(chain / (staleness + 1), max(busy.values()), cycle)
    return period, chain
