"""Bad mixture-of-experts and FP8 input at the command line: exit 2, one line naming the field,
the value and the limit (issue 57's list), and the MoE presets through every command."""

from __future__ import annotations

import json

import pytest
import yaml

from hetrl.io import load_workload
from tests.cli_helpers import assert_user_error, run


def _workload(tmp_path, **moe) -> str:
    doc = load_workload("qwen3-30b-a3b-grpo-sync").to_dict()
    for model in doc["models"].values():
        model["moe"].update(moe)
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(json.loads(json.dumps(doc))))
    return str(path)


@pytest.mark.parametrize(("moe", "fragments"), [
    ({"top_k": 129}, ("moe.top_k = 129", "must be <= experts (128)")),
    ({"shared_ffn": 512}, ("moe.shared_ffn = 512", "without shared experts")),
    ({"experts": 0}, ("moe.experts = 0", ">= 1")),
])
def test_bad_moe_fields_exit_2_in_one_line(capsys, tmp_path, moe, fragments):
    code, _, err = run(capsys, "estimate", "-w", _workload(tmp_path, **moe), "-c", "a100x8",
                       "--colocate")
    assert_user_error(code, err, *fragments, command="estimate")


@pytest.mark.parametrize(("ep", "fragments"), [
    ("3", ("placements[actor_generation].ep = 3", "must divide Qwen3-30B-A3B's 128 experts")),
    ("16", ("ep = 16", "must divide dp = 8")),
])
def test_an_ep_that_does_not_divide_exits_2(capsys, ep, fragments):
    code, _, err = run(capsys, "estimate", "-w", "qwen3-30b-a3b-grpo-sync", "-c", "a100x8",
                       "--colocate", "--ep", ep)
    assert_user_error(code, err, *fragments, command="estimate")


def test_ep_on_a_dense_model_leaves_it_dense(capsys):
    # --ep applies to the tasks whose model has experts: a dense job keeps ep 1 everywhere
    code, out, err = run(capsys, "estimate", "-w", "qwen3-8b-grpo-sync", "-c", "a100x8",
                         "--colocate", "--tp", "2", "--ep", "2", "--json")
    assert code in (0, 3), err


def test_fp8_on_a_gpu_without_fp8_units_exits_2_naming_task_gpu_and_why(capsys, tmp_path):
    doc = load_workload("qwen3-8b-grpo-sync").to_dict() | {"gen_precision": "fp8"}
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(json.loads(json.dumps(doc))))
    code, _, err = run(capsys, "estimate", "-w", path, "-c", "a100x8", "--colocate", "--tp", "2")
    assert_user_error(code, err, "actor_generation runs in FP8 (gen_precision: fp8)",
                      "A100-80GB, which has no FP8 tensor cores", command="estimate")


@pytest.mark.parametrize("workload", ["qwen3-30b-a3b-grpo-sync", "qwen3-30b-a3b-grpo-async"])
def test_moe_presets_through_estimate_plan_simulate_show(capsys, tmp_path, workload):
    cluster = tmp_path / "h100x32.yaml"  # (async keeps a rollout copy: 16 GPUs are too few)
    cluster.write_text("name: h100x32\nnodes:\n  - {gpu: H100, count: 8, repeat: 4}\n")
    plan = tmp_path / "plan.json"
    code, _, err = run(capsys, "plan", "-w", workload, "-c", cluster, "--budget-evals", "200",
                       "--seed", "0", "-o", plan)
    assert code == 0, err
    code, out, err = run(capsys, "estimate", "-w", workload, "-c", cluster, "-p", plan, "--json")
    assert code in (0, 3), err
    assert "ep" in json.loads(out)["parts"]["actor_training"]
    code, out, err = run(capsys, "simulate", "-w", workload, "-c", cluster, "-p", plan, "-n",
                         "1", "--json")
    assert code in (0, 2), err
    code, _, err = run(capsys, "show", "-w", workload, "-c", cluster, "-p", plan, "--out",
                       tmp_path / "plan.png")
    assert code == 0, err
