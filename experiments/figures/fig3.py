"""Figure 3: end-to-end throughput of HetRL vs verl (sync, async) and StreamRL (async) in the four
network scenarios; plans from each system's scheduler under the same evaluation budget,
throughput from the simulator. Every cell is repeated over seeds (each a search and a simulation of
its own): bars are the mean, error bars the min-max, and the summary's ratios are per seed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from experiments import paper
from experiments.common import SYSTEMS, batch_for, search, sim_iterations, simulated
from experiments.figures._plot import (
    empty,
    grouped_bars,
    over_seeds,
    save,
    spread,
    spread_note,
    suptitle,
)
from experiments.figures._stats import (
    paired,
    range_reading,
    ratio_text,
    shortfall_row,
    with_seed,
)
from experiments.framework import Config, Figure, register

SCENARIOS = ("single-region", "multi-region-hybrid", "multi-country", "multi-continent")
#: Cost-model evaluations per plan search (every system the same), by mode.
EVALUATIONS = {"quick": 60, "default": 30000, "full": 30000}
#: Seeds per cell, at least (``--seeds`` asks for more): each seed searches and simulates anew;
#: the bars are the mean over seeds, the error bars the min-max.
SEEDS = {"quick": 2, "default": 2, "full": 3}
VALUE = "throughput_samples_per_s"
#: (label, mode, baseline, key in paper.FIG3)
COMPARISONS = (("sync, HetRL / verl", "sync", "verl", "sync_vs_verl"),
               ("async, HetRL / StreamRL", "async", "streamrl", "async_vs_streamrl"),
               ("async, HetRL / verl-async", "async", "verl-async", "async_vs_verl"))


@register
class Fig3(Figure):
    name = "fig3"
    title = "End-to-end throughput (samples/s), four network scenarios"

    def cells(self, config: Config) -> list[dict[str, Any]]:
        scenarios = config.pick(("single-region", "multi-continent"), SCENARIOS, SCENARIOS)
        sizes = config.pick(("4b",), ("8b",), ("4b", "8b", "14b"))
        algs = config.pick(("grpo",), ("ppo", "grpo"), ("ppo", "grpo"))
        evals = EVALUATIONS[config.mode]
        seeds = max(config.seeds, SEEDS[config.mode])
        out = []
        for scenario in scenarios:
            for size in sizes:
                for alg in algs:
                    for mode in ("sync", "async"):
                        for system in SYSTEMS[mode]:
                            for seed in range(seeds):
                                out.append({"scenario": scenario, "size": size, "algorithm": alg,
                                            "mode": mode, "system": system, "evaluations": evals,
                                            "seed": seed, "batch_prompts": batch_for(config),
                                            "iterations": sim_iterations(mode, config.mode == "quick")})
        return out

    def compute(self, cell: dict[str, Any]) -> list[dict[str, Any]]:
        workload = f"qwen3-{cell['size']}-{cell['algorithm']}-{cell['mode']}"
        cluster = f"paper64-{cell['scenario']}"
        plan, info = search(cell["system"], workload, cluster, cell["evaluations"], cell["seed"],
                            batch_prompts=cell["batch_prompts"])
        sim = simulated(plan, workload, cluster, cell["iterations"], cell["seed"], cell["batch_prompts"])
        return [{**{k: cell[k] for k in ("scenario", "size", "algorithm", "mode", "system", "seed")},
                 **sim, "search_evaluations": info["evaluations"], "search_s": info["search_s"],
                 "converged": info["converged"]}]

    def plot(self, table: pd.DataFrame, path: Path) -> None:
        if table.empty:
            return empty(path, self.title)
        scenarios = list(dict.fromkeys(table["scenario"]))
        fig, axes = plt.subplots(1, len(scenarios), figsize=(4.2 * len(scenarios), 3.6), squeeze=False)
        t = over_seeds(table, ["scenario", "size", "algorithm", "mode", "system"], VALUE)
        t["job"] = t["size"] + "-" + t["algorithm"] + "-" + t["mode"]
        for ax, scenario in zip(axes[0], scenarios, strict=True):
            grouped_bars(ax, t[t["scenario"] == scenario], "job", "system", VALUE, **spread(t))
            ax.set_title(scenario, fontsize=9)
            ax.set_ylabel("samples / s (simulated)")
        axes[0][0].legend(fontsize=7)
        suptitle(fig, self.title, spread_note(t))
        save(fig, path)

    def summary(self, table: pd.DataFrame) -> list[dict[str, str]]:
        """Per scenario and comparison: HetRL / baseline taken seed by seed, its min and max over
        jobs and seeds; then the cells (scenario, job, seed, baseline) where HetRL is below."""
        rows: list[dict[str, str]] = []
        if table.empty:
            return rows
        wide = paired(with_seed(table), ["scenario", "size", "algorithm", "mode", "seed"], "system", VALUE)
        for scenario in dict.fromkeys(table["scenario"]):
            sub = wide.xs(scenario, level="scenario")
            for label, mode, base, key in COMPARISONS:
                if mode not in sub.index.get_level_values("mode") or base not in sub or "hetrl" not in sub:
                    continue
                part = sub.xs(mode, level="mode")
                ratio = (part["hetrl"] / part[base]).dropna()
                if ratio.empty:
                    continue
                ours = (float(ratio.min()), float(ratio.max()))
                ref = paper.FIG3[scenario][key]
                rows.append({"what": f"{scenario}: {label} (per seed)",
                             "ours": ratio_text(ratio, {("size", "algorithm"): "job", "seed": "seed"}),
                             "paper": "similar" if ref is None else f"{ref[0]:.2f}-{ref[1]:.2f}",
                             "reading": range_reading(ours, ref)})
        rows.append(shortfall_row(
            wide, "hetrl", [b for b in wide.columns if b != "hetrl"],
            "cells where HetRL's throughput is below a baseline's (scenario x job x seed x baseline)",
            "HetRL ahead of every baseline", "HetRL >= every baseline in every cell and seed"))
        return rows
