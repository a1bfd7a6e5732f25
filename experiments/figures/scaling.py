"""Beyond the paper: how the search scales from 64 to 1024 GPUs -- search time and plan quality
(iteration time and its distance from the physical lower bound) on random heterogeneous clusters
over 16 regions, at a fixed evaluation budget."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from experiments.figures._plot import empty, save
from experiments.framework import Config, Figure, register
from hetrl.cost.bound import lower_bound
from hetrl.search import Budget, get_scheduler
from hetrl.spec.presets import workload_preset
from hetrl.spec.random_cluster import random_cluster


def scaling_cluster(gpus: int, seed: int):
    nodes = gpus // 8
    return random_cluster(seed, num_nodes=nodes, num_regions=min(16, nodes),
                          gpus=("A100-80GB", "H100", "L40S", "L4"), gpus_per_node=(8,),
                          name=f"random{gpus}-seed{seed}")


@register
class Scaling(Figure):
    name = "scaling"
    title = "Search at scale: 64 to 1024 GPUs (random mixes over 16 regions)"

    def cells(self, config: Config) -> list[dict[str, Any]]:
        sizes = config.pick((64, 128), (64, 128, 256, 512), (64, 128, 256, 512, 1024))
        evals = config.pick(40, 200, 1000)
        return [{"gpus": n, "workload": "qwen3-8b-ppo-sync", "scheduler": s, "evaluations": evals,
                 "seed": seed} for n in sizes for s in ("hetrl", "verl") for seed in range(config.seeds)]

    def compute(self, cell: dict[str, Any]) -> list[dict[str, Any]]:
        cluster = scaling_cluster(cell["gpus"], cell["seed"])
        wl = workload_preset(cell["workload"])
        r = get_scheduler(cell["scheduler"]).search(
            wl, cluster, Budget(evaluations=cell["evaluations"], seed=cell["seed"]))
        bound = lower_bound(wl, cluster)["iteration_s_lower_bound"]
        return [{**{k: cell[k] for k in ("gpus", "workload", "scheduler", "seed")},
                 "search_s": r.elapsed_s, "evaluations": r.evaluations,
                 "iteration_s": r.estimate.iteration_s, "lower_bound_s": bound,
                 "fraction_of_bound": bound / r.estimate.iteration_s}]

    def plot(self, table: pd.DataFrame, path: Path) -> None:
        if table.empty:
            return empty(path, self.title)
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
        for s, sub in table.groupby("scheduler"):
            m = sub.groupby("gpus")[["search_s", "fraction_of_bound"]].mean()
            axes[0].plot(m.index, m["search_s"], "o-", label=s)
            axes[1].plot(m.index, m["fraction_of_bound"], "o-", label=s)
        axes[0].set_xscale("log", base=2)
        axes[1].set_xscale("log", base=2)
        axes[0].set_xlabel("GPUs")
        axes[1].set_xlabel("GPUs")
        axes[0].set_ylabel("search time (s)")
        axes[1].set_ylabel("lower bound / iteration time")
        axes[0].legend(fontsize=8)
        fig.suptitle(self.title)
        save(fig, path)

    def summary(self, table: pd.DataFrame) -> list[dict[str, str]]:
        if table.empty:
            return []
        h = table[table["scheduler"] == "hetrl"].groupby("gpus")[["search_s", "fraction_of_bound"]].mean()
        big = int(h.index.max())
        return [{"what": f"HetRL on {big} GPUs: search time, fraction of the physical bound",
                 "ours": f"{h.loc[big, 'search_s']:.0f} s, {h.loc[big, 'fraction_of_bound']:.2f}",
                 "paper": "not reported (64 GPUs only)",
                 "reading": "a valid plan at this scale" }]
