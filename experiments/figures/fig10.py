"""Figure 10: GPU combinations in one region (Qwen3-8B): 24 A100 only, 24 A100 + 24 L40S, all 64
GPUs; HetRL vs verl (sync) / verl-async (async)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from experiments import paper
from experiments.common import batch_for, search, sim_iterations, simulated
from experiments.figures._plot import empty, grouped_bars, save
from experiments.framework import Config, Figure, register

CLUSTERS = {"24 A100": "paper24-a100-single-region", "24 A100 + 24 L40S": "paper48-a100-l40s-single-region",
            "all 64": "paper64-single-region"}


@register
class Fig10(Figure):
    name = "fig10"
    title = "GPU combinations, single region, Qwen3-8B"

    def cells(self, config: Config) -> list[dict[str, Any]]:
        jobs = config.pick(("grpo-sync",), ("ppo-sync", "grpo-sync", "ppo-async", "grpo-async"),
                           ("ppo-sync", "grpo-sync", "ppo-async", "grpo-async"))
        evals = config.pick(60, 1000, 4000)
        out = []
        for combo, cluster in CLUSTERS.items():
            for job in jobs:
                mode = job.split("-")[1]
                for system in ("hetrl", "verl" if mode == "sync" else "verl-async"):
                    out.append({"combo": combo, "cluster": cluster, "job": job, "system": system,
                                "evaluations": evals, "seed": 0, "batch_prompts": batch_for(config),
                                "iterations": sim_iterations(mode, config.mode == "quick")})
        return out

    def compute(self, cell: dict[str, Any]) -> list[dict[str, Any]]:
        workload = f"qwen3-8b-{cell['job']}"
        plan, _ = search(cell["system"], workload, cell["cluster"], cell["evaluations"], cell["seed"],
                         batch_prompts=cell["batch_prompts"])
        sim = simulated(plan, workload, cell["cluster"], cell["iterations"], cell["seed"],
                        cell["batch_prompts"])
        return [{**{k: cell[k] for k in ("combo", "job", "system")},
                 "system_kind": "hetrl" if cell["system"] == "hetrl" else "verl", **sim}]

    def plot(self, table: pd.DataFrame, path: Path) -> None:
        if table.empty:
            return empty(path, self.title)
        jobs = list(dict.fromkeys(table["job"]))
        fig, axes = plt.subplots(1, len(jobs), figsize=(4 * len(jobs), 3.6), squeeze=False)
        for ax, job in zip(axes[0], jobs, strict=True):
            grouped_bars(ax, table[table["job"] == job], "combo", "system_kind", "throughput_samples_per_s")
            ax.set_title(job, fontsize=9)
            ax.set_ylabel("samples / s (simulated)")
        axes[0][0].legend(fontsize=7)
        fig.suptitle(self.title)
        save(fig, path)

    def summary(self, table: pd.DataFrame) -> list[dict[str, str]]:
        if table.empty:
            return []
        t = table.groupby(["job", "combo", "system_kind"])["throughput_samples_per_s"].mean().unstack("system_kind")
        rows = []
        for job in dict.fromkeys(table["job"]):
            r = (t.xs(job, level="job")["hetrl"] / t.xs(job, level="job")["verl"]).dropna()
            ref = paper.FIG10.get(job)
            rows.append({"what": f"{job}: HetRL / verl over the GPU combinations",
                         "ours": f"{r.min():.2f}-{r.max():.2f}",
                         "paper": f"{ref[0]:.2f}-{ref[1]:.2f}" if ref else "-",
                         "reading": "inside" if ref and r.min() >= ref[0] and r.max() <= ref[1] else
                         "outside the paper's range (see fig3's reading)"})
        h = t["hetrl"].unstack("combo") if "hetrl" in t else None
        if h is not None and "all 64" in h and "24 A100" in h:
            gain = (h["all 64"] / h["24 A100"]).dropna()
            rows.append({"what": "HetRL: all 64 GPUs vs 24 A100 only",
                         "ours": f"{gain.min():.2f}-{gain.max():.2f}x",
                         "paper": f"{paper.FIG10_ALL_VS_A100[0]:.2f}-{paper.FIG10_ALL_VS_A100[1]:.2f}x",
                         "reading": "more GPUs help" if gain.min() > 1 else "adding weaker GPUs did not always help"})
        return rows
