"""Figure ``cost`` (issue 29; not in the paper): seconds per iteration against dollars per 1k
samples on the paper's 64-GPU testbed in its four network scenarios. HetRL's frontier: its
search under the time objective without a limit and under ``--max-dollars-per-hour`` caps (a
share of the whole cluster's GPU price), and under ``--objective cost``; beside it the
baselines' single points (they optimise time by design). A plan pays for the GPUs it uses
(``--charge-used-only``: the lever a cost objective has is renting fewer GPUs) at the shipped
on-demand prices, plus egress (docs/money.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from experiments.common import batch_for, job, search
from experiments.figures._plot import empty, save
from experiments.framework import Config, Figure, register

SCENARIOS = ("single-region", "multi-region-hybrid", "multi-country", "multi-continent")
WORKLOAD = "qwen3-8b-ppo-sync"
#: HetRL's points: (label, objective, cap as a share of the whole cluster's GPU $/h or None).
HETRL_POINTS = (("time", "time", None), ("time, cap 60%", "time", 0.6),
                ("time, cap 35%", "time", 0.35), ("cost", "cost", None))
BASELINES = ("verl", "streamrl")


@register
class CostFigure(Figure):
    name = "cost"
    title = "Seconds per iteration vs dollars per 1k samples (on-demand AWS prices)"

    def cells(self, config: Config) -> list[dict[str, Any]]:
        evals = config.pick(60, 1500, 1500)
        scenarios = config.pick(SCENARIOS[::3], SCENARIOS, SCENARIOS)
        points = [{"system": "hetrl", "label": f"HetRL ({label})", "objective": obj, "cap": cap}
                  for label, obj, cap in HETRL_POINTS]
        points += [{"system": b, "label": b, "objective": "time", "cap": None} for b in BASELINES]
        return [{"scenario": sc, "workload": WORKLOAD, **p, "seed": 0, "evaluations": evals,
                 "batch_prompts": batch_for(config)} for sc in scenarios for p in points]

    def compute(self, cell: dict[str, Any]) -> list[dict[str, Any]]:
        from hetrl.cost.model import CostModel
        from hetrl.cost.money import hourly_gpu_dollars, money
        from hetrl.search.objective import Objective
        from hetrl.spec.presets import cluster_preset

        cluster_name = f"paper64-{cell['scenario']}"
        cluster = cluster_preset(cluster_name)
        cap = None if cell["cap"] is None else cell["cap"] * hourly_gpu_dollars(cluster)[0]
        options: dict[str, Any] = {}
        if cell["system"] == "hetrl":
            options["objective"] = Objective(cell["objective"], cap, None, charge_used_only=True)
        plan, info = search(cell["system"], cell["workload"], cluster_name, cell["evaluations"],
                            cell["seed"], batch_prompts=cell["batch_prompts"], **options)
        row = {k: cell[k] for k in ("scenario", "system", "label", "objective", "cap")}
        row["cap_dollars_per_hour"] = cap
        row["converged"] = info["converged"]
        if plan is None:
            return [{**row, "iteration_s": float("nan"), "dollars_per_1k_samples": float("nan"),
                     "dollars_per_hour": float("nan"), "gpus": 0, "egress_dollars": float("nan"),
                     "note": info.get("infeasible", "")}]
        wl = job(cell["workload"], cell["batch_prompts"])
        model = CostModel(wl, cluster)
        est = model.estimate(plan, check=False)
        m = money(model, plan, est.iteration_s, charge_used_only=True)
        return [{**row, "iteration_s": est.iteration_s,
                 "dollars_per_1k_samples": m.dollars_per_1k_samples,
                 "dollars_per_hour": m.dollars_per_hour, "gpus": m.gpus_charged,
                 "egress_dollars": m.egress_dollars,
                 "cross_region_gb": m.cross_region_bytes / 1e9, "note": ""}]

    def plot(self, table: pd.DataFrame, path: Path) -> None:
        ok = table.dropna(subset=["iteration_s"]) if not table.empty else table
        if ok.empty:
            return empty(path, self.title)
        scenarios = list(dict.fromkeys(ok["scenario"]))
        fig, axes = plt.subplots(1, len(scenarios), figsize=(4.2 * len(scenarios), 3.8),
                                 squeeze=False)
        for ax, sc in zip(axes[0], scenarios, strict=True):
            sub = ok[ok["scenario"] == sc]
            ours = sub[sub["system"] == "hetrl"].sort_values("dollars_per_1k_samples")
            front = _pareto(ours)
            ax.plot(front["dollars_per_1k_samples"], front["iteration_s"], "-", color="C0",
                    lw=1, label="HetRL frontier")
            ax.scatter(ours["dollars_per_1k_samples"], ours["iteration_s"], color="C0", s=22)
            for _, r in ours.iterrows():
                ax.annotate(r["label"].removeprefix("HetRL (").rstrip(")"),
                            (r["dollars_per_1k_samples"], r["iteration_s"]), fontsize=6,
                            xytext=(3, 3), textcoords="offset points")
            for k, b in enumerate(BASELINES):
                pts = sub[sub["system"] == b]
                ax.scatter(pts["dollars_per_1k_samples"], pts["iteration_s"], marker="s",
                           color=f"C{k + 1}", s=26, label=b)
            ax.set_title(sc, fontsize=9)
            ax.set_xlabel("dollars per 1k samples")
            ax.set_ylabel("seconds per iteration")
            ax.legend(fontsize=6)
        fig.suptitle(self.title + ", GPUs used charged", fontsize=10)
        save(fig, path)

    def summary(self, table: pd.DataFrame) -> list[dict[str, str]]:
        rows = []
        if table.empty:
            return rows
        for sc in dict.fromkeys(table["scenario"]):
            sub = table[table["scenario"] == sc].set_index("label")
            if "HetRL (time)" not in sub.index or "HetRL (cost)" not in sub.index:
                continue
            t, c = sub.loc["HetRL (time)"], sub.loc["HetRL (cost)"]
            base = ", ".join(f"{b} {sub.loc[b, 'iteration_s']:.0f} s ${sub.loc[b, 'dollars_per_1k_samples']:.2f}"
                             for b in BASELINES if b in sub.index and sub.loc[b, "iteration_s"] == sub.loc[b, "iteration_s"])
            holds = c["dollars_per_1k_samples"] < t["dollars_per_1k_samples"] and \
                t["iteration_s"] < c["iteration_s"]
            rows.append({
                "what": f"{sc}: HetRL time vs cost objective (s/iter, $/1k samples, GPUs); baselines",
                "ours": f"time {t['iteration_s']:.0f} s ${t['dollars_per_1k_samples']:.2f} "
                        f"({t['gpus']:.0f}); cost {c['iteration_s']:.0f} s "
                        f"${c['dollars_per_1k_samples']:.2f} ({c['gpus']:.0f}); {base}",
                "paper": "not in the paper",
                "reading": "cost objective cheaper, time objective faster" if holds else
                "the two objectives' plans do not trade off here: see docs/money.md"})
        return rows


def _pareto(points: pd.DataFrame) -> pd.DataFrame:
    """The points no other point beats on both dollars and seconds, by dollars."""
    pts = points.dropna(subset=["iteration_s"]).sort_values(["dollars_per_1k_samples",
                                                             "iteration_s"])
    keep, best = [], float("inf")
    for i, r in pts.iterrows():
        if r["iteration_s"] < best:
            keep.append(i)
            best = r["iteration_s"]
    return pts.loc[keep]
