"""Genotypes of the search and their decoding into Plans.

A genotype fixes every level: ``groups`` (level 1), ``sizes`` (level 2), ``order`` -- a
permutation of device ids whose consecutive slices of ``sizes`` are the groups' GPU sets (level 3)
and whose order inside a slice is the tasklet order (level 5) -- and ``layouts`` per task
(level 4), with a per-task ``offsets`` into its group's slice (level 5: tasks of one group may use
different devices of it), and the plan's ``sync_relay`` (the weight sync's relay, a plan-wide
gene). Devices after the last slice are unused. Decoding fills each task's (dp, pp, tp) grid
from its group's slice, tp innermost, then load-balances (data shares and layer splits).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import partial

from hetrl.cost.model import CostModel
from hetrl.plan import Plan, TaskGroup, TaskPlacement, make_placement
from hetrl.search.balance import balance
from hetrl.search.space import Layout, layouts, placement_fields, sub_layouts, with_backends
from hetrl.spec.tasks import COLOCATED_WITH
from hetrl.spec.workload import WorkloadSpec


@dataclass(frozen=True)
class Genotype:
    groups: tuple[tuple[str, ...], ...]
    sizes: tuple[int, ...]
    order: tuple[int, ...]
    layouts: tuple[tuple[str, Layout], ...]  # (task, (dp, pp, tp[, backend]))
    #: (task, offset): the task's devices start this far into its group's slice (wrapping), so
    #: tasks of one group can use different devices of it (level 5); absent means 0.
    offsets: tuple[tuple[str, int], ...] = ()
    #: the plan's ``sync_relay``: one copy of the weights per remote region, then a local
    #: fan-out (docs/cost-model.md, "Weight sync")
    sync_relay: bool = False

    def slices(self) -> list[tuple[int, ...]]:
        out, start = [], 0
        for n in self.sizes:
            out.append(self.order[start:start + n])
            start += n
        return out

    def layout(self, task: str) -> Layout:
        for t, lay in self.layouts:
            if t == task:
                return lay
        raise KeyError(task)

    def offset(self, task: str) -> int:
        for t, off in self.offsets:
            if t == task:
                return off
        return 0

    def with_layout(self, task: str, lay: Layout) -> Genotype:
        return replace(self, layouts=tuple((t, lay if t == task else old) for t, old in self.layouts))

    def with_order(self, order: tuple[int, ...]) -> Genotype:
        return replace(self, order=order)

    def with_relay(self, relay: bool) -> Genotype:
        return replace(self, sync_relay=relay)

    def with_offset(self, task: str, offset: int) -> Genotype:
        rest = tuple((t, o) for t, o in self.offsets if t != task)
        return replace(self, offsets=rest + (((task, offset),) if offset else ()))


def _unwrapping_turn(windows: list[tuple[int, int]], n: int) -> int | None:
    """A turn ``r`` of a group's slice of ``n`` GPUs (position ``(i + r) % n`` first) after which
    no (offset, size) window wraps round the slice's end, trying each window's start in turn;
    0 where none wraps, None where no turn unwraps them all."""
    for r in [0] + sorted({off for off, _ in windows}):
        if all((off - r) % n + size <= n for off, size in windows):
            return r
    return None


def merged(g: Genotype, tasks: tuple[str, ...], size: int) -> Genotype | None:
    """``g`` as one group of its first ``size`` GPUs (at least all its groups' GPUs) holding
    ``tasks`` (all of ``g``'s, in this order): every task keeps its layout on the same GPUs, at
    the offset of its window in the merged slice, so the plan decodes to the same placements.
    A group with a window wrapping round its end is turned first (its slice rotated so that
    every window's GPUs stay the same, in the same order); None where no turn unwraps them
    all."""
    order, offsets, start = list(g.order), [], 0
    for grp, n in zip(g.groups, g.sizes, strict=True):
        windows = [(g.offset(t) % n, math.prod(g.layout(t)[:3])) for t in grp]
        r = _unwrapping_turn(windows, n)
        if r is None:
            return None
        order[start:start + n] = order[start + r:start + n] + order[start:start + r]
        for t, (off, _) in zip(grp, windows, strict=True):
            at = start + (off - r) % n
            if at:
                offsets.append((t, at))
        start += n
    if size < start:
        return None
    return Genotype((tasks,), (size,), tuple(order), tuple((t, g.layout(t)) for t in tasks),
                    tuple(offsets), g.sync_relay)


def candidate_layouts(workload: WorkloadSpec, task: str, n: int) -> tuple[Layout, ...]:
    info = workload.task(task)
    model = workload.model(info.role)
    return with_backends(info.kind, layouts(model, n), workload.backends, model)


def candidate_sub_layouts(workload: WorkloadSpec, task: str, n: int) -> tuple[Layout, ...]:
    info = workload.task(task)
    model = workload.model(info.role)
    return with_backends(info.kind, sub_layouts(model, n), workload.backends, model)


def decode(g: Genotype, model: CostModel, load_balance: bool = True) -> Plan:
    """The plan a genotype stands for."""
    wl = model.workload
    groups, placements = [], []
    for tasks, devices in zip(g.groups, g.slices(), strict=True):
        groups.append(TaskGroup(tasks, tuple(devices)))
        for task in tasks:
            lay = g.layout(task)
            off = g.offset(task) % len(devices)
            # searches decode the same (task, GPUs, layout, offset) again and again (a move
            # changes one task): memoised per cost model
            placements.append(model.memoised(
                ("decode", task, devices, lay, off, load_balance),
                partial(_placement, model, task, devices, lay, off, load_balance)))
    by_task = {p.task: p for p in placements}
    for t, host in COLOCATED_WITH.items():
        if t in by_task and host in by_task and not set(by_task[t].device_ids) <= set(
                by_task[host].device_ids):
            by_task[t] = model.memoised(("on host", by_task[t], by_task[host], load_balance),
                                        partial(_on_host, model, by_task[t], by_task[host],
                                                load_balance))
    order = {t: i for i, t in enumerate(wl.task_names)}
    return Plan(tuple(groups), tuple(sorted(by_task.values(), key=lambda p: order[p.task])),
                sync_relay=g.sync_relay)


def _on_host(model: CostModel, p: TaskPlacement, host: TaskPlacement,
             load_balance: bool) -> TaskPlacement:
    """``p`` moved onto its host's GPUs (a task bound to its host's weights, ``COLOCATED_WITH``:
    the actor's old log-probs on the trainer's GPUs): its layout on the first of them if it
    fits there, else the host's own (dp, pp, tp)."""
    devices = host.device_ids
    dp, pp, tp, backend, offload, ep = p.dp, p.pp, p.tp, p.backend, p.offload, p.ep
    if dp * pp * tp > len(devices):
        dp, pp, tp = host.dp, host.pp, host.tp
        if backend == "fsdp" and (pp > 1 or tp > 1):
            backend, offload = "megatron", False
        if dp % ep:  # the host's replicas in whole expert-parallel groups, as the host's are
            ep = host.ep if dp % host.ep == 0 else 1
    out = make_placement(p.task, devices[: dp * pp * tp], dp, pp, tp,
                         model.workload.model(model.workload.task(p.task).role).layers,
                         backend=backend, offload=offload, ep=ep)
    return balance(model, out) if load_balance else out


def _placement(model: CostModel, task: str, devices: tuple[int, ...], lay: Layout, off: int,
               load_balance: bool) -> TaskPlacement:
    """Task ``task`` in layout ``lay`` on its group's ``devices`` from ``off`` on (wrapping),
    load-balanced if ``load_balance``."""
    dp, pp, tp, backend, offload, ep = placement_fields(lay)
    mine = devices[off:] + devices[:off]
    p = make_placement(task, mine[: dp * pp * tp], dp, pp, tp,
                       model.workload.model(model.workload.task(task).role).layers,
                       backend=backend, offload=offload, ep=ep)
    return balance(model, p) if load_balance else p
