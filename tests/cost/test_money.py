"""Dollars of a plan (hetrl/cost/money.py): the shipped price table, a cluster's overrides,
GPU-hours x price summed per type plus egress checked by hand, idle GPUs charged or not, and
the bytes that cross regions."""

from __future__ import annotations

import json

import pytest
import yaml

from hetrl.cost.model import CostModel
from hetrl.cost.money import hourly_gpu_dollars, money
from hetrl.errors import SpecError
from hetrl.plan import colocated_plan
from hetrl.spec.cluster import ClusterSpec, NodeSpec, RegionLink
from hetrl.spec.presets import PAPER_NODE_TYPES, cluster_preset, workload_preset
from hetrl.spec.prices import PriceOverrides, Prices, price_table
from hetrl.spec.regions import aws_regions
from tests.cli_helpers import assert_user_error, run
from tests.cost.plans import split_plan

# p4de.24xlarge and g6e.48xlarge in us-east-1 (instances.vantage.sh, 2026-01-21), 8 GPUs each
A100_VA = 27.44705 / 8
L40S_OH = 30.13118 / 8


def two_region(prices: PriceOverrides | None = None) -> ClusterSpec:
    return ClusterSpec("va-oh", (NodeSpec("va", "A100-80GB", 4, "us-east-1"),
                                 NodeSpec("oh", "L40S", 4, "us-east-2")),
                       region_links=(RegionLink("us-east-1", "us-east-2", 10.0, 5.0),),
                       prices=prices or PriceOverrides())


def small_job():
    return workload_preset("qwen3-4b-grpo-sync").with_(batch_prompts=64)


def test_table_prices_every_paper_gpu_type_in_every_paper_region():
    rows = price_table()
    assert all(r.dollars > 0 and r.source for r in rows)
    prices = Prices()
    for gpu in set(PAPER_NODE_TYPES) | {"H100", "H200"}:
        for region in list(aws_regions())[:10]:  # the paper's ten (the file's first rows)
            assert prices.gpu_hour(gpu, region) > 0, (gpu, region)
    # $/GPU-hour = instance $/h / GPUs per instance, as listed
    assert prices.gpu_hour("A100-80GB", "us-east-1") == pytest.approx(A100_VA, abs=1e-6)
    assert prices.gpu_hour("L4", "eu-west-3") == pytest.approx(16.94678 / 8, abs=1e-6)
    # a region the table lacks takes us-east-1's price; a type it lacks has none
    assert prices.gpu_hour("L40S", "mars-1") == prices.gpu_hour("L40S", "us-east-1")
    assert prices.gpu_hour("TPU", "us-east-1") is None
    assert prices.egress_per_gb("us-east-1", "us-east-2") == 0.01
    assert prices.egress_per_gb("eu-west-1", "us-east-1") == 0.02
    assert prices.egress_per_gb("eu-west-1", "eu-west-1") == 0.0
    assert prices.internet_per_gb() == 0.09


def test_dollars_are_gpu_hours_times_price_per_type_plus_egress_by_hand():
    wl, cl = small_job(), two_region()
    model = CostModel(wl, cl)
    plan = colocated_plan(wl, cl)
    est = model.estimate(plan)
    m = money(model, plan, est.iteration_s)
    hours = est.iteration_s / 3600
    assert m.gpus_charged == 8
    assert m.gpu_hours_per_iteration == pytest.approx(8 * hours)
    assert m.gpu_dollars == pytest.approx((4 * A100_VA + 4 * L40S_OH) * hours)
    # every cross-region byte here is Virginia <-> Ohio: $0.01/GB
    assert m.cross_region_bytes > 0
    assert m.egress_dollars == pytest.approx(m.cross_region_bytes / 1e9 * 0.01)
    assert m.dollars_per_iteration == pytest.approx(m.gpu_dollars + m.egress_dollars)
    assert m.dollars_per_1k_samples == pytest.approx(m.dollars_per_iteration / wl.samples * 1e3)
    assert m.dollars_per_hour == pytest.approx(m.dollars_per_iteration / hours)
    assert sum(m.bytes_by_kind.values()) == pytest.approx(m.cross_region_bytes)


def test_overrides_replace_the_table():
    wl = small_job()
    cl = two_region(PriceOverrides((("A100-80GB", 1.0), ("L40S", 0.5)), egress_per_gb=0.1))
    model = CostModel(wl, cl)
    plan = colocated_plan(wl, cl)
    t = model.estimate(plan).iteration_s
    m = money(model, plan, t)
    assert m.gpu_dollars == pytest.approx((4 * 1.0 + 4 * 0.5) * t / 3600)
    assert m.egress_dollars == pytest.approx(m.cross_region_bytes / 1e9 * 0.1)
    assert ClusterSpec.from_dict(cl.to_dict()) == cl  # round trip keeps the overrides


def test_charge_used_only_charges_only_the_used_gpus():
    wl, cl = small_job(), two_region()
    model = CostModel(wl, cl)
    # everything on the Virginia node (devices 0-3): the Ohio GPUs stay idle
    plan = split_plan(wl, cl, [(wl.task_names, [0, 1, 2, 3], 1)])
    t = model.estimate(plan).iteration_s
    idle, used = money(model, plan, t), money(model, plan, t, charge_used_only=True)
    assert (idle.gpus_charged, used.gpus_charged) == (8, 4)
    assert idle.gpu_dollars == pytest.approx((4 * A100_VA + 4 * L40S_OH) * t / 3600)
    assert used.gpu_dollars == pytest.approx(4 * A100_VA * t / 3600)
    assert used.cross_region_bytes == 0 and used.egress_dollars == 0
    assert hourly_gpu_dollars(cl, {0, 1, 2, 3})[0] == pytest.approx(4 * A100_VA)


def test_cross_region_bytes_zero_in_one_region_positive_on_a_split_plan():
    wl = small_job()
    one = cluster_preset("a100x8")
    model = CostModel(wl, one)
    plan = colocated_plan(wl, one, tp=2)
    m = money(model, plan, model.estimate(plan).iteration_s)
    assert m.cross_region_bytes == 0 and m.egress_dollars == 0 and m.internet_bytes == 0
    cl = two_region()
    model = CostModel(wl, cl)
    # generation in Virginia, the rest in Ohio: rollouts and the weight sync cross regions
    gen = ("actor_generation",)
    rest = tuple(t for t in wl.task_names if t not in gen)
    plan = split_plan(wl, cl, [(gen, [0, 1, 2, 3], 1), (rest, [4, 5, 6, 7], 1)])
    m = money(model, plan, model.estimate(plan, check=False).iteration_s)
    assert m.bytes_by_kind["rollout"] > 0 and m.bytes_by_kind["weight_sync"] > 0
    # the weight sync moves at least one full bf16 copy of the actor across
    assert m.bytes_by_kind["weight_sync"] >= 2 * wl.models[0][1].params * 0.99


@pytest.mark.parametrize("prices, fragment", [
    ({"gpu_hour": {"A100-80GB": -1}}, "prices.gpu_hour.A100-80GB"),
    ({"gpu_hour": {"A100-80GB": "cheap"}}, "prices.gpu_hour.A100-80GB"),
    ({"gpu_hour": {"Z9000": 1.0}}, "prices.gpu_hour.Z9000"),
    ({"egress_per_gb": 1e9}, "prices.egress_per_gb"),
    ({"egres_per_gb": 0.02}, "prices.egres_per_gb"),
    ([1, 2], "prices"),
])
def test_bad_price_override_is_one_line_exit_2(tmp_path, capsys, prices, fragment):
    data = two_region().to_dict()
    data["prices"] = prices
    with pytest.raises(SpecError, match=fragment.replace(".", r"\.")):
        ClusterSpec.from_dict(data)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    code, _, err = run(capsys, "estimate", "-w", "qwen3-4b-grpo-sync", "-c", path, "--colocate")
    assert_user_error(code, err, fragment)


def test_estimate_reports_dollars_for_every_plan(capsys):
    code, out, _ = run(capsys, "estimate", "-w", "qwen3-4b-grpo-sync", "-c", "a100x8",
                       "--colocate", "--json")
    assert code == 0
    data = json.loads(out)
    for key in ("dollars_per_iteration", "dollars_per_1k_samples", "gpu_hours_per_iteration",
                "cross_region_bytes", "egress_dollars"):
        assert key in data
    assert data["gpu_hours_per_iteration"] == pytest.approx(8 * data["iteration_s"] / 3600)
    # an infeasible plan (exit 3) still gets its dollars, at the time ignoring memory
    code, out, _ = run(capsys, "estimate", "-w", "qwen3-8b-ppo-sync", "-c",
                       "paper64-multi-country", "--colocate", "--json")
    assert code == 3
    data = json.loads(out)
    assert data["iteration_s"] is None and data["dollars_per_iteration"] > 0
    assert data["cross_region_bytes"] > 0 and data["egress_dollars"] > 0
    code, out, _ = run(capsys, "estimate", "-w", "qwen3-4b-grpo-sync", "-c", "a100x8",
                       "--colocate")
    assert code == 0 and "dollars: $" in out and "idle ones too" in out
