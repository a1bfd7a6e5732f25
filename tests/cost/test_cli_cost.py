"""``hetrl estimate`` and ``hetrl bound`` in-process: JSON output, plans and params from files,
and one-line errors with exit code 2 for bad input."""

from __future__ import annotations

import json

import pytest
import yaml

from hetrl.cost import CostModel
from hetrl.cost.params import DEFAULT_PARAMS
from hetrl.io import save_plan
from hetrl.plan import colocated_plan
from hetrl.spec.presets import cluster_preset, workload_preset
from tests.cli_helpers import assert_user_error, run
from tests.cost.plans import split_plan

BASE = ["estimate", "--workload", "qwen3-8b-ppo-sync", "--cluster", "a100x8"]
#: half the default training efficiency (Qwen3-8B's hidden size is the curve's reference)
HALF_TRAIN = DEFAULT_PARAMS.efficiency("A100-80GB", "train_flops") / 2




def run_json(capsys, *argv):
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)




def write_yaml(path, data):
    path.write_text(yaml.safe_dump(data))
    return str(path)


# --- estimate -----------------------------------------------------------------------------------

def test_estimate_colocated_json(capsys):
    d = run_json(capsys, *BASE, "--colocate", "--tp", "4")
    assert d["feasible"] is True and d["violations"] == []
    assert list(d["tasks"]) == ["actor_generation", "reward_inference", "reference_inference",
                                "critic_inference", "actor_inference", "actor_training",
                                "critic_training", "weight_sync"]
    wl, cluster = workload_preset("qwen3-8b-ppo-sync"), cluster_preset("a100x8")
    est = CostModel(wl, cluster).estimate(colocated_plan(wl, cluster, tp=4))
    assert d["iteration_s"] == pytest.approx(est.iteration_s, rel=1e-12)
    assert d["throughput_samples_per_s"] == pytest.approx(3072 / est.iteration_s, rel=1e-12)


def test_estimate_json_speaks_verls_stage_names(capsys):
    """``verl_stages``: each task under the ``timing_s/<stage>`` name verl logs, the weight
    sync inside ``gen`` for a co-located sync plan (verl loads the weights as the engine
    wakes), its own line otherwise; only the workload's tasks."""
    d = run_json(capsys, *BASE, "--colocate", "--tp", "4")
    stages, tasks = d["verl_stages"], d["tasks"]
    assert set(stages) == {"gen", "reward", "ref", "values", "update_actor", "update_critic",
                           "step"}
    assert stages["gen"] == pytest.approx(tasks["actor_generation"] + tasks["weight_sync"])
    assert stages["update_critic"] == tasks["critic_training"]
    assert stages["step"] == d["iteration_s"]
    from hetrl.cost.log_stages import verl_stages

    apart = verl_stages({"actor_generation": 5.0, "weight_sync": 1.0, "actor_training": 3.0},
                        ("actor_generation", "actor_training"), 9.0, False)
    assert apart == {"gen": 5.0, "update_actor": 3.0, "weight_sync": 1.0, "step": 9.0}
    grpo = workload_preset("qwen3-8b-grpo-sync")  # no critic: no values, no update_critic
    assert "values" not in verl_stages(dict.fromkeys(grpo.task_names, 1.0), grpo.task_names,
                                       1.0, True)


def test_estimate_text(capsys):
    code, out, err = run(capsys, *BASE, "--colocate", "--tp", "4")
    assert code == 0 and err == ""
    first = out.splitlines()[0]
    assert first.startswith("qwen3-8b-ppo-sync on a100x8: ") and "s per iteration" in first
    assert "INFEASIBLE" not in out
    for task in ("actor_generation", "actor_training", "weight_sync", "peak memory"):
        assert task in out


def test_estimate_of_a_plan_that_does_not_fit_says_infeasible_and_exits_3(capsys):
    """Every task on every A100 at tp 1 needs 166 GB per GPU: answered, "infeasible"."""
    argv = [*BASE, "--colocate", "--tp", "1"]
    code, out, err = run(capsys, *argv)
    assert code == 3 and err == ""
    first, second = out.splitlines()[:2]
    assert first.startswith("INFEASIBLE: qwen3-8b-ppo-sync on a100x8: device 0 (A100-80GB): needs")
    assert "ignoring memory" in second
    code, out, err = run(capsys, *argv, "--json")
    assert code == 3
    d = json.loads(out)
    wl, cluster = workload_preset("qwen3-8b-ppo-sync"), cluster_preset("a100x8")
    est = CostModel(wl, cluster).estimate(colocated_plan(wl, cluster, tp=1))
    assert d["feasible"] is False and d["violations"] == list(est.violations)
    assert d["iteration_s"] is None and d["throughput_samples_per_s"] is None
    assert d["iteration_s_ignoring_memory"] == pytest.approx(est.iteration_s, rel=1e-12)
    assert d["throughput_samples_per_s_ignoring_memory"] == pytest.approx(
        est.throughput_samples_per_s, rel=1e-12)


def test_estimate_saved_plan_matches_colocate(capsys, tmp_path):
    plan_file = tmp_path / "plan.json"
    colo = run_json(capsys, *BASE, "--colocate", "--tp", "2", "--pp", "2",
                    "--save-plan", str(plan_file))
    assert plan_file.exists()
    again = run_json(capsys, *BASE, "--plan", str(plan_file))
    assert again == colo


def test_estimate_hand_written_plan(capsys, tmp_path):
    wl, cluster = workload_preset("qwen3-8b-ppo-sync"), cluster_preset("a100x8")
    plan = split_plan(wl, cluster, [(["actor_generation"], [0, 1, 2, 3], 2),
                                    (["reward_inference", "reference_inference",
                                      "critic_inference", "actor_training", "critic_training"],
                                     [4, 5, 6, 7], 4)])
    path = tmp_path / "plan.yaml"
    save_plan(plan, path)
    code, out, err = run(capsys, *BASE, "--plan", str(path), "--json")
    d = json.loads(out)
    est = CostModel(wl, cluster).estimate(plan)
    # five tasks of two 8B models on 4 GPUs do not fit: answered "infeasible" (exit 3)
    assert not est.feasible and code == 3, err
    assert d["iteration_s_ignoring_memory"] == pytest.approx(est.iteration_s, rel=1e-12)
    assert d["tasks"]["weight_sync"] > 0  # generation and training on different GPUs


def test_params_file_changes_the_estimate_in_the_right_direction(capsys, tmp_path):
    base = run_json(capsys, *BASE, "--colocate", "--tp", "4")
    # Half the training efficiency: training compute doubles, nothing else moves.
    slow = run_json(capsys, *BASE, "--colocate", "--tp", "4", "--params",
                    write_yaml(tmp_path / "slow.yaml", {"defaults": {"train_flops": HALF_TRAIN}}))
    for task in ("actor_training", "critic_training"):
        assert slow["parts"][task]["compute"] == pytest.approx(
            2 * base["parts"][task]["compute"], rel=1e-9)
    assert slow["tasks"]["actor_generation"] == base["tasks"]["actor_generation"]
    assert slow["iteration_s"] > base["iteration_s"]
    # A better HBM efficiency for decode on A100s only: generation gets faster.
    fast = run_json(capsys, *BASE, "--colocate", "--tp", "4", "--params",
                    write_yaml(tmp_path / "fast.yaml",
                               {"per_gpu": {"A100-80GB": {"decode_hbm": 0.95}}}))
    assert fast["tasks"]["actor_generation"] < base["tasks"]["actor_generation"]
    assert fast["iteration_s"] < base["iteration_s"]


# --- bound --------------------------------------------------------------------------------------

def test_bound_json_and_text(capsys):
    d = run_json(capsys, "bound", "-w", "qwen3-8b-ppo-sync", "-c", "a100x8")
    assert set(d) >= {"iteration_s_lower_bound", "compute_bound_s", "memory_bound_s", "flops",
                      "hbm_bytes"}
    assert d["iteration_s_lower_bound"] == max(d["compute_bound_s"], d["memory_bound_s"]) > 0
    est = run_json(capsys, *BASE, "--colocate", "--tp", "4")
    assert d["iteration_s_lower_bound"] < est["iteration_s"]
    # the cost model's bound: between the physical one and the plan (300.87 s vs 448.98 s)
    assert d["iteration_s_lower_bound"] < d["iteration_s_model_bound"] < est["iteration_s"]
    assert d["iteration_s_model_bound"] == pytest.approx(
        d["model_generation_s"] + d["model_inference_s"] + d["model_training_s"])
    code, out, _ = run(capsys, "bound", "-w", "qwen3-8b-ppo-sync", "-c", "a100x8")
    assert code == 0 and "no plan can beat" in out
    assert "nor the cost model's 300.87 s" in out


def test_bound_takes_params(capsys, tmp_path):
    slow = write_yaml(tmp_path / "slow.yaml", {"defaults": {"train_flops": HALF_TRAIN}})
    base = run_json(capsys, "bound", "-w", "qwen3-8b-ppo-sync", "-c", "a100x8")
    d = run_json(capsys, "bound", "-w", "qwen3-8b-ppo-sync", "-c", "a100x8", "--params", slow)
    assert d["model_training_s"] == pytest.approx(2 * base["model_training_s"])
    assert d["iteration_s_lower_bound"] == base["iteration_s_lower_bound"]  # physical: no params


# --- bad input: exit 2, one line ----------------------------------------------------------------

def test_tp_not_dividing_heads(capsys):
    code, _, err = run(capsys, "estimate", "-w", "qwen3-14b-ppo-sync",
                       "-c", "paper64-single-region", "--colocate", "--tp", "16")
    assert_user_error(code, err, "tp", "16", "must divide Qwen3-14B's 40 attention heads")


def test_pp_beyond_layers(capsys):
    code, _, err = run(capsys, "estimate", "-w", "qwen3-4b-grpo-sync",
                       "-c", "paper64-single-region", "--colocate", "--pp", "64")
    assert_user_error(code, err, "pp", "64", "must be <= Qwen3-4B's 36 layers")


def test_plan_that_does_not_match_the_cluster(capsys, tmp_path):
    wl, big = workload_preset("qwen3-8b-ppo-sync"), cluster_preset("paper48-a100-l40s-single-region")
    path = tmp_path / "plan48.json"
    save_plan(colocated_plan(wl, big, tp=4), path)
    code, _, err = run(capsys, *BASE, "--plan", str(path))
    assert_user_error(code, err, "made_for.cluster = 'paper48-a100-l40s-single-region'",
                      "the cluster given is 'a100x8'")
    code, _, err = run(capsys, *BASE, "--plan", str(path), "--allow-mismatch")
    assert_user_error(code, err, "no such device in cluster 'a100x8'")


def test_save_plan_needs_colocate(capsys, tmp_path):
    path = tmp_path / "p.json"
    save_plan(colocated_plan(workload_preset("qwen3-8b-ppo-sync"), cluster_preset("a100x8"),
                             tp=4), path)
    code, _, err = run(capsys, *BASE, "--plan", str(path), "--save-plan", str(tmp_path / "x.json"))
    assert_user_error(code, err, "--save-plan goes with --colocate")


@pytest.mark.parametrize("params, fragments", [
    ({"defaults": {"train_flops": 1.5}}, ["params.defaults.train_flops", "must be in (0, 1]"]),
    ({"per_gpu": {"L4": {"decode_hbm": 0.0}}}, ["params.per_gpu.L4.decode_hbm", "(0, 1]"]),
    ({"defaults": {"tensor_cores": 0.5}}, ["unknown kernel kind"]),
    ({"per_gpu": {"L4": {"warp": 0.5}}}, ["unknown kernel kind"]),
    ({"defaults": {"train_flops": "fast"}}, ["params.defaults.train_flops", "number"]),
    ({"per_gpu": {"L4": 0.5}}, ["params.per_gpu.L4"]),
    ({"grad_bytes": -4}, ["params.grad_bytes", ">= 0"]),
    ({"grad_bytes": "four"}, ["params.grad_bytes", "number"]),
    ({"activation_bytes_per_token_hidden": -1}, ["params.activation_bytes_per_token_hidden"]),
    ({"eta": 1.5}, ["params.eta", "[0, 1]"]),
    ({"usable_memory_fraction": 0}, ["params.usable_memory_fraction"]),
    ({"speed": 2}, ["params.speed", "unknown key"]),
])
def test_bad_params_file(capsys, tmp_path, params, fragments):
    path = write_yaml(tmp_path / "params.yaml", params)
    code, _, err = run(capsys, *BASE, "--colocate", "--tp", "4", "--params", path)
    assert_user_error(code, err, *fragments)


def test_missing_params_file(capsys, tmp_path):
    code, _, err = run(capsys, *BASE, "--colocate", "--tp", "4", "--params",
                       str(tmp_path / "nope.yaml"))
    assert_user_error(code, err, "nope.yaml", "cannot read")
