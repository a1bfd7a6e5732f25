"""Beyond the paper: throughput over time when a cross-region link degrades or a node is lost,
with and without re-planning (simulator)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from experiments.common import batch_for, job
from experiments.figures._plot import empty, save
from experiments.framework import Config, Figure, register
from hetrl.cost.model import CostModel
from hetrl.search import Budget, get_scheduler
from hetrl.spec.cluster import ClusterSpec, RegionLink
from hetrl.spec.presets import cluster_preset
from sim import simulate
from sim.faults import FaultEvent, FaultScenario, Replan

CLUSTER = "paper64-multi-country"


def degraded(cluster: ClusterSpec, a: str, b: str, factor: float, extra_ms: float) -> ClusterSpec:
    links = tuple(RegionLink(x.a, x.b, x.latency_ms + extra_ms, x.bandwidth_gbps * factor)
                  if {x.a, x.b} == {a, b} else x for x in cluster.region_links)
    return replace(cluster, name=cluster.name + "-degraded", region_links=links)


@register
class Faults(Figure):
    name = "faults"
    title = "Throughput over time under faults, with and without re-planning"

    def cells(self, config: Config) -> list[dict[str, Any]]:
        return [{"fault": f, "replan": rp, "workload": "qwen3-4b-grpo-sync",
                 "iterations": config.pick(4, 8, 16), "evaluations": config.pick(60, 300, 2000),
                 "seed": 0, "batch_prompts": batch_for(config)}
                for f in ("link_degraded", "node_lost") for rp in (False, True)]

    def compute(self, cell: dict[str, Any]) -> list[dict[str, Any]]:
        wl, cl = job(cell["workload"], cell["batch_prompts"]), cluster_preset(CLUSTER)
        hetrl = get_scheduler("hetrl")
        budget = Budget(evaluations=cell["evaluations"], seed=cell["seed"])
        plan = hetrl.search(wl, cl, budget).plan
        n = cell["iterations"]
        base = simulate(plan, wl, cl, 2, cell["seed"]).metrics["iterations"]
        t_fault = base[0] * 1.5  # mid-way through the second iteration
        rows = []
        if cell["fault"] == "node_lost":
            node = cl.devices[plan.placement("actor_training").device_ids[0]].node
            devices = [d.id for d in cl.devices if d.node == node]
            events = tuple(FaultEvent(t_fault, "device_lost", d) for d in devices)
            scenario = FaultScenario(events, Replan("hetrl", cell["evaluations"], cell["seed"], 30.0)
                                     if cell["replan"] else None)
            r = simulate(plan, wl, cl, n, cell["seed"], faults=scenario)
            its = r.trace.iterations
            rows += [{"end_s": end, "seconds": end - start} for start, end in its]
            extra = {"stalled": r.faults.stalled, "lost_work_s": r.faults.lost_work_s}
        else:
            # the region pair the training group talks over most: its first two regions
            regions = list(dict.fromkeys(cl.devices[d].region for d in plan.device_ids))[:2]
            a, b = regions if len(regions) == 2 else (cl.regions[0], cl.regions[1])
            ev = FaultEvent(t_fault, "link_degraded", regions=(a, b), bandwidth_factor=0.1,
                            extra_latency_ms=30.0)
            first = simulate(plan, wl, cl, 2 if cell["replan"] else n, cell["seed"],
                             faults=FaultScenario((ev,)))
            its = list(first.trace.iterations)
            if cell["replan"]:
                # after the fault is noticed, a plan for the degraded network takes over
                worse = degraded(cl, a, b, 0.1, 30.0)
                new = hetrl.search(wl, worse, budget).plan
                # the running plan is a plan of the degraded cluster too: a re-planner keeps
                # it (no restart) unless the new one is estimated faster there
                model = CostModel(wl, worse)
                restart = model.estimate(new).iteration_s < model.estimate(plan).iteration_s
                new = new if restart else plan
                rest = simulate(new, wl, worse, n - 2, cell["seed"] + 1)
                offset = its[-1][1] + (30.0 if restart else 0.0)  # re-planning and restart
                its += [(s + offset, e + offset) for s, e in rest.trace.iterations]
            rows += [{"end_s": end, "seconds": end - start} for start, end in its]
            extra = {"stalled": False, "lost_work_s": 0.0}
        return [{"fault": cell["fault"], "replan": cell["replan"], "iteration": i,
                 "samples_per_s": wl.samples / r["seconds"], **r, **extra} for i, r in enumerate(rows)]

    def plot(self, table: pd.DataFrame, path: Path) -> None:
        if table.empty:
            return empty(path, self.title)
        faults = list(dict.fromkeys(table["fault"]))
        fig, axes = plt.subplots(1, len(faults), figsize=(5.5 * len(faults), 3.6), squeeze=False)
        for ax, f in zip(axes[0], faults, strict=True):
            for rp, sub in table[table["fault"] == f].groupby("replan"):
                ax.step(sub["end_s"], sub["samples_per_s"], where="pre", marker="o",
                        label="re-plan" if rp else "no re-plan")
            ax.set_title(f, fontsize=9)
            ax.set_xlabel("time (s)")
            ax.set_ylabel("samples / s per iteration")
            ax.legend(fontsize=8)
        fig.suptitle(self.title)
        save(fig, path)

    def summary(self, table: pd.DataFrame) -> list[dict[str, str]]:
        """Mean throughput of the iterations that end after the fault (a stalled run: 0)."""
        rows = []
        for f, sub in table.groupby("fault") if not table.empty else []:
            after = {}
            for rp, run in sub.groupby("replan"):
                t_fault = float(run["end_s"].iloc[0]) * 1.5  # the fault time the cell used
                later = run[run["end_s"] > t_fault]
                stalled = bool(run["stalled"].iloc[0])
                after[rp] = 0.0 if stalled or later.empty else float(later["samples_per_s"].mean())
            rows.append({"what": f"{f}: mean throughput after the fault, re-plan vs none",
                         "ours": f"{after.get(True, float('nan')):.1f} vs {after.get(False, float('nan')):.1f} samples/s"
                                 + (" (without re-planning the run stalls)" if f == "node_lost" else ""),
                         "paper": "not studied",
                         "reading": "re-planning recovers throughput" if after.get(True, 0) > after.get(False, 0)
                         else "re-planning did not help here"})
        return rows
