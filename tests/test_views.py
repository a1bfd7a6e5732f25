"""``hetrl show`` and ``--gantt``: pictures of every preset scenario, of the expected size, and
bad input refused (exit 2) before any drawing."""

from __future__ import annotations

import json

import matplotlib.image
import numpy as np
import pytest

from hetrl.cost.flows import iteration_flows, region_flows
from hetrl.io import load_cluster, load_workload, save_plan
from hetrl.plan import Plan, TaskGroup, colocated_plan, make_placement
from hetrl.views import gantt, plan_picture
from tests.cli_helpers import assert_user_error, run

PAPER64 = [f"paper64-{s}" for s in ("single-region", "multi-region-hybrid", "multi-country",
                                    "multi-continent")]
TINY_PLANS = [("tiny-grpo-sync", "tiny4-two-region", "examples/plan-tiny-grpo-cross-region.yaml"),
              ("tiny-ppo-sync", "tiny4-single-region", "examples/plan-tiny-ppo-tiny4.yaml"),
              ("tiny-grpo-async", "tiny4-two-region", "examples/plan-tiny-grpo-tiny4.yaml")]


def _image(path, width_in: float, height_in: float, dpi: int) -> np.ndarray:
    img = matplotlib.image.imread(str(path))
    assert img.shape[:2] == (round(height_in * dpi), round(width_in * dpi))
    assert img[..., :3].std() > 0.01  # not one flat colour
    return img


def _split_plan(workload, cluster) -> Plan:
    """Generation on the first half of the GPUs, every other task on the second half."""
    n = cluster.num_devices // 2
    a, b = tuple(range(n)), tuple(range(n, 2 * n))
    rest = tuple(t for t in workload.task_names if t != "actor_generation")
    layers = workload.model("actor").layers
    placements = [make_placement("actor_generation", a, n // 2, 1, 2, layers)]
    placements += [make_placement(t, b, n // 2, 1, 2, workload.model(workload.task(t).role).layers)
                   for t in rest]
    return Plan((TaskGroup(("actor_generation",), a), TaskGroup(rest, b)), tuple(placements))


@pytest.mark.parametrize("cluster_name", PAPER64)
def test_show_draws_every_paper64_scenario(capsys, tmp_path, cluster_name):
    workload, cluster = load_workload("qwen3-4b-ppo-async"), load_cluster(cluster_name)
    for i, plan in enumerate((colocated_plan(workload, cluster, tp=2),
                              _split_plan(workload, cluster))):
        save_plan(plan, tmp_path / f"plan{i}.json")
        out = tmp_path / f"plan{i}.png"
        code, text, err = run(capsys, "show", "-w", "qwen3-4b-ppo-async", "-c", cluster_name,
                              "-p", tmp_path / f"plan{i}.json", "--out", out)
        assert code == 0, err
        assert "wrote" in text
        _image(out, *plan_picture.SIZE_IN, plan_picture.DPI)


@pytest.mark.parametrize("workload_name,cluster_name,plan_file", TINY_PLANS)
def test_show_and_gantt_on_the_tiny_presets(capsys, tmp_path, workload_name, cluster_name,
                                            plan_file):
    out = tmp_path / "plan.png"
    code, _, err = run(capsys, "show", "-w", workload_name, "-c", cluster_name, "-p", plan_file,
                       "--out", out, "--json")
    assert code == 0, err
    _image(out, *plan_picture.SIZE_IN, plan_picture.DPI)
    for per_gpu in (False, True):
        chart = tmp_path / f"gantt{per_gpu}.png"
        code, _, err = run(capsys, "simulate", "-w", workload_name, "-c", cluster_name, "-p",
                           plan_file, "-n", "3", "--gantt", chart,
                           *(["--per-gpu"] if per_gpu else []))
        assert code == 0, err
        cluster = load_cluster(cluster_name)
        from hetrl.io import load_plan

        plan = load_plan(plan_file)
        # one row per GPU, or one per task (grouped by task group)
        rows = cluster.num_devices if per_gpu else sum(len(g.tasks) for g in plan.groups)
        _image(chart, *gantt.gantt_size(rows), gantt.DPI)


def test_show_svg_by_suffix_and_by_format(capsys, tmp_path):
    args = ("show", "-w", "tiny-grpo-sync", "-c", "tiny4-two-region", "-p",
            "examples/plan-tiny-grpo-cross-region.yaml")
    assert run(capsys, *args, "--out", tmp_path / "a.svg")[0] == 0
    assert run(capsys, *args, "--out", tmp_path / "b", "--format", "svg")[0] == 0
    for name in ("a.svg", "b"):
        assert (tmp_path / name).read_text().lstrip().startswith("<?xml")


@pytest.mark.parametrize("cluster_name", PAPER64)
def test_gantt_of_every_paper64_scenario(tmp_path, cluster_name):
    from sim import simulate

    workload, cluster = load_workload("qwen3-4b-grpo-sync"), load_cluster(cluster_name)
    plan = colocated_plan(workload, cluster, tp=2)
    trace = simulate(plan, workload, cluster, 1, 0).trace
    for per_gpu in (False, True):
        out = tmp_path / f"g{per_gpu}.png"
        gantt.write_gantt(trace, str(out), plan, cluster, per_gpu)
        rows = 64 if per_gpu else len(plan.placements)  # co-located: one row per task
        _image(out, *gantt.gantt_size(rows), gantt.DPI)


def test_a_bad_plan_is_refused_before_any_drawing(capsys, tmp_path, monkeypatch):
    def no_drawing(*args, **kwargs):
        raise AssertionError("drew a picture of a bad plan")

    monkeypatch.setattr(plan_picture, "draw_plan", no_drawing)
    monkeypatch.setattr(gantt, "draw_gantt", no_drawing)
    out = tmp_path / "plan.png"
    # the plan is made for GRPO: it misses PPO's critic tasks
    code, _, err = run(capsys, "show", "-w", "tiny-ppo-sync", "-c", "tiny4-two-region", "-p",
                       "examples/plan-tiny-grpo-cross-region.yaml", "--out", out)
    assert_user_error(code, err, "made_for.workload", "'tiny-ppo-sync'", command="show")
    code, _, err = run(capsys, "show", "-w", "tiny-ppo-sync", "-c", "tiny4-two-region", "-p",
                       "examples/plan-tiny-grpo-cross-region.yaml", "--out", out,
                       "--allow-mismatch")
    assert_user_error(code, err, "tasks missing from every group", command="show")
    code, _, err = run(capsys, "show", "-w", "tiny-grpo-sync", "-c", "tiny4-two-region", "-p",
                       tmp_path / "nowhere.yaml", "--out", out)
    assert_user_error(code, err, "nowhere.yaml", command="show")
    code, _, err = run(capsys, "show", "-w", "tiny-grpo-sync", "-c", "tiny4-two-region", "-p",
                       "examples/plan-tiny-grpo-cross-region.yaml", "--out", tmp_path / "p.pdf")
    assert_user_error(code, err, "--out", "not a picture format", command="show")
    assert not out.exists() and not (tmp_path / "p.pdf").exists()


def test_simulate_gantt_options_are_checked_before_the_simulation(capsys, tmp_path, monkeypatch):
    import sim

    def no_simulation(*args, **kwargs):
        raise AssertionError("simulated despite a bad option")

    monkeypatch.setattr(sim, "simulate", no_simulation)
    args = ("simulate", "-w", "tiny-grpo-sync", "-c", "tiny4-two-region", "-p",
            "examples/plan-tiny-grpo-cross-region.yaml")
    code, _, err = run(capsys, *args, "--gantt", tmp_path / "g.jpg")
    assert_user_error(code, err, "--gantt", "not a picture format", command="simulate")
    code, _, err = run(capsys, *args, "--per-gpu")
    assert_user_error(code, err, "--per-gpu", "goes with --gantt", command="simulate")


def test_cross_region_flows_by_hand():
    """tiny4-two-region, the cross-region example: generation replicas on device 0 (us-east-1)
    and 3 (eu-west-1), each with half the batch; training is one replica whose first stage is on
    device 1 (us-east-1): both send it their half, only device 3's crosses regions:
    half of 32 samples x E[prompt + response] (99.5 + 16 tokens) x 20 bytes per token."""
    workload, cluster = load_workload("tiny-grpo-sync"), load_cluster("tiny4-two-region")
    from hetrl.io import load_plan

    plan = load_plan("examples/plan-tiny-grpo-cross-region.yaml", workload, cluster)
    flows = iteration_flows(plan, workload, cluster)
    train_in = [f for f in flows if f.kind == "rollout data" and f.task == "actor_training"]
    assert [(f.src, f.dst) for f in train_in] == [(0, 1), (3, 1)]
    assert train_in[1].nbytes == pytest.approx(0.5 * 32 * (99.5 + 16) * 20)
    between = region_flows(flows, cluster)
    # inference replicas sit on generation's devices: nothing else crosses with rollout data
    assert between[("eu-west-1", "us-east-1")]["rollout data"] == pytest.approx(
        0.5 * 32 * (99.5 + 16) * 20)
    # the pipeline boundary of training crosses from device 1 to device 2 (eu-west-1)
    assert between[("us-east-1", "eu-west-1")]["pipeline"] > 0
    assert set(between) == {("us-east-1", "eu-west-1"), ("eu-west-1", "us-east-1")}


def test_a_colocated_group_shows_where_each_task_runs(capsys, tmp_path):
    """Issue 40, item 4: inside one co-located group, show lists each task's GPUs by type and
    region with its layout; the Gantt has a row per task, labelled with its GPUs."""
    from sim import simulate

    plan_file = "examples/plan-tiny-grpo-cross-region.yaml"
    code, out, err = run(capsys, "show", "-w", "tiny-grpo-sync", "-c", "tiny4-two-region", "-p",
                         plan_file, "--out", tmp_path / "p.png", "--json")
    assert code == 0, err
    where = json.loads(out)["tasks_where"]
    workload, cluster = load_workload("tiny-grpo-sync"), load_cluster("tiny4-two-region")
    assert list(where) == list(workload.task_names)
    for task, row in where.items():
        assert sum(g["count"] for g in row["by_type_region"]) == row["gpus"], task
        assert {"dp", "pp", "tp"} <= set(row)
    code, out, _ = run(capsys, "show", "-w", "tiny-grpo-sync", "-c", "tiny4-two-region", "-p",
                       plan_file, "--out", tmp_path / "p.png")
    assert "actor_generation" in out and "dp " in out and "(us-east-1)" in out
    from hetrl.io import load_plan

    plan = load_plan(plan_file)
    labels, _ = gantt._rows(simulate(plan, workload, cluster, 1, 0).trace, plan, cluster, False)
    assert len(labels) == len(plan.placements)
    assert all(" x " in label and "(group " in label for label in labels)
