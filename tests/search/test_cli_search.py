"""``hetrl plan`` and ``hetrl schedulers``, run in-process."""

from __future__ import annotations

import json

import pytest

from hetrl.io import load_plan
from hetrl.spec.presets import cluster_preset, workload_preset
from tests.cli_helpers import assert_user_error, run

SCHEDULER_NAMES = ["deap", "hetrl", "hetrl-simple", "ilp", "random", "streamrl", "verl",
                   "verl-async"]






def test_plan_json_and_validate(capsys, tmp_path):
    out_file = tmp_path / "plan.json"
    code, out, err = run(capsys, "plan", "--workload", "qwen3-4b-grpo-sync", "--cluster",
                         "hetero16-two-region", "--scheduler", "hetrl", "--budget-evals", 200,
                         "--seed", 1, "--out", out_file, "--json")
    assert code == 0, err
    data = json.loads(out)
    for key in ("scheduler", "iteration_s", "throughput_samples_per_s", "evaluations",
                "elapsed_s", "history"):
        assert key in data
    assert data["scheduler"] == "hetrl"
    assert data["evaluations"] <= 200
    assert data["out"] == str(out_file)
    wl = workload_preset("qwen3-4b-grpo-sync")
    assert data["throughput_samples_per_s"] == pytest.approx(wl.samples / data["iteration_s"])
    history = data["history"]
    assert history and all(isinstance(h, list) and len(h) == 3 for h in history)
    assert [h[2] for h in history] == sorted((h[2] for h in history), reverse=True)
    assert history[-1][1] == data["evaluations"]
    assert history[-1][2] == pytest.approx(data["iteration_s"])
    assert isinstance(data["converged"], bool)
    assert set(data["last_improvement"]) == {"evaluations", "seconds", "relative"}

    plan = load_plan(out_file)
    assert plan.provenance.scheduler == "hetrl" and plan.provenance.seed == 1
    code, out, err = run(capsys, "validate", "--workload", "qwen3-4b-grpo-sync", "--cluster",
                         "hetero16-two-region", "--plan", out_file, "--json")
    assert code == 0, err
    assert json.loads(out)["valid"] is True
    # The saved plan re-estimates to the reported time.
    code, out, err = run(capsys, "estimate", "--workload", "qwen3-4b-grpo-sync", "--cluster",
                         "hetero16-two-region", "--plan", out_file, "--json")
    assert code == 0, err
    assert json.loads(out)["iteration_s"] == pytest.approx(data["iteration_s"])

    # Same seed and evaluation budget: the same plan, written again.
    again = tmp_path / "again.json"
    code, _, _ = run(capsys, "plan", "-w", "qwen3-4b-grpo-sync", "-c", "hetero16-two-region",
                     "-s", "hetrl", "--budget-evals", 200, "--seed", 1, "-o", again)
    assert code == 0
    assert load_plan(again).placements == plan.placements


def test_plan_text_output(capsys, tmp_path):
    out_file = tmp_path / "plan.yaml"
    code, out, err = run(capsys, "plan", "-w", "qwen3-4b-grpo-sync", "-c", "hetero16-two-region",
                         "-s", "verl", "--budget-evals", 60, "-o", out_file)
    assert code == 0, err
    assert out.startswith("verl: ") and "s per iteration" in out and str(out_file) in out
    assert "group" in out and out_file.exists()
    # the last line says whether the search converged (verl measures its k best: it has)
    assert out.strip().splitlines()[-1].startswith(("converged", "not converged"))


def test_schedulers_json(capsys):
    code, out, err = run(capsys, "schedulers", "--json")
    assert code == 0 and err == ""
    data = json.loads(out)
    assert sorted(data) == SCHEDULER_NAMES
    assert all(isinstance(v, str) and v for v in data.values())
    code, out, _ = run(capsys, "schedulers")
    assert code == 0 and all(name in out for name in SCHEDULER_NAMES)


def test_unknown_scheduler_lists_the_known_ones(capsys, tmp_path):
    code, _, err = run(capsys, "plan", "-w", "qwen3-4b-grpo-sync", "-c", "hetero16-two-region",
                       "-s", "magic", "--budget-evals", 10, "-o", tmp_path / "p.json")
    line = assert_user_error(code, err, "magic", "unknown")
    for name in SCHEDULER_NAMES:
        assert name in line
    assert not (tmp_path / "p.json").exists()


def test_infeasible_job_says_by_how_much(capsys, tmp_path):
    code, _, err = run(capsys, "plan", "-w", "qwen3-14b-ppo-sync", "-c", "hetero8-two-region",
                       "-s", "hetrl", "--budget-evals", 10, "-o", tmp_path / "p.json")
    line = assert_user_error(code, err, "qwen3-14b-ppo-sync", "hetero8-two-region", "GB short")
    # "... need at least X GB ... the cluster has Y GB usable (R x, Z GB short)"
    cluster = cluster_preset("hetero8-two-region")
    usable = sum(d.gpu.memory_bytes for d in cluster.devices) * 0.92 / 1e9
    assert f"{usable:.1f} GB usable" in line
    assert not (tmp_path / "p.json").exists()


def test_missing_budget(capsys, tmp_path):
    code, _, err = run(capsys, "plan", "-w", "qwen3-4b-grpo-sync", "-c", "hetero16-two-region",
                       "-o", tmp_path / "p.json")
    assert_user_error(code, err, "budget", "--budget-s")


def test_bad_budget_values(capsys, tmp_path):
    # the command line names its own options (the library's Budget names budget.evaluations)
    code, _, err = run(capsys, "plan", "-w", "qwen3-4b-grpo-sync", "-c", "hetero16-two-region",
                       "--budget-evals", 0, "-o", tmp_path / "p.json")
    assert_user_error(code, err, "--budget-evals = '0'", ">= 1")
    code, _, err = run(capsys, "plan", "-w", "qwen3-4b-grpo-sync", "-c", "hetero16-two-region",
                       "--budget-s", -1, "-o", tmp_path / "p.json")
    assert_user_error(code, err, "--budget-s = '-1'", "> 0")


def test_the_library_budget_names_its_fields():
    from hetrl.errors import SpecError
    from hetrl.search import Budget

    with pytest.raises(SpecError, match=r"^budget\.evaluations = 0: must be >= 1"):
        Budget(evaluations=0)
    with pytest.raises(SpecError, match=r"^budget\.seconds = -1: must be > 0"):
        Budget(seconds=-1)


@pytest.mark.parametrize("scheduler, flag, fragment", [
    ("verl", "--no-load-balance", "no load balancer"),
    ("streamrl", "--no-load-balance", "no load balancer"),
    ("deap", "--no-warm-start", "no warm start"),
])
def test_an_ablation_flag_the_scheduler_lacks_is_one_line(capsys, tmp_path, scheduler, flag,
                                                          fragment):
    code, _, err = run(capsys, "plan", "-w", "qwen3-4b-grpo-sync", "-c", "hetero16-two-region",
                       "-s", scheduler, flag, "--budget-evals", 20, "-o", tmp_path / "p.json")
    line = assert_user_error(code, err, flag, scheduler, fragment, "hetrl")
    assert not (tmp_path / "p.json").exists()
    assert "hetrl-simple" in line  # names the schedulers that take it


def test_no_warm_start_reaches_the_search(capsys, tmp_path):
    code, out, err = run(capsys, "plan", "-w", "qwen3-4b-grpo-sync", "-c", "hetero16-two-region",
                         "--no-warm-start", "--budget-evals", 100, "-o", tmp_path / "p.json",
                         "--json")
    assert code == 0, err
    assert "warm_starts" not in json.loads(out)
