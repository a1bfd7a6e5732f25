"""Figure 10: GPU combinations in one region (Qwen3-8B): 24 A100 only, 24 A100 + 24 L40S, all 64
GPUs; HetRL vs verl (sync) / verl-async (async). Every cell is repeated over seeds, as in fig3."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from experiments import paper
from experiments.common import batch_for, search, sim_iterations, simulated
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

CLUSTERS = {"24 A100": "paper24-a100-single-region", "24 A100 + 24 L40S": "paper48-a100-l40s-single-region",
            "all 64": "paper64-single-region"}
#: Cost-model evaluations per plan search (both systems the same), by mode.
EVALUATIONS = {"quick": 60, "default": 30000, "full": 30000}
#: Seeds per cell, at least (``--seeds`` asks for more): each seed searches and simulates anew;
#: the bars are the mean over seeds, the error bars the min-max.
SEEDS = {"quick": 2, "default": 2, "full": 3}
VALUE = "throughput_samples_per_s"


@register
class Fig10(Figure):
    name = "fig10"
    title = "GPU combinations, single region, Qwen3-8B"

    def cells(self, config: Config) -> list[dict[str, Any]]:
        jobs = config.pick(("grpo-sync",), ("ppo-sync", "grpo-sync", "ppo-async", "grpo-async"),
                           ("ppo-sync", "grpo-sync", "ppo-async", "grpo-async"))
        evals = EVALUATIONS[config.mode]
        out = []
        for combo, cluster in CLUSTERS.items():
            for job in jobs:
                mode = job.split("-")[1]
                for system in ("hetrl", "verl" if mode == "sync" else "verl-async"):
                    for seed in range(max(config.seeds, SEEDS[config.mode])):
                        out.append({"combo": combo, "cluster": cluster, "job": job, "system": system,
                                    "evaluations": evals, "seed": seed, "batch_prompts": batch_for(config),
                                    "iterations": sim_iterations(mode, config.mode == "quick")})
        return out

    def compute(self, cell: dict[str, Any]) -> list[dict[str, Any]]:
        workload = f"qwen3-8b-{cell['job']}"
        plan, info = search(cell["system"], workload, cell["cluster"], cell["evaluations"], cell["seed"],
                            batch_prompts=cell["batch_prompts"])
        sim = simulated(plan, workload, cell["cluster"], cell["iterations"], cell["seed"],
                        cell["batch_prompts"])
        return [{**{k: cell[k] for k in ("combo", "job", "system", "seed")},
                 "system_kind": "hetrl" if cell["system"] == "hetrl" else "verl", **sim,
                 "search_evaluations": info["evaluations"], "search_s": info["search_s"],
                 "converged": info["converged"]}]

    def plot(self, table: pd.DataFrame, path: Path) -> None:
        if table.empty:
            return empty(path, self.title)
        t = over_seeds(table, ["job", "combo", "system_kind"], VALUE)
        jobs = list(dict.fromkeys(t["job"]))
        fig, axes = plt.subplots(1, len(jobs), figsize=(4 * len(jobs), 3.6), squeeze=False)
        for ax, job in zip(axes[0], jobs, strict=True):
            grouped_bars(ax, t[t["job"] == job], "combo", "system_kind", VALUE, **spread(t))
            ax.set_title(job, fontsize=9)
            ax.set_ylabel("samples / s (simulated)")
        axes[0][0].legend(fontsize=7)
        suptitle(fig, self.title, spread_note(t))
        save(fig, path)

    def summary(self, table: pd.DataFrame) -> list[dict[str, str]]:
        """HetRL / verl seed by seed (min-max over GPU combinations and seeds, per job), the cells
        where HetRL is below verl, then HetRL on all 64 GPUs over HetRL on the 24 A100s, seed by
        seed, and the jobs and seeds where more GPUs were slower."""
        if table.empty:
            return []
        table = with_seed(table)
        wide = paired(table, ["job", "combo", "seed"], "system_kind", VALUE)
        rows = []
        for job in dict.fromkeys(table["job"]):
            if "hetrl" not in wide or "verl" not in wide:
                break
            part = wide.xs(job, level="job")
            r = (part["hetrl"] / part["verl"]).dropna()
            if r.empty:
                continue
            ref = paper.FIG10.get(job)
            rows.append({"what": f"{job}: HetRL / verl over the GPU combinations (per seed)",
                         "ours": ratio_text(r, {"combo": "combination", "seed": "seed"}),
                         "paper": f"{ref[0]:.2f}-{ref[1]:.2f}" if ref else "-",
                         "reading": range_reading((float(r.min()), float(r.max())), ref)})
        rows.append(shortfall_row(wide, "hetrl", ["verl"],
                                  "cells where HetRL is below verl (combination x job x seed)",
                                  "HetRL ahead of verl", "HetRL >= verl for every combination, job and seed"))
        h = paired(table[table["system_kind"] == "hetrl"], ["job", "seed"], "combo", VALUE)
        if "all 64" in h and "24 A100" in h:
            gain = (h["all 64"] / h["24 A100"]).dropna()
            if not gain.empty:
                rows.append({"what": "HetRL: all 64 GPUs / 24 A100 only (per seed)",
                             "ours": ratio_text(gain, {"job": "job", "seed": "seed"}, unit="x"),
                             "paper": f"{paper.FIG10_ALL_VS_A100[0]:.2f}-{paper.FIG10_ALL_VS_A100[1]:.2f}x",
                             "reading": "more GPUs help" if gain.min() > 1 else
                             "adding weaker GPUs did not always help"})
            rows.append(shortfall_row(h, "all 64", ["24 A100"],
                                      "cells where HetRL on all 64 GPUs is below HetRL on the 24 A100s (job x seed)",
                                      "more GPUs faster", "all 64 >= 24 A100 for every job and seed"))
        return rows
