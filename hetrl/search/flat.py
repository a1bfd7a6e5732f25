"""A flat encoding of all five levels as a vector of floats in [0, 1) (random keys), shared by
the DEAP and random-search baselines: gene 0 picks the task grouping, the next ``max_groups``
genes the GPU-group size proportions, then one key per device (sorting the keys gives the device
order: level 3 and 5), then one gene per task choosing its layout among the candidates, then one per task choosing its
offset into its group's GPUs."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hetrl.search.balance import proportional_split
from hetrl.search.genome import Genotype, candidate_layouts
from hetrl.search.space import task_groupings
from hetrl.spec.workload import WorkloadSpec


class FlatCodec:
    def __init__(self, workload: WorkloadSpec, num_devices: int):
        self.workload = workload
        self.n = num_devices
        self.groupings = [g for g in task_groupings(workload) if len(g) <= num_devices]
        self.max_groups = max(len(g) for g in self.groupings)
        self.tasks = workload.task_names
        self.length = 1 + self.max_groups + num_devices + 2 * len(self.tasks)

    def random(self, rng: np.random.Generator) -> list[float]:
        return rng.random(self.length).tolist()

    def decode(self, genes: Sequence[float]) -> Genotype:
        x = np.clip(np.asarray(genes, dtype=float), 0.0, 1.0 - 1e-12)
        grouping = self.groupings[int(x[0] * len(self.groupings))]
        g = len(grouping)
        weights = (0.05 + x[1:1 + g]).tolist()
        sizes = proportional_split(self.n, weights)
        keys = x[1 + self.max_groups:1 + self.max_groups + self.n]
        order = tuple(int(d) for d in np.argsort(keys, kind="stable"))
        base = 1 + self.max_groups + self.n
        lay_genes = x[base:base + len(self.tasks)]
        off_genes = x[base + len(self.tasks):]
        group_size = {t: sizes[i] for i, grp in enumerate(grouping) for t in grp}
        layouts, offsets = [], []
        for t, gene, off in zip(self.tasks, lay_genes, off_genes, strict=True):
            options = candidate_layouts(self.workload, t, group_size[t])
            layouts.append((t, options[int(gene * len(options))]))
            offset = int(off * group_size[t])
            if offset:
                offsets.append((t, offset))
        return Genotype(grouping, tuple(sizes), order, tuple(layouts), tuple(offsets))
