"""``hetrl export --to verl``: every exported key exists in the config verl ships, and the closest
plan read back from the file estimates as the export said.

verl's configs come from its wheel (``pip download verl==VERL_VERSION --no-deps``, read with
zipfile: verl is neither installed nor imported); without a package index the key checks skip."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from dataclasses import replace

import pytest
import yaml

from hetrl.cost.model import CostModel
from hetrl.export import verl
from hetrl.io import load_cluster, load_plan, load_workload, read_mapping, save_plan
from hetrl.plan import Plan, TaskGroup, colocated_plan, make_placement
from tests.cli_helpers import assert_user_error, run

CONFIGS = {"ppo_trainer": "verl/trainer/config/_generated_ppo_trainer.yaml",
           "ppo_megatron_trainer": "verl/trainer/config/_generated_ppo_megatron_trainer.yaml"}


@pytest.fixture(scope="module")
def verl_configs(tmp_path_factory) -> dict[str, set[str]]:
    """Every dotted key of verl's two generated trainer configs, from the pinned wheel."""
    where = tmp_path_factory.mktemp("verl-wheel")
    try:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                               "-d", str(where), f"verl=={verl.VERL_VERSION}"],
                              capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot download verl=={verl.VERL_VERSION}: {exc}")
    wheels = list(where.glob("verl-*.whl"))
    if done.returncode != 0 or not wheels:
        pytest.skip(f"cannot download verl=={verl.VERL_VERSION} (no package index?): "
                    f"{(done.stderr or done.stdout).strip()[-300:]}")
    with zipfile.ZipFile(wheels[0]) as wheel:
        return {name: set(verl.flatten(yaml.safe_load(wheel.read(path))))
                for name, path in CONFIGS.items()}


def _fsdp(plan: Plan) -> Plan:
    """``plan`` with every training and inference task on FSDP (pp = tp = 1) but the reward
    model's (verl serves it on vLLM)."""
    return replace(plan, placements=tuple(
        p if p.task in ("actor_generation", "reward_inference") else replace(p, backend="fsdp")
        for p in plan.placements))


def _pools(workload, cluster, pools: list[tuple[tuple[str, ...], tuple[int, ...], int]]) -> Plan:
    """A plan of task pools: (tasks, devices, tp), every task on all its pool's devices."""
    groups, placements = [], []
    for tasks, devices, tp in pools:
        groups.append(TaskGroup(tasks, devices))
        for t in tasks:
            placements.append(make_placement(t, devices, len(devices) // tp, 1, tp,
                                             workload.model(workload.task(t).role).layers))
    order = {t: i for i, t in enumerate(workload.task_names)}
    return Plan(tuple(groups), tuple(sorted(placements, key=lambda p: order[p.task])))


def _cases():
    """(name, workload, cluster, plan builder): co-located (Megatron and FSDP), the split of
    verl's sync baseline (merged into one pool), and async splits with a standalone rollout."""
    def coloc(w, c):
        return colocated_plan(w, c, tp=2, pp=2)

    def coloc_fsdp(w, c):
        return _fsdp(colocated_plan(w, c))

    def sync_split(w, c):  # verl's split placement: actor tasks | critic and reward
        actor = ("actor_generation", "reference_inference", "actor_training")
        rest = ("reward_inference", "critic_inference", "critic_training")
        return _pools(w, c, [(actor, tuple(range(32)), 2), (rest, tuple(range(32, 64)), 2)])

    def async_three_pools(w, c):  # generation | reward model | the rest, one node each
        rest = tuple(t for t in w.task_names if t not in ("actor_generation", "reward_inference"))
        return _pools(w, c, [(("actor_generation",), tuple(range(8)), 2),
                             (("reward_inference",), tuple(range(8, 16)), 1),
                             (rest, tuple(range(16, 24)), 2)])

    return [("colocated-megatron", "qwen3-4b-ppo-sync", "paper64-multi-region-hybrid", coloc),
            ("colocated-fsdp", "qwen3-4b-grpo-sync", "paper64-single-region", coloc_fsdp),
            ("sync-split", "qwen3-4b-ppo-sync", "paper64-multi-country", sync_split),
            ("async-standalone", "qwen3-4b-ppo-async", "hetero24-two-region", async_three_pools)]


@pytest.mark.parametrize("name,workload_name,cluster_name,build", _cases(),
                         ids=[c[0] for c in _cases()])
def test_export_round_trip(capsys, tmp_path, verl_configs, name, workload_name, cluster_name,
                           build):
    import json

    workload, cluster = load_workload(workload_name), load_cluster(cluster_name)
    save_plan(build(workload, cluster), tmp_path / "plan.json")
    out, closest_file = tmp_path / "overrides.yaml", tmp_path / "closest.json"
    code, text, err = run(capsys, "export", "--to", "verl", "-w", workload_name, "-c",
                          cluster_name, "-p", tmp_path / "plan.json", "--out", out,
                          "--closest-plan", closest_file, "--json")
    assert code == 0, err
    report = json.loads(text)
    data = read_mapping(out)
    # every exported key is one of verl's
    flat = verl.flatten({k: v for k, v in data.items() if k != verl.CUSTOM_SECTION})
    missing = sorted(set(flat) - verl_configs[report["config_name"]])
    assert not missing, f"keys verl {verl.VERL_VERSION} does not have: {missing}"
    assert flat == report["overrides"]
    assert flat["data.train_batch_size"] == workload.batch_prompts
    assert flat["actor_rollout_ref.rollout.n"] == workload.responses_per_prompt
    # the closest plan, rebuilt from the file alone, is the one written and estimated
    layout = verl.layout_from_overrides(data, workload, cluster)
    rebuilt = verl.closest_plan(layout, workload, cluster)
    assert rebuilt == load_plan(closest_file, workload, cluster)
    est = CostModel(workload, cluster).estimate(rebuilt)
    assert est.iteration_s == pytest.approx(report["iteration_s"]["closest_verl_plan"])
    ours = CostModel(workload, cluster).estimate(load_plan(tmp_path / "plan.json"))
    assert report["ratio"] == pytest.approx(est.iteration_s / ours.iteration_s)
    text = out.read_text()
    assert "What verl cannot express" in text and "python3 -m verl.trainer.main_ppo" in text
    if name == "async-standalone":
        assert flat["trainer.v1.trainer_mode"] == "separate_async"
        assert flat["actor_rollout_ref.hybrid_engine"] is False
        assert flat["reward.reward_model.enable_resource_pool"] is True
        assert data[verl.CUSTOM_SECTION]["resource_pool_spec"] == {
            "global_pool": [8], "rollout_pool": [8], "reward_pool": [8]}
    if name == "sync-split":  # verl's sync trainer: one pool
        assert data[verl.CUSTOM_SECTION]["resource_pool_spec"] == {"global_pool": [8] * 8}
        assert any("become 1 verl pools" in d or "becomes" in d for d in report["differences"])
    if name.startswith("colocated"):  # already a verl plan: nothing lost
        assert report["ratio"] == pytest.approx(1.0)
        assert report["config_name"] == ("ppo_trainer" if "fsdp" in name
                                         else "ppo_megatron_trainer")


def test_export_of_the_verl_baseline(capsys, tmp_path, verl_configs):
    """`hetrl plan -s verl` output exports to a verl plan that estimates the same."""
    import json

    plan_file = tmp_path / "verl.json"
    args = ("-w", "qwen3-8b-ppo-sync", "-c", "paper64-multi-country")
    code, _, err = run(capsys, "plan", "-s", "verl", *args, "--budget-evals", "50", "-o",
                       plan_file)
    assert code == 0, err
    code, text, err = run(capsys, "export", "--to", "verl", *args, "-p", plan_file, "--out",
                          tmp_path / "o.yaml", "--json")
    assert code == 0, err
    report = json.loads(text)
    assert report["ratio"] == pytest.approx(1.0)
    assert set(report["overrides"]) <= verl_configs[report["config_name"]]


def test_export_differences_name_uneven_shares_and_layers(capsys, tmp_path):
    workload, cluster = load_workload("qwen3-4b-ppo-sync"), load_cluster("paper64-single-region")
    plan = colocated_plan(workload, cluster, tp=2, pp=2)
    train = plan.placement("actor_training")
    plan = plan.with_placement(replace(train, data_weights=(2.0,) + (1.0,) * (train.dp - 1),
                                       layers_per_stage=(20, 16)))
    save_plan(plan, tmp_path / "plan.json")
    code, text, err = run(capsys, "export", "--to", "verl", "-w", "qwen3-4b-ppo-sync", "-c",
                          "paper64-single-region", "-p", tmp_path / "plan.json", "--out",
                          tmp_path / "o.yaml")
    assert code == 0, err
    assert "actor_training: uneven data shares" in text
    assert "actor_training: uneven layer split [20, 16]" in text
    assert "mixes GPU types" in text


def test_export_refuses_what_verl_cannot_come_close_to(capsys, tmp_path):
    """A pool of 8 GPUs of one node and 4 of another is not nnodes x n_gpus_per_node."""
    workload, cluster = load_workload("qwen3-4b-grpo-sync"), load_cluster("paper64-single-region")
    save_plan(colocated_plan(workload, cluster, tp=2, devices=range(12)), tmp_path / "plan.json")
    out = tmp_path / "o.yaml"
    code, _, err = run(capsys, "export", "--to", "verl", "-w", "qwen3-4b-grpo-sync", "-c",
                       "paper64-single-region", "-p", tmp_path / "plan.json", "--out", out)
    assert_user_error(code, err, "global_pool", "8 on n0-A100-80GB, 4 on n1-A100-80GB",
                      "nnodes x n_gpus_per_node", command="export")
    assert not out.exists()
    # a model whose tp x pp does not divide its pool
    save_plan(colocated_plan(workload, cluster, tp=4, dp=2, devices=range(8)),
              tmp_path / "p2.json")
    save_plan(colocated_plan(workload, cluster, tp=4, pp=3, dp=2, devices=range(24)),
              tmp_path / "p3.json")
    code, _, err = run(capsys, "export", "--to", "verl", "-w", "qwen3-4b-grpo-sync", "-c",
                       "paper64-single-region", "-p", tmp_path / "p3.json", "--out", out)
    assert code == 0, err  # 24 GPUs = 3 nodes, tp x pp = 12 divides them
    with pytest.raises(SystemExit) as exc:  # argparse's choices: its usage message, exit 2
        run(capsys, "export", "--to", "nemo", "-w", "qwen3-4b-grpo-sync", "-c",
            "paper64-single-region", "-p", tmp_path / "p2.json", "--out", out)
    assert exc.value.code == 2 and "--to" in capsys.readouterr().err


def test_a_layout_that_does_not_divide_its_pool_is_exported_as_the_nearest_that_does():
    """verl runs every model on all of its pool's GPUs: a (tp, pp) whose product does not divide
    the pool becomes the nearest one that does (log ratio; tp inside a node), and the export
    says so instead of refusing."""
    from hetrl.export.verl import nearest_layout

    assert nearest_layout(2, 7, 48, 8) == (2, 8)
    assert nearest_layout(4, 3, 16, 8) == (4, 4)
    assert nearest_layout(3, 1, 8, 8) == (4, 1)
    assert nearest_layout(16, 1, 32, 8) == (8, 1)  # tp stays inside a node
    for tp, pp, gpus in ((2, 7, 48), (4, 3, 16), (5, 5, 24)):
        t, q = nearest_layout(tp, pp, gpus, 8)
        assert gpus % (t * q) == 0 and t <= 8
