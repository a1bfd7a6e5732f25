"""Figure 3: end-to-end throughput of HetRL vs verl (sync, async) and StreamRL (async) in the four
network scenarios; plans from each system's scheduler under the same evaluation budget,
throughput from the simulator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from experiments import paper
from experiments.common import SYSTEMS, batch_for, search, sim_iterations, simulated
from experiments.figures._plot import empty, grouped_bars, save
from experiments.framework import Config, Figure, register

SCENARIOS = ("single-region", "multi-region-hybrid", "multi-country", "multi-continent")


@register
class Fig3(Figure):
    name = "fig3"
    title = "End-to-end throughput (samples/s), four network scenarios"

    def cells(self, config: Config) -> list[dict[str, Any]]:
        scenarios = config.pick(("single-region", "multi-continent"), SCENARIOS, SCENARIOS)
        sizes = config.pick(("4b",), ("8b",), ("4b", "8b", "14b"))
        algs = config.pick(("grpo",), ("ppo", "grpo"), ("ppo", "grpo"))
        evals = config.pick(60, 1000, 4000)
        out = []
        for scenario in scenarios:
            for size in sizes:
                for alg in algs:
                    for mode in ("sync", "async"):
                        for system in SYSTEMS[mode]:
                            for seed in range(config.seeds):
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
                 **sim, "search_evaluations": info["evaluations"], "search_s": info["search_s"]}]

    def plot(self, table: pd.DataFrame, path: Path) -> None:
        if table.empty:
            return empty(path, self.title)
        scenarios = list(dict.fromkeys(table["scenario"]))
        fig, axes = plt.subplots(1, len(scenarios), figsize=(4.2 * len(scenarios), 3.6), squeeze=False)
        t = table.groupby(["scenario", "size", "algorithm", "mode", "system"], as_index=False)[
            "throughput_samples_per_s"].mean()
        t["job"] = t["size"] + "-" + t["algorithm"] + "-" + t["mode"]
        for ax, scenario in zip(axes[0], scenarios, strict=True):
            grouped_bars(ax, t[t["scenario"] == scenario], "job", "system", "throughput_samples_per_s")
            ax.set_title(scenario, fontsize=9)
            ax.set_ylabel("samples / s (simulated)")
        axes[0][0].legend(fontsize=7)
        fig.suptitle(self.title)
        save(fig, path)

    def summary(self, table: pd.DataFrame) -> list[dict[str, str]]:
        rows = []
        if table.empty:
            return rows
        t = table.groupby(["scenario", "size", "algorithm", "mode", "system"])[
            "throughput_samples_per_s"].mean().unstack("system")
        for scenario in dict.fromkeys(table["scenario"]):
            sub = t.xs(scenario, level="scenario")
            for label, mode, base, key in (("sync, HetRL / verl", "sync", "verl", "sync_vs_verl"),
                                           ("async, HetRL / StreamRL", "async", "streamrl", "async_vs_streamrl"),
                                           ("async, HetRL / verl-async", "async", "verl-async", "async_vs_verl")):
                part = sub.xs(mode, level="mode") if mode in sub.index.get_level_values("mode") else None
                if part is None or base not in part or "hetrl" not in part:
                    continue
                ratio = (part["hetrl"] / part[base]).dropna()
                if ratio.empty:
                    continue
                ours = (float(ratio.min()), float(ratio.max()))
                ref = paper.FIG3[scenario][key]
                rows.append({"what": f"{scenario}: {label}", "ours": f"{ours[0]:.2f}-{ours[1]:.2f}",
                             "paper": "similar" if ref is None else f"{ref[0]:.2f}-{ref[1]:.2f}",
                             "reading": _reading(ours, ref)})
        return rows


def _reading(ours: tuple[float, float], ref: tuple[float, float] | None) -> str:
    if ref is None:
        return "paper gives no range"
    lo, hi = ours
    if lo >= ref[0] and hi <= ref[1]:
        return "inside the paper's range"
    if hi < ref[0]:
        return "below the paper's range: our baselines fare better in our cost model/simulator"
    if lo > ref[1]:
        return "above the paper's range: our baselines fare worse here"
    return "overlaps the paper's range"
