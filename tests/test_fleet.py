"""The realistic fleet of issue 40: per-task figures (item 5), where each task runs (item 4),
prices by instance (item 3) and every AWS region (item 1), through the CLI."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.cli_helpers import run

GRPO_RULE = {
    "name": "llama8b-grpo-rule", "algorithm": "grpo", "mode": "sync", "reward": "rule",
    "models": {"actor": "llama-3.1-8b"}, "batch_prompts": 64, "responses_per_prompt": 4,
    "prompt_length": {"mean": 256, "max": 512, "min": 16, "std": 128},
    "response_length": {"mean": 256, "max": 512, "min": 16, "std": 128},
}


@pytest.fixture
def grpo_rule(tmp_path):
    path = tmp_path / "grpo.yaml"
    path.write_text(yaml.safe_dump(GRPO_RULE))
    return path


def test_a_rule_reward_grpo_prints_no_critic_or_reward_rows(capsys, grpo_rule):
    code, out, _ = run(capsys, "estimate", "-w", grpo_rule, "-c", "a100x8", "--colocate",
                       "--tp", "2")
    assert code == 0, out
    for absent in ("critic_inference", "critic_training", "reward_inference"):
        assert absent not in out
    for present in ("actor_generation", "reference_inference", "actor_training", "weight_sync"):
        assert present in out
    assert "8 GPUs: 8 x A100-80GB (us-east-1); dp 4 pp 1 tp 2" in out
    assert "tokens/s per GPU" in out and "MFU" in out and "HBM bandwidth" in out


def test_tasks_detail_has_rates_for_every_task_and_mfu_for_training(capsys, grpo_rule):
    code, out, _ = run(capsys, "estimate", "-w", grpo_rule, "-c", "a100x8", "--colocate",
                       "--tp", "2", "--json")
    assert code == 0
    data = json.loads(out)
    detail = data["tasks_detail"]
    assert list(detail) == ["actor_generation", "reference_inference", "actor_inference",
                            "actor_training"]
    for task, row in detail.items():
        assert row["tokens_per_s_per_gpu"] > 0, task
        assert row["gpus"] == 8 and row["by_type_region"] == [
            {"gpu": "A100-80GB", "region": "us-east-1", "count": 8}]
    assert 0 < detail["actor_training"]["mfu"] < 1
    assert 0 < detail["actor_generation"]["hbm_utilisation"] < 1
    assert detail["actor_generation"]["mfu"] is None
    # the JSON keys of before stay (tasks keeps every reported task)
    assert "critic_training" in data["tasks"]


def test_mfu_is_model_flops_over_seconds_and_peak(capsys, grpo_rule):
    from hetrl.cost.details import forward_flops_per_sample
    from hetrl.io import load_workload

    code, out, _ = run(capsys, "estimate", "-w", grpo_rule, "-c", "a100x8", "--colocate",
                       "--tp", "2", "--json")
    row = json.loads(out)["tasks_detail"]["actor_training"]
    wl = load_workload(grpo_rule)
    flops = 3 * wl.samples * forward_flops_per_sample(wl, "actor")
    assert row["mfu"] == pytest.approx(flops / (row["seconds"] * 8 * 312e12))
    # 2 x params per token, roughly: 8.03e9 params, E[prompt + response] = 512 tokens
    assert forward_flops_per_sample(wl, "actor") == pytest.approx(2 * 8.03e9 * 512, rel=0.1)


def test_the_async_chain_line_says_what_it_is(capsys):
    code, out, _ = run(capsys, "estimate", "-w", "qwen3-4b-grpo-async", "-c", "a100x8",
                       "--colocate")
    line = next(line for line in out.splitlines() if "dependency chain" in line)
    assert "overlapped, so one ends every" in line


def test_plan_lists_where_each_task_runs(capsys, tmp_path):
    code, out, err = run(capsys, "plan", "-w", "tiny-grpo-sync", "-c", "tiny4-two-region",
                         "--budget-evals", "200", "--out", tmp_path / "p.json")
    assert code == 0, err
    assert "where each task runs, and its rates:" in out
    assert "actor_training" in out.split("where each task runs")[1]
    code, out, _ = run(capsys, "plan", "-w", "tiny-grpo-sync", "-c", "tiny4-two-region",
                       "--budget-evals", "200", "--out", tmp_path / "p.json", "--json")
    detail = json.loads(out)["tasks_detail"]
    assert all(row["by_type_region"] and row["tokens_per_s_per_gpu"] for row in detail.values())
