"""Figure 4: load balancing ablation (sync): HetRL with and without the data- and layer-level
load balancer, in one region and across countries."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from experiments import paper
from experiments.common import batch_for, search, sim_iterations, simulated
from experiments.figures._plot import empty, grouped_bars, save
from experiments.framework import Config, Figure, register


@register
class Fig4(Figure):
    name = "fig4"
    title = "Load balancing ablation (sync): throughput with and without the load balancer"

    def cells(self, config: Config) -> list[dict[str, Any]]:
        sizes = config.pick(("4b",), ("8b",), ("4b", "8b", "14b"))
        algs = config.pick(("grpo",), ("ppo", "grpo"), ("ppo", "grpo"))
        scenarios = config.pick(("single-region",), ("single-region", "multi-country"),
                                ("single-region", "multi-country"))
        evals = config.pick(60, 1000, 4000)
        return [{"scenario": sc, "size": sz, "algorithm": a, "load_balance": lb,
                 "evaluations": evals, "seed": seed, "batch_prompts": batch_for(config),
                 "iterations": sim_iterations("sync", config.mode == "quick")}
                for sc in scenarios for sz in sizes for a in algs for lb in (True, False)
                for seed in range(config.seeds)]

    def compute(self, cell: dict[str, Any]) -> list[dict[str, Any]]:
        workload = f"qwen3-{cell['size']}-{cell['algorithm']}-sync"
        cluster = f"paper64-{cell['scenario']}"
        plan, info = search("hetrl", workload, cluster, cell["evaluations"], cell["seed"],
                            load_balance=cell["load_balance"], batch_prompts=cell["batch_prompts"])
        sim = simulated(plan, workload, cluster, cell["iterations"], cell["seed"], cell["batch_prompts"])
        return [{**{k: cell[k] for k in ("scenario", "size", "algorithm", "load_balance", "seed")}, **sim}]

    def plot(self, table: pd.DataFrame, path: Path) -> None:
        if table.empty:
            return empty(path, self.title)
        t = table.groupby(["scenario", "size", "algorithm", "load_balance"], as_index=False)[
            "throughput_samples_per_s"].mean()
        t["job"] = t["scenario"] + "\n" + t["size"] + "-" + t["algorithm"]
        t["balancer"] = t["load_balance"].map({True: "with LB", False: "without LB"})
        fig, ax = plt.subplots(figsize=(8, 3.6))
        grouped_bars(ax, t, "job", "balancer", "throughput_samples_per_s")
        ax.set_ylabel("samples / s (simulated)")
        ax.legend(fontsize=8)
        ax.set_title(self.title, fontsize=10)
        save(fig, path)

    def summary(self, table: pd.DataFrame) -> list[dict[str, str]]:
        if table.empty:
            return []
        t = table.groupby(["scenario", "size", "algorithm", "load_balance"])[
            "throughput_samples_per_s"].mean().unstack("load_balance")
        rows = []
        for scenario in dict.fromkeys(table["scenario"]):
            if True not in t or False not in t:
                continue
            gain = (t.xs(scenario, level="scenario")[True] / t.xs(scenario, level="scenario")[False] - 1)
            ref = paper.FIG4_MAX_GAIN["single-region" if scenario == "single-region" else "cross-region"]
            best = float(gain.max())
            rows.append({"what": f"{scenario}: load-balancing gain (max over jobs)",
                         "ours": f"{best:+.1%} (range {gain.min():+.1%} to {best:+.1%})",
                         "paper": f"up to +{ref:.0%}",
                         "reading": "comparable" if abs(best - ref) <= 0.06 else
                         ("smaller than the paper's" if best < ref else "larger than the paper's")})
        return rows
