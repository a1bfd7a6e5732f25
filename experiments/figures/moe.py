"""Figure ``moe`` (issue 57; not in the paper): a mixture-of-experts job, Qwen3-30B-A3B GRPO
(128 experts, 8 per token), on the paper's 64-GPU testbed in its four network scenarios: HetRL
against the baselines (each its own scheduler, the same evaluation budget; throughput from the
simulator, which replays the all-to-alls as flows), and where each plan keeps its expert
parallelism -- inside one node, across the nodes of one region, or across regions -- for
generation and training."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from experiments.common import SYSTEMS, batch_for, search, sim_iterations, simulated
from experiments.figures._plot import empty, grouped_bars, save, suptitle
from experiments.framework import Config, Figure, register
from hetrl.plan import Plan, TaskPlacement
from hetrl.spec.cluster import ClusterSpec

SCENARIOS = ("single-region", "multi-region-hybrid", "multi-country", "multi-continent")
#: Cost-model evaluations per search (every system the same), by mode.
EVALUATIONS = {"quick": 60, "default": 3000, "full": 30000}
VALUE = "throughput_samples_per_s"
#: The tasks whose expert parallelism the figure reports.
TASKS = ("actor_generation", "actor_training")


def ep_locality(p: TaskPlacement, cluster: ClusterSpec) -> str:
    """Where ``p``'s expert-parallel groups lie: ``none`` (ep 1), ``node`` (every group inside
    one node), ``region`` (every group inside one region, some across nodes) or ``regions``
    (some group across regions)."""
    if p.ep <= 1:
        return "none"
    worst = "node"
    for k in range(0, p.dp, p.ep):
        devices = [cluster.devices[d] for r in p.devices[k:k + p.ep] for s in r for d in s]
        if len({d.region for d in devices}) > 1:
            return "regions"
        if len({d.node for d in devices}) > 1:
            worst = "region"
    return worst


def describe_experts(plan: Plan | None, cluster: ClusterSpec) -> dict[str, Any]:
    """Per reported task its ep and where its groups lie (None without a plan)."""
    out: dict[str, Any] = {}
    for task in TASKS:
        p = None if plan is None else plan.placement(task)
        out[f"{task}_ep"] = None if p is None else p.ep
        out[f"{task}_ep_locality"] = None if p is None else ep_locality(p, cluster)
    return out


def _ep_text(ep: Any, where: Any) -> str:
    return "-" if ep is None or ep != ep else f"ep {int(ep)}" + (
        f" ({where})" if where not in (None, "none") else "")


@register
class MoEFigure(Figure):
    name = "moe"
    title = "Mixture of experts: Qwen3-30B-A3B GRPO throughput (samples/s), four scenarios"

    def cells(self, config: Config) -> list[dict[str, Any]]:
        scenarios = config.pick(("single-region", "multi-continent"), SCENARIOS, SCENARIOS)
        modes = config.pick(("sync",), ("sync",), ("sync", "async"))
        evals = EVALUATIONS[config.mode]
        return [{"scenario": sc, "mode": mode, "system": system, "evaluations": evals,
                 "seed": seed, "batch_prompts": batch_for(config),
                 "iterations": sim_iterations(mode, config.mode == "quick")}
                for sc in scenarios for mode in modes for system in SYSTEMS[mode]
                for seed in range(config.seeds)]

    def compute(self, cell: dict[str, Any]) -> list[dict[str, Any]]:
        from hetrl.spec.presets import cluster_preset

        workload = f"qwen3-30b-a3b-grpo-{cell['mode']}"
        cluster = f"paper64-{cell['scenario']}"
        plan, info = search(cell["system"], workload, cluster, cell["evaluations"], cell["seed"],
                            batch_prompts=cell["batch_prompts"])
        sim = simulated(plan, workload, cluster, cell["iterations"], cell["seed"],
                        cell["batch_prompts"])
        return [{**{k: cell[k] for k in ("scenario", "mode", "system", "seed")}, **sim,
                 **describe_experts(plan, cluster_preset(cluster)),
                 "search_evaluations": info["evaluations"], "search_s": info["search_s"],
                 "converged": info["converged"]}]

    def plot(self, table: pd.DataFrame, path: Path) -> None:
        if table.empty:
            return empty(path, self.title)
        t = table.groupby(["scenario", "mode", "system"], sort=False, as_index=False)[VALUE].mean()
        t["job"] = t["scenario"] + (" " + t["mode"] if t["mode"].nunique() > 1 else "")
        fig, ax = plt.subplots(figsize=(9.5, 4.4))
        grouped_bars(ax, t, "job", "system", VALUE)
        # under each scenario: where each system's first seed keeps expert parallelism
        first = table.drop_duplicates(["scenario", "mode", "system"])
        labels = []
        for job in dict.fromkeys(t["job"]):
            rows = first[(first["scenario"] + (" " + first["mode"] if t["mode"].nunique() > 1
                                               else "")) == job]
            lines = [job] + [f"{r.system}: gen {_ep_text(r.actor_generation_ep, r.actor_generation_ep_locality)}"
                             f", train {_ep_text(r.actor_training_ep, r.actor_training_ep_locality)}"
                             for r in rows.itertuples()]
            labels.append("\n".join(lines))
        ax.set_xticklabels(labels, rotation=0, ha="center", fontsize=6.5)  # (grouped_bars placed them)
        ax.set_ylabel("samples / s (simulated)")
        ax.legend(fontsize=7)
        suptitle(fig, self.title, "under each scenario: each plan's expert parallelism (ep) and "
                 "where its groups lie (node, region, regions; none: ep 1)")
        fig.tight_layout()
        save(fig, path)

    def summary(self, table: pd.DataFrame) -> list[dict[str, str]]:
        """Per scenario HetRL / each baseline, and where HetRL's plans keep expert
        parallelism."""
        rows: list[dict[str, str]] = []
        if table.empty:
            return rows
        mean = table.groupby(["scenario", "mode", "system"], sort=False)[VALUE].mean()
        for (scenario, mode), sub in mean.groupby(level=["scenario", "mode"], sort=False):
            sub = sub.droplevel(["scenario", "mode"])
            if "hetrl" not in sub:
                continue
            ratios = [f"{base} {sub['hetrl'] / sub[base]:.2f}x" for base in sub.index
                      if base != "hetrl" and sub[base] > 0]
            rows.append({"what": f"{scenario} {mode}: HetRL / baseline (throughput)",
                         "ours": ", ".join(ratios) or "-", "paper": "not in the paper",
                         "reading": "HetRL ahead" if all(
                             sub["hetrl"] >= sub[b] for b in sub.index) else
                         "a baseline ahead"})
        hetrl = table[table["system"] == "hetrl"]
        for task in TASKS:
            col = f"{task}_ep_locality"
            counts = hetrl[col].value_counts().to_dict() if col in hetrl else {}
            rows.append({"what": f"HetRL's {task}: where its expert-parallel groups lie "
                                 "(plans)",
                         "ours": ", ".join(f"{k} {v}" for k, v in counts.items()) or "-",
                         "paper": "not in the paper",
                         "reading": "inside a node where ep > 1" if set(counts) <= {"none", "node"}
                         else "some groups across nodes or regions"})
        return rows
