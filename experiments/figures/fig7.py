"""Figure 7: cost model validation -- estimated vs simulated iteration time of diverse plans in
each scenario: the error distribution and the rank correlation (Spearman)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
from scipy.stats import spearmanr

from experiments.common import batch_for, search, simulated
from experiments.figures._plot import empty, save
from experiments.framework import Config, Figure, register

SCENARIOS = ("single-region", "multi-region-hybrid", "multi-country", "multi-continent")
#: Diverse plans: several schedulers (good and poor plans) and seeds.
SOURCES = ("hetrl", "random", "deap", "verl", "streamrl")
#: The mixture-of-experts job (issue 57): its plans' all-to-alls replayed as flows, checked on
#: one seed per source in the default mode (the 15 minutes), as many as the dense jobs in --full
MOE_WORKLOAD = "qwen3-30b-a3b-grpo-sync"


@register
class Fig7(Figure):
    name = "fig7"
    title = "Cost model vs simulator: estimated and simulated iteration time"

    def cells(self, config: Config) -> list[dict[str, Any]]:
        workloads = config.pick(("qwen3-4b-grpo-sync",), ("qwen3-4b-grpo-sync", "qwen3-8b-ppo-sync"),
                                ("qwen3-4b-grpo-sync", "qwen3-8b-ppo-sync", "qwen3-8b-grpo-async"))
        seeds = config.pick(1, 2, 4)
        scenarios = config.pick(SCENARIOS[:2], SCENARIOS, SCENARIOS)
        evals = config.pick(40, 150, 400)
        moe_seeds = config.pick(1, 1, 4)
        jobs = [(wl, seeds) for wl in workloads] + [(MOE_WORKLOAD, moe_seeds)]
        return [{"scenario": sc, "workload": wl, "source": src, "seed": seed, "evaluations": evals,
                 "batch_prompts": batch_for(config)}
                for sc in scenarios for wl, n in jobs for src in SOURCES for seed in range(n)]

    def compute(self, cell: dict[str, Any]) -> list[dict[str, Any]]:
        cluster = f"paper64-{cell['scenario']}"
        plan, _ = search(cell["source"], cell["workload"], cluster, cell["evaluations"], cell["seed"],
                         batch_prompts=cell["batch_prompts"])
        if plan is None:
            return []
        iterations = 3 if cell["workload"].endswith("async") else 2
        sim = simulated(plan, cell["workload"], cluster, iterations, cell["seed"], cell["batch_prompts"])
        return [{**{k: cell[k] for k in ("scenario", "workload", "source", "seed")},
                 "estimate_s": sim["estimate_s"], "sim_iteration_s": sim["sim_iteration_s"],
                 "relative_difference": (sim["sim_iteration_s"] - sim["estimate_s"]) / sim["sim_iteration_s"]}]

    def plot(self, table: pd.DataFrame, path: Path) -> None:
        if table.empty:
            return empty(path, self.title)
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for sc in dict.fromkeys(table["scenario"]):
            sub = table[table["scenario"] == sc]
            axes[0].scatter(sub["sim_iteration_s"], sub["estimate_s"], s=12, label=sc)
        lim = [0, float(max(table["sim_iteration_s"].max(), table["estimate_s"].max())) * 1.05]
        axes[0].plot(lim, lim, "k--", lw=0.8)
        axes[0].set_xlabel("simulated iteration (s)")
        axes[0].set_ylabel("estimated iteration (s)")
        axes[0].set_xscale("log")
        axes[0].set_yscale("log")
        axes[0].legend(fontsize=7)
        data = [table[table["scenario"] == sc]["relative_difference"] for sc in dict.fromkeys(table["scenario"])]
        axes[1].boxplot(data, tick_labels=list(dict.fromkeys(table["scenario"])))
        axes[1].axhline(0, color="k", lw=0.8)
        axes[1].set_ylabel("(sim - estimate) / sim")
        axes[1].tick_params(axis="x", labelrotation=30, labelsize=7)
        fig.suptitle(self.title)
        save(fig, path)

    def summary(self, table: pd.DataFrame) -> list[dict[str, str]]:
        rows = []
        for sc in dict.fromkeys(table.get("scenario", [])):
            sub = table[table["scenario"] == sc]
            rows.append(self._row(sc, sub))
        moe = table[table["workload"] == MOE_WORKLOAD] if "workload" in table else table.iloc[:0]
        if len(moe) >= 2:
            rows.append(self._row(f"mixture of experts ({MOE_WORKLOAD}), all scenarios", moe))
        return rows

    @staticmethod
    def _row(label: str, sub: pd.DataFrame) -> dict[str, str]:
        """One summary row: Spearman and the median |difference| over ``sub``'s plans."""
        rho = float(spearmanr(sub["estimate_s"], sub["sim_iteration_s"]).statistic)
        med = float(sub["relative_difference"].abs().median())
        return {"what": f"{label}: Spearman(estimate, simulated), median abs. difference, "
                        f"{len(sub)} plans",
                "ours": f"{rho:.3f}, {med:.1%}",
                "paper": "single-region error comparable to pre-training estimators; larger "
                         "across regions",
                "reading": "targets met (>= 0.9, <= 15%)" if rho >= 0.9 and med <= 0.15 else
                "below target: see docs/simulator.md"}
