"""Genotypes of the search and their decoding into Plans.

A genotype fixes every level: ``groups`` (level 1), ``sizes`` (level 2), ``order`` -- a
permutation of device ids whose consecutive slices of ``sizes`` are the groups' GPU sets (level 3)
and whose order inside a slice is the tasklet order (level 5) -- and ``layouts`` per task
(level 4). Devices after the last slice are unused. Decoding fills each task's (dp, pp, tp) grid
from its group's slice, tp innermost, then load-balances (data shares and layer splits).
"""

from __future__ import annotations

from dataclasses import dataclass

from hetrl.cost.model import CostModel
from hetrl.plan import Plan, TaskGroup, make_placement
from hetrl.search.balance import balance
from hetrl.search.space import Layout, layouts
from hetrl.spec.workload import WorkloadSpec


@dataclass(frozen=True)
class Genotype:
    groups: tuple[tuple[str, ...], ...]
    sizes: tuple[int, ...]
    order: tuple[int, ...]
    layouts: tuple[tuple[str, Layout], ...]  # (task, (dp, pp, tp))

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

    def with_layout(self, task: str, lay: Layout) -> Genotype:
        return Genotype(self.groups, self.sizes, self.order,
                        tuple((t, lay if t == task else old) for t, old in self.layouts))


def candidate_layouts(workload: WorkloadSpec, task: str, n: int) -> tuple[Layout, ...]:
    return layouts(workload.model(workload.task(task).role), n)


def decode(g: Genotype, model: CostModel, load_balance: bool = True) -> Plan:
    """The plan a genotype stands for."""
    wl = model.workload
    groups, placements = [], []
    for tasks, devices in zip(g.groups, g.slices(), strict=True):
        groups.append(TaskGroup(tasks, tuple(devices)))
        for task in tasks:
            dp, pp, tp = g.layout(task)
            role = wl.task(task).role
            p = make_placement(task, devices[: dp * pp * tp], dp, pp, tp, wl.model(role).layers)
            placements.append(balance(model, p) if load_balance else p)
    order = {t: i for i, t in enumerate(wl.task_names)}
    placements.sort(key=lambda p: order[p.task])
    return Plan(tuple(groups), tuple(placements))
