"""The scaling figure without its searches: nested clusters per size, the cells of each mode,
the honest reading of the doublings, the summary and the plot from synthetic tables."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from experiments.figures.scaling import Scaling, doubling_reading, first_valid_s, scaling_cluster
from experiments.framework import Config

NAN = math.nan


def test_clusters_are_nested_and_sized():
    small, big = scaling_cluster(64, 0), scaling_cluster(256, 0)
    assert (small.num_devices, big.num_devices) == (64, 256)
    assert big.nodes[:8] == small.nodes
    assert len(small.regions) == 4 and len(big.regions) == 16  # two 8-GPU nodes per region
    n = small.num_devices
    assert np.array_equal(big.topology.latency_s[:n, :n], small.topology.latency_s)


@pytest.mark.parametrize("mode,sizes", [("quick", [64, 128]), ("default", [64, 256, 1024]),
                                        ("full", [64, 128, 256, 512, 1024])])
def test_cells_per_mode(mode, sizes):
    cells = Scaling().cells(Config(mode, seeds=2))
    assert sorted({c["gpus"] for c in cells}) == sizes
    assert {c["scheduler"] for c in cells} == {"hetrl", "verl"}
    assert len(cells) == len(sizes) * 2 * 2
    assert len({c["seconds"] for c in cells}) == 1  # one time budget for every size
    assert json.loads(json.dumps(cells)) == cells  # cached by their JSON


def test_doubling_reading():
    assert doubling_reading([64, 128, 256], [10.0, 5.0, 4.0]) == "faster at every doubling"
    assert doubling_reading([64, 128, 256], [10.0, 5.0, 6.0]).startswith(
        "slower at 128 -> 256 GPUs: the larger cluster holds every plan")
    assert doubling_reading([64, 128], [10.0, 10.05]) == "no faster (within 1%) at 64 -> 128 GPUs"
    assert doubling_reading([64, 128], [10.0, NAN]).startswith("slower at 64 -> 128")
    assert doubling_reading([64, 128], [NAN, 5.0]) == "faster at every doubling"
    assert doubling_reading([64], [3.0]) == "one size only"


def test_first_valid_plan_from_the_history():
    assert first_valid_s([(0.5, 1, math.inf), (1.5, 7, 30.0), (2.0, 9, 20.0)]) == 1.5
    assert math.isnan(first_valid_s([(0.5, 1, math.inf)]))


def table() -> pd.DataFrame:
    rows = []
    for gpus, hetrl, verl, evals in ((64, 20.0, 50.0, 4000), (128, 12.0, 60.0, 3000),
                                     (256, 14.0, 80.0, 1500)):
        for s, it in (("hetrl", hetrl), ("verl", verl)):
            bound, model = 64.0 / gpus, 256.0 / gpus
            rows.append({"gpus": gpus, "workload": "qwen3-8b-ppo-sync", "batch_prompts": 32,
                         "scheduler": s, "seconds": 3.0, "seed": 0, "lower_bound_s": bound,
                         "model_bound_s": model, "search_s": 3.0, "evaluations": evals,
                         "first_valid_s": 0.5, "iteration_s": it, "gpus_used": 16,
                         "fraction_of_bound": bound / it, "fraction_of_model_bound": model / it})
    return pd.DataFrame(rows)


def test_summary_reads_the_table():
    rows = Scaling().summary(table())
    assert rows[0]["ours"] == "64: 20.0 s, 128: 12.0 s, 256: 14.0 s"
    assert rows[0]["reading"].startswith("slower at 128 -> 256 GPUs")
    # 256 GPUs: cost-model bound 1 s, physical 0.25 s, plan 14 s
    assert rows[1]["ours"] == "after 0.5 s, 1,500 evaluations, 0.07 / 0.02"
    assert rows[2]["reading"].startswith("verl's plans leave GPUs unused at some sizes")
    assert rows[3]["ours"] == "5.71x" and rows[3]["reading"] == "HetRL faster"


def test_verl_doubling_says_why_its_plan_slows():
    """verl's plan on every GPU it is given, its DP syncs growing: the reading says so, with the
    GPUs HetRL leaves idle."""
    t = table()
    t["gpus_used"] = t["gpus"]
    t.loc[(t["scheduler"] == "hetrl") & (t["gpus"] == 256), "gpus_used"] = 40
    t["train_dp_s"] = t["gpus"] / 8.0
    t["every_task_everywhere"] = t["scheduler"] == "verl"
    row = Scaling().summary(t)[2]
    assert row["ours"] == "64: 50.0 s on 64, 128: 60.0 s on 128, 256: 80.0 s on 256"
    assert row["reading"].startswith("verl runs every task on all the GPUs it is given")
    assert "slower at 64 -> 128, 128 -> 256 GPUs" in row["reading"]
    assert "data-parallel syncs take 64: 8.0 s, 128: 16.0 s, 256: 32.0 s" in row["reading"]
    assert row["reading"].endswith("(GPUs used, 256: 40)")
    # pools that split every GPU between them read the same way
    t["every_task_everywhere"] = False
    assert Scaling().summary(t)[2]["reading"].startswith("verl's pools take every GPU")
    # a size where verl found no plan is said apart, not read as a plan on fewer GPUs
    t.loc[(t["scheduler"] == "verl") & (t["gpus"] == 256), "iteration_s"] = math.nan
    row = Scaling().summary(t)[2]
    assert row["ours"] == "64: 50.0 s on 64, 128: 60.0 s on 128"
    assert row["reading"].endswith("; no verl plan at 256 GPUs")


def test_a_cell_records_its_plan():
    """One verl cell on the 64-GPU cluster: its plan's time, GPUs, whether every task spans
    every GPU, and its training's DP sync seconds (the cost model's parts of the training
    tasks)."""
    cell = {"gpus": 64, "workload": "qwen3-8b-grpo-sync", "batch_prompts": 32,
            "scheduler": "verl", "seconds": 2.0, "seed": 0}
    (row,) = Scaling().compute(cell)
    assert row["infeasible"] == "" and math.isfinite(row["iteration_s"])
    assert isinstance(row["every_task_everywhere"], bool)
    assert row["train_dp_s"] >= 0 and row["gpus_used"] <= 64


def test_plot_draws(tmp_path):
    Scaling().plot(table(), tmp_path / "scaling.png")
    assert (tmp_path / "scaling.png").stat().st_size > 10_000
    Scaling().plot(pd.DataFrame(), tmp_path / "empty.png")
    assert (tmp_path / "empty.png").exists()
