"""Beyond the paper: does the plan get faster as the cluster doubles, from 64 to 1,024 GPUs?

The clusters are nested (``hetrl.spec.random_cluster.nested_random_cluster``, seed = the cell's
seed): random 8-GPU nodes of A100-80GB, H100, L40S and L4, two at a time dealt round robin over 16
regions (64 GPUs: 4 regions of 16 GPUs; 256: all 16 regions; 1,024: 16 regions of 64), the 2N-GPU
cluster being the N-GPU one plus N new GPUs, so every plan of the smaller cluster is a plan of the
larger one with the same estimate: the best plan can only get faster as the cluster grows, and a
slower plan on more GPUs is the search's doing. HetRL's search (SHA-EA) gets a wall-clock
budget per cell, the same at every size, and verl's scheduler runs beside it (it measures a few
believed-best configurations and stops). Each plan is put beside two lower bounds over every
plan (``hetrl.cost.bound``): the physical one (FLOPs at peak on all GPUs, no network) and the
cost model's (its efficiencies, the workflow's stages in sequence, the serial decode tail of the
busiest generation replica); the table reports search seconds, evaluations, the time to the
first plan that fits, the plan's iteration time and its fraction of each bound.

Not deterministic: a search under a time budget makes as many evaluations as the machine allows
in that time, so the plans (and the cached cells) depend on the machine and its load; the
``evaluations`` column says how much search each cell got.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from experiments.common import batch_for, job
from experiments.figures._plot import empty, save, suptitle
from experiments.framework import Config, Figure, register
from hetrl.cost.bound import lower_bound
from hetrl.errors import HetrlError
from hetrl.search import Budget, get_scheduler
from hetrl.spec.random_cluster import nested_random_cluster

GPU_TYPES = ("A100-80GB", "H100", "L40S", "L4")
REGIONS = 16
NODES_PER_REGION = 2  # per round: regions open up to 256 GPUs, then fill
GPUS_PER_NODE = 8
SCHEDULERS = ("hetrl", "verl")


def scaling_cluster(gpus: int, seed: int):
    """The first ``gpus`` GPUs (8 per node) of the nested random cluster of ``seed``."""
    return nested_random_cluster(seed, gpus // GPUS_PER_NODE, num_regions=REGIONS,
                                 nodes_per_region=NODES_PER_REGION, gpus=GPU_TYPES,
                                 gpus_per_node=(GPUS_PER_NODE,), name=f"nested{gpus}-seed{seed}")


def first_valid_s(history: tuple | list) -> float:
    """Seconds into the search of its first plan that fits (nan: none did)."""
    return next((float(e) for e, _, best in history if math.isfinite(best)), float("nan"))


@register
class Scaling(Figure):
    name = "scaling"
    title = "Scaling: 64 to 1,024 GPUs (nested random clusters over 16 regions)"

    def cells(self, config: Config) -> list[dict[str, Any]]:
        sizes = config.pick((64, 128), (64, 256, 1024), (64, 128, 256, 512, 1024))
        seconds = config.pick(3.0, 30.0, 120.0)
        return [{"gpus": n, "workload": "qwen3-8b-ppo-sync", "batch_prompts": batch_for(config),
                 "scheduler": s, "seconds": seconds, "seed": seed}
                for n in sizes for s in SCHEDULERS for seed in range(config.seeds)]

    def compute(self, cell: dict[str, Any]) -> list[dict[str, Any]]:
        cluster = scaling_cluster(cell["gpus"], cell["seed"])
        wl = job(cell["workload"], cell["batch_prompts"])
        bounds = lower_bound(wl, cluster)
        row = {k: cell[k] for k in ("gpus", "workload", "batch_prompts", "scheduler", "seconds",
                                    "seed")}
        row.update(lower_bound_s=bounds["iteration_s_lower_bound"],
                   model_bound_s=bounds["iteration_s_model_bound"],
                   generation_tail_s=bounds["generation_tail_s"])
        try:
            r = get_scheduler(cell["scheduler"]).search(
                wl, cluster, Budget(seconds=cell["seconds"], seed=cell["seed"]))
        except HetrlError as exc:  # nothing found that fits, or no evaluation, in the budget
            return [{**row, "search_s": float("nan"), "evaluations": float("nan"),
                     "train_dp_s": float("nan"), "first_valid_s": float("nan"),
                     "iteration_s": float("nan"), "gpus_used": 0, "every_task_everywhere": False,
                     "fraction_of_bound": 0.0, "fraction_of_model_bound": 0.0,
                     "infeasible": str(exc)}]
        it = r.estimate.iteration_s
        # the training tasks' exposed data-parallel syncs (seconds): what a wider group pays
        dp_s = sum(r.estimate.parts[t].get("dp", 0.0) for t in wl.task_names
                   if wl.task(t).kind == "training")
        everywhere = all(len(set(p.device_ids)) == cluster.num_devices
                         for p in r.plan.placements)
        return [{**row, "search_s": r.elapsed_s, "evaluations": r.evaluations, "train_dp_s": dp_s,
                 "first_valid_s": first_valid_s(r.history), "iteration_s": it,
                 "gpus_used": len(r.plan.device_ids), "every_task_everywhere": everywhere,
                 "fraction_of_bound": row["lower_bound_s"] / it,
                 "fraction_of_model_bound": row["model_bound_s"] / it, "infeasible": ""}]

    def plot(self, table: pd.DataFrame, path: Path) -> None:
        if table.empty:
            return empty(path, self.title)
        fig, (ax_t, ax_f) = plt.subplots(1, 2, figsize=(11, 4))
        bounds = table.groupby("gpus")[["lower_bound_s", "model_bound_s"]].mean()
        ax_t.plot(bounds.index, bounds["model_bound_s"], "k--", label="cost-model bound")
        ax_t.plot(bounds.index, bounds["lower_bound_s"], "k:", label="physical bound")
        for s, sub in table.groupby("scheduler", sort=False):
            m = sub.groupby("gpus")[["iteration_s", "fraction_of_bound",
                                     "fraction_of_model_bound", "evaluations"]].mean()
            line, = ax_t.plot(m.index, m["iteration_s"], "o-", label=s)
            if s == "hetrl":
                last = m.index.max()
                for g, evals in m["evaluations"].items():
                    if np.isfinite(evals):  # (the last point's label left of it: in the axes)
                        ax_t.annotate(f"{evals:,.0f} ev.", (g, m.loc[g, "iteration_s"]),
                                      textcoords="offset points", fontsize=7,
                                      xytext=(-4, 6) if g == last else (4, 4),
                                      ha="right" if g == last else "left")
            ax_f.plot(m.index, m["fraction_of_model_bound"], "o-", color=line.get_color(),
                      label=f"{s} / cost-model bound")
            ax_f.plot(m.index, m["fraction_of_bound"], "o:", color=line.get_color(),
                      label=f"{s} / physical bound")
        for ax in (ax_t, ax_f):
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted(table["gpus"].unique()))
            ax.set_xticklabels([str(g) for g in sorted(table["gpus"].unique())])
            ax.set_xlabel("GPUs (each size contains the smaller ones)")
            ax.grid(alpha=0.3)
        ax_t.set_yscale("log")
        ax_t.set_ylabel("iteration time (s, cost model)")
        ax_t.set_title("best plan vs the two lower bounds", fontsize=9)
        ax_t.legend(fontsize=7)
        ax_f.set_ylabel("bound / plan's iteration time")
        ax_f.set_ylim(0, 1.05)
        ax_f.set_title("fraction of each bound reached (1 = the bound reached)", fontsize=9)
        ax_f.legend(fontsize=7)
        seconds = sorted(table["seconds"].unique())
        budget = ", ".join(f"{s:g}" for s in seconds)
        suptitle(fig, self.title, f"{budget} s of search per cell; "
                                  f"{int(table['batch_prompts'].iloc[0])} prompts x 8 per iteration")
        save(fig, path)

    def summary(self, table: pd.DataFrame) -> list[dict[str, str]]:
        if table.empty:
            return []
        h = table[table["scheduler"] == "hetrl"].groupby("gpus")[
            ["iteration_s", "search_s", "evaluations", "first_valid_s", "fraction_of_bound",
             "fraction_of_model_bound", "gpus_used"]].mean()
        if h.empty:
            return []
        sizes = [int(g) for g in h.index]
        times = [float(t) for t in h["iteration_s"]]
        reading = doubling_reading(sizes, times)
        big = sizes[-1]
        seconds = float(table["seconds"].max())
        rows = [{"what": f"HetRL's best iteration time as the GPUs double ({seconds:g} s of search "
                         "per size)",
                 "ours": ", ".join(f"{g}: {_fmt(t)}" for g, t in zip(sizes, times, strict=True)),
                 "paper": "not reported (64 GPUs only)", "reading": reading},
                {"what": f"HetRL on {big} GPUs: first plan that fits, evaluations, fraction of "
                         "the cost-model / physical bound",
                 "ours": f"after {_fmt(h.loc[big, 'first_valid_s'])}, "
                         f"{h.loc[big, 'evaluations']:,.0f} evaluations, "
                         f"{h.loc[big, 'fraction_of_model_bound']:.2f} / "
                         f"{h.loc[big, 'fraction_of_bound']:.2f}",
                 "paper": "not reported (64 GPUs only)",
                 "reading": "a valid plan at this scale; the gap to the cost-model bound is "
                            "the search's or the bound's (a bound, not an optimum)"}]
        cols = ["iteration_s", "gpus_used"] + [c for c in ("train_dp_s", "every_task_everywhere")
                                                if c in table]
        verl = table[table["scheduler"] == "verl"].groupby("gpus")[cols].mean()
        if len(verl) >= 2:
            rows.append(verl_doubling_row(verl, h))
        v = verl["iteration_s"]
        if big in v.index and np.isfinite(v.loc[big]):
            rows.append({"what": f"{big} GPUs: verl's plan / HetRL's plan (iteration time)",
                         "ours": f"{v.loc[big] / h.loc[big, 'iteration_s']:.2f}x",
                         "paper": "not reported", "reading": "HetRL faster" if
                         v.loc[big] > h.loc[big, "iteration_s"] else "verl as fast or faster"})
        return rows


def verl_doubling_row(verl: pd.DataFrame, hetrl: pd.DataFrame) -> dict[str, str]:
    """verl's plan as the GPUs double (iteration seconds and GPUs used per size; ``verl``: its
    cells' means by size) and why it moves as it does. Where its plans take every GPU of the
    cluster (every task on all of them, ``every_task_everywhere``: its hybrid engine; or its
    pools splitting them all), a larger cluster is not a superset of choices for it but a wider
    data-parallel group -- more regions on its rings, weaker GPUs among its replicas; the
    training's DP syncs (``train_dp_s``) show it. A size without a plan says so."""
    planned = verl[np.isfinite(verl["iteration_s"])]
    failed = [int(g) for g in verl.index if g not in planned.index]
    sizes = [int(g) for g in planned.index]
    times = [float(t) for t in planned["iteration_s"]]
    used = [float(u) for u in planned["gpus_used"]]
    slower = [f"{a} -> {b}" for a, b, ta, tb in zip(sizes, sizes[1:], times, times[1:],
                                                     strict=False) if tb > ta * 1.01]
    idle = [f"{g}: {hetrl.loc[g, 'gpus_used']:.0f}" for g in sizes
            if g in hetrl.index and "gpus_used" in hetrl and hetrl.loc[g, "gpus_used"] < g]
    everywhere = "every_task_everywhere" in planned and bool(
        (planned["every_task_everywhere"] == 1).all())
    whole = all(u == g for u, g in zip(used, sizes, strict=True))
    if everywhere:
        reading = ("verl runs every task on all the GPUs it is given (its hybrid engine over the "
                   "whole pool), so each doubling widens its data-parallel groups over more "
                   "regions and weaker GPUs instead of adding a choice")
    elif whole:
        reading = ("verl's pools take every GPU it is given (its placement splits the whole "
                   "cluster between them), so each doubling widens its data-parallel groups over "
                   "more regions and weaker GPUs instead of adding a choice")
    else:
        reading = "verl's plans leave GPUs unused at some sizes"
    if slower:
        reading += f"; slower at {', '.join(slower)} GPUs"
    if "train_dp_s" in planned:
        reading += ("; its training's data-parallel syncs take "
                    + ", ".join(f"{g}: {_fmt(float(d))}" for g, d in
                                zip(sizes, planned["train_dp_s"], strict=True)))
    if idle:
        reading += f"; HetRL leaves GPUs idle where they would slow it (GPUs used, {', '.join(idle)})"
    if failed:
        reading += f"; no verl plan at {', '.join(map(str, failed))} GPUs"
    return {"what": "verl's plan as the GPUs double (iteration time, GPUs used)",
            "ours": ", ".join(f"{g}: {_fmt(t)} on {u:.0f}" for g, t, u in
                              zip(sizes, times, used, strict=True)),
            "paper": "not reported (64 GPUs only)", "reading": reading}


def doubling_reading(sizes: list[int], times: list[float]) -> str:
    """Whether the best plan got faster at each doubling, honestly: slower (by more than 1%)
    is the search's shortfall (the larger cluster holds every plan of the smaller one); within
    1% the added GPUs did not help; a size without a plan counts as slower."""
    if len(sizes) < 2:
        return "one size only"
    slower, flat = [], []
    for a, b, ta, tb in zip(sizes, sizes[1:], times, times[1:], strict=False):
        if math.isnan(tb) or tb > ta * 1.01:  # (nan: no plan)
            slower.append(f"{a} -> {b}")
        elif tb >= ta * 0.99:
            flat.append(f"{a} -> {b}")
    parts = []
    if slower:
        parts.append(f"slower at {', '.join(slower)} GPUs: the larger cluster holds every plan "
                     "of the smaller one, so the search fell short in its time budget")
    if flat:
        parts.append(f"no faster (within 1%) at {', '.join(flat)} GPUs")
    return "; ".join(parts) if parts else "faster at every doubling"


def _fmt(seconds: float) -> str:
    return "none" if not np.isfinite(seconds) else f"{seconds:.1f} s"
