"""``hetrl export --to verl``, tested against real verl :data:`hetrl.export.verl.VERL_VERSION`
(``pip install --no-deps verl==0.9.1`` and the ``verl`` extra's config packages; the README's
test command installs them): every export below is composed from its own command line as
``main_ppo`` composes it, checked by ``validate_config`` and the trainers' start-up checks, and
its workers' config dataclasses are built (tests/verl_accept.py). Only those tests skip, with
the reason, where verl is not importable; the rest need no verl."""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from hetrl.cost.model import CostModel
from hetrl.export import verl
from hetrl.io import load_cluster, load_plan, load_workload, read_mapping, save_plan
from hetrl.plan import Plan, TaskGroup, colocated_plan, make_placement
from tests.cli_helpers import assert_user_error, run
from tests.verl_accept import accepted_export as _accepted

CONFIGS = {"ppo_trainer": "_generated_ppo_trainer.yaml",
           "ppo_megatron_trainer": "_generated_ppo_megatron_trainer.yaml"}
INSTALL = (f"verl {verl.VERL_VERSION} is not importable: pip install -e '.[test,verl]' && "
           f"pip install --no-deps verl=={verl.VERL_VERSION} (the README's test command)")


@pytest.fixture(scope="module")
def verl_installed():
    """The installed verl package (skips the test, with the reason, where it is not)."""
    import importlib

    try:
        verl_pkg = importlib.import_module("verl")
        importlib.import_module("verl.utils.config")  # (its config code's imports, too)
    except ImportError as exc:
        pytest.skip(f"{INSTALL} ({exc})")
    from importlib.metadata import version

    assert version("verl") == verl.VERL_VERSION, "the export is written against this verl"
    return Path(verl_pkg.__file__).parent


@pytest.fixture(scope="module")
def verl_configs(verl_installed) -> dict[str, set[str]]:
    """Every dotted key of verl's two generated trainer configs."""
    where = verl_installed / "trainer" / "config"
    return {name: set(verl.flatten(yaml.safe_load((where / f).read_text())))
            for name, f in CONFIGS.items()}


def _check_keys(flat, verl_configs, config_name):
    """Every exported key is verl's, or a field its YAML lacks, added with Hydra's ``+``."""
    from hetrl.export.verl_keys import is_new_key

    known = verl_configs[config_name]
    missing = sorted(k for k in flat if not is_new_key(k) and k not in known)
    assert not missing, f"keys verl {verl.VERL_VERSION} does not have: {missing}"
    wrongly_new = sorted(k for k in flat if is_new_key(k) and k in known)
    assert not wrongly_new, f"keys verl has (Hydra's + would fail): {wrongly_new}"


def _workload_file(tmp_path, base: str, **changes) -> str:
    """``base`` with ``changes`` (workload file keys) as a workload file."""
    data = load_workload(base).to_dict()
    data.update(changes)
    path = tmp_path / f"{base}-custom.yaml"
    path.write_text(yaml.safe_dump(json.loads(json.dumps(data))))  # (no YAML aliases)
    return str(path)


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
    """(name, workload (a preset, or changes to one: (preset, {key: value})), cluster, plan
    builder, extra arguments): co-located (Megatron and FSDP), the split of verl's sync baseline
    (merged into one pool), async on the hybrid engine and with a standalone rollout, uneven
    pipeline stages, dynamic batch sizes, the three KL modes, rule rewards and Llama models."""
    def coloc(w, c):
        return colocated_plan(w, c, tp=2, pp=2)

    def coloc_fsdp(w, c):
        return _fsdp(colocated_plan(w, c))

    def pp8(w, c):  # 36 layers over 8 stages
        return colocated_plan(w, c, tp=1, pp=8)

    def pp8_ref_pp2(w, c):  # the actor's uneven split; the reference's own, even one
        plan = pp8(w, c)
        ref = make_placement("reference_inference", tuple(range(64)), 32, 2, 1, 36)
        return replace(plan, placements=tuple(ref if p.task == ref.task else p
                                              for p in plan.placements))

    def sync_split(w, c):  # verl's split placement: actor tasks | critic and reward
        actor = ("actor_generation", "reference_inference", "actor_training")
        rest = ("reward_inference", "critic_inference", "critic_training")
        return _pools(w, c, [(actor, tuple(range(32)), 2), (rest, tuple(range(32, 64)), 2)])

    def async_three_pools(w, c):  # generation | reward model | the rest, one node each
        rest = tuple(t for t in w.task_names if t not in ("actor_generation", "reward_inference"))
        return _pools(w, c, [(("actor_generation",), tuple(range(8)), 2),
                             (("reward_inference",), tuple(range(8, 16)), 1),
                             (rest, tuple(range(16, 24)), 2)])

    llama = load_workload("qwen3-8b-ppo-sync").to_dict()["models"]["actor"] | {
        "name": "Llama-3.1-8B", "layers": 32, "hidden": 4096, "ffn": 14336, "vocab": 128256}
    own = dict(llama, name="my-8b")
    return [
        ("colocated-megatron", "qwen3-4b-ppo-sync", "paper64-multi-region-hybrid", coloc, ()),
        ("colocated-fsdp", "qwen3-4b-grpo-sync", "paper64-single-region", coloc_fsdp, ()),
        ("sync-split", "qwen3-4b-ppo-sync", "paper64-multi-country", sync_split,
         ("--max-slowdown", "100")),
        ("async-standalone", "qwen3-4b-ppo-async", "hetero24-two-region", async_three_pools,
         ("--max-slowdown", "100")),
        ("async-colocated", "qwen3-4b-grpo-async", "paper64-single-region", coloc, ()),
        ("megatron-pp8-uneven", "qwen3-4b-ppo-sync", "paper64-single-region", pp8, ()),
        ("megatron-pp8-uneven-ref-pp2", "qwen3-4b-ppo-sync", "paper64-single-region",
         pp8_ref_pp2, ()),
        ("dynamic-bsz-fsdp", ("qwen3-4b-ppo-sync", {"micro_batch_tokens": 8192}),
         "paper64-single-region", coloc_fsdp, ()),
        ("dynamic-bsz-megatron", ("qwen3-4b-ppo-sync", {"micro_batch_tokens": 8192,
                                                        "inference_micro_batch_tokens": 16384}),
         "paper64-single-region", coloc, ()),
        ("kl-reward-llama", ("qwen3-8b-ppo-sync", {"kl": "reward", "models": {
            "actor": llama, "reference": llama, "critic": llama, "reward": llama}}),
         "paper64-single-region", coloc, ()),
        ("no-sequence-parallel-critic-recompute", ("qwen3-4b-ppo-sync", {
            "sequence_parallel": False,
            "task_batching": {"critic_training": {"recompute": True}}}),
         "paper64-single-region", coloc, ()),
        ("kl-none-rule-own-model", ("qwen3-4b-grpo-sync", {"kl": "none", "reward": "rule",
                                                           "models": {"actor": own}}),
         "paper64-single-region", coloc_fsdp, ("--model-path", "actor=/models/my-8b")),
    ]


@pytest.mark.parametrize("name,workload_arg,cluster_name,build,extra", _cases(),
                         ids=[c[0] for c in _cases()])
def test_verl_accepts_the_export(capsys, tmp_path, verl_configs, name, workload_arg,
                                 cluster_name, build, extra):
    """Every key is verl's; verl composes, validates and builds the export's config; the
    closest plan read back from the file alone is the one written and estimated."""
    if isinstance(workload_arg, tuple):
        workload_arg = _workload_file(tmp_path, workload_arg[0], **workload_arg[1])
    workload, cluster = load_workload(workload_arg), load_cluster(cluster_name)
    save_plan(build(workload, cluster), tmp_path / "plan.json")
    out, closest_file = tmp_path / "overrides.yaml", tmp_path / "closest.json"
    code, text, err = run(capsys, "export", "--to", "verl", "-w", workload_arg, "-c",
                          cluster_name, "-p", tmp_path / "plan.json", "--out", out,
                          "--closest-plan", closest_file, "--json", *extra)
    assert code == 0, err
    report = json.loads(text)
    data = read_mapping(out)
    flat = verl.flatten({k: v for k, v in data.items() if k != verl.CUSTOM_SECTION})
    _check_keys(flat, verl_configs, report["config_name"])
    assert flat == report["overrides"]
    assert flat["data.train_batch_size"] == workload.batch_prompts
    assert flat["actor_rollout_ref.rollout.n"] == workload.responses_per_prompt
    built = _accepted(tmp_path, out, workload)
    # verl builds the reference exactly when hetrl's plan runs reference_inference
    assert built["use_reference_policy"] == ("reference_inference" in workload.task_names)
    assert built["use_critic"] == ("critic_training" in workload.task_names)
    assert built["rollout"].pipeline_model_parallel_size == 1
    assert ("reward" in built) == (workload.reward == "model")
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
    if name == "async-colocated":
        assert flat["trainer.v1.trainer_mode"] == "colocate_async"
    if name == "sync-split":  # verl's sync trainer: one pool
        assert data[verl.CUSTOM_SECTION]["resource_pool_spec"] == {"global_pool": [8] * 8}
        assert any("become 1 verl pools" in d or "becomes" in d for d in report["differences"])
    if name.startswith("colocated"):  # already a verl plan but for the vLLM pp
        assert report["config_name"] == ("ppo_trainer" if "fsdp" in name
                                         else "ppo_megatron_trainer")
    if name == "colocated-fsdp":
        assert report["ratio"] == pytest.approx(1.0)
    if name == "colocated-megatron":  # generation pp 2 -> tp 4, pp 1, and said so
        assert flat["actor_rollout_ref.rollout.tensor_model_parallel_size"] == 4
        assert any("do not run pipeline parallelism" in d for d in report["differences"])
    if name == "megatron-pp8-uneven":
        first = "override_transformer_config.num_layers_in_first_pipeline_stage"
        assert flat[f"actor_rollout_ref.actor.megatron.{first}"] == 3
        assert load_plan(closest_file).placement("actor_training").layers_per_stage == (
            3, 5, 5, 5, 5, 5, 5, 3)
    if name == "megatron-pp8-uneven-ref-pp2":  # (verl's reference inherits the actor's ends)
        first = "override_transformer_config.num_layers_in_first_pipeline_stage"
        assert flat[f"actor_rollout_ref.ref.megatron.{first}"] is None
        assert load_plan(closest_file).placement("reference_inference").layers_per_stage == (
            18, 18)
        assert any(d.startswith("ref: its Megatron override") for d in report["differences"])
    if name.startswith("dynamic"):
        assert built["actor"].use_dynamic_bsz and built["ref"].use_dynamic_bsz
        assert built["critic"].engine.use_dynamic_bsz
        assert built["critic"].engine.max_token_len_per_gpu == 8192
    else:  # the critic's engine batches by the workload's micro-batches
        if "critic" in built:
            assert built["critic"].engine.use_dynamic_bsz is False
            assert built["critic"].engine.micro_batch_size_per_gpu == workload.micro_batch_size
            assert built["critic"].engine.infer_micro_batch_size_per_gpu == \
                workload.inference_micro_batch_size
    if name == "kl-reward-llama":
        assert flat["algorithm.use_kl_in_reward"] is True
        assert flat["actor_rollout_ref.actor.use_kl_loss"] is False
        assert flat["actor_rollout_ref.model.path"] == "meta-llama/Llama-3.1-8B"
        assert flat["critic.model.path"] == "meta-llama/Llama-3.1-8B"
        assert built["reward_model"].architectures == ["LlamaForCausalLM"]
    if name == "no-sequence-parallel-critic-recompute":
        assert flat["actor_rollout_ref.actor.megatron.sequence_parallel"] is False
        assert flat["critic.megatron.sequence_parallel"] is False
        assert built["actor"].megatron.sequence_parallel is False
        assert flat["actor_rollout_ref.model.enable_gradient_checkpointing"] is False
        assert flat["critic.model.enable_gradient_checkpointing"] is True
    else:
        assert not any(k.endswith("megatron.sequence_parallel") for k in flat)
    if name == "kl-none-rule-own-model":
        assert flat["actor_rollout_ref.model.path"] == "/models/my-8b"
        assert "reward.reward_model.enable" not in flat


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
    assert report["ratio"] == pytest.approx(1.0, rel=0.05)
    _check_keys(report["overrides"], verl_configs, report["config_name"])
    built = _accepted(tmp_path, tmp_path / "o.yaml", load_workload("qwen3-8b-ppo-sync"))
    assert built["use_reference_policy"] and built["rollout"].pipeline_model_parallel_size == 1


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
    assert "actor: 36 layers over pp 2 stages as [20, 16]" in text  # Megatron runs it
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


def test_export_refuses_a_closest_plan_over_max_slowdown(capsys, tmp_path):
    """verl merges the split's two groups into one pool: over --max-slowdown, exit 2 naming the
    ratio; a larger bound exports it."""
    workload, cluster = load_workload("qwen3-4b-ppo-sync"), load_cluster("paper64-multi-country")
    actor = ("actor_generation", "reference_inference", "actor_training")
    rest = ("reward_inference", "critic_inference", "critic_training")
    save_plan(_pools(workload, cluster, [(actor, tuple(range(32)), 2),
                                         (rest, tuple(range(32, 64)), 2)]), tmp_path / "p.json")
    out = tmp_path / "o.yaml"
    args = ("export", "--to", "verl", "-w", "qwen3-4b-ppo-sync", "-c", "paper64-multi-country",
            "-p", tmp_path / "p.json", "--out", out)
    code, _, err = run(capsys, *args, "--max-slowdown", "1.01")
    assert code == 2 and "--max-slowdown = 1.01: the closest plan the framework runs is" in err
    assert not out.exists()
    code, _, err = run(capsys, *args, "--max-slowdown", "1000")
    assert code == 0, err


def test_export_needs_a_path_for_a_model_without_a_hugging_face_id(capsys, tmp_path):
    wl = _workload_file(tmp_path, "qwen3-4b-grpo-sync", kl="none", reward="rule", models={
        "actor": load_workload("qwen3-4b-grpo-sync").to_dict()["models"]["actor"] | {
            "name": "mine"}})
    workload, cluster = load_workload(wl), load_cluster("a100x8")
    save_plan(_fsdp(colocated_plan(workload, cluster)), tmp_path / "p.json")
    args = ("export", "--to", "verl", "-w", wl, "-c", "a100x8", "-p", tmp_path / "p.json",
            "--out", tmp_path / "o.yaml")
    code, _, err = run(capsys, *args)
    assert_user_error(code, err, "models.actor", "--model-path actor=PATH", command="export")
    code, _, err = run(capsys, *args, "--model-path", "reference=/x")
    assert_user_error(code, err, "--model-path reference", "actor's path", command="export")
    for bad in ("actor=/m\nrm -rf /", "actor=/m\x00"):
        code, _, err = run(capsys, *args, "--model-path", bad)
        assert_user_error(code, err, "--model-path actor", "control characters",
                          command="export")


HOSTILE = ["it's \"quoted\"", "$(touch PWNED)", "`touch PWNED`", "a; touch PWNED", "${HOME}",
           "x' ; touch PWNED; '", "back\\slash\\",
           "a\\${x}'"]


@pytest.mark.parametrize("name", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_names_yield_a_command_that_runs_only_verl(capsys, tmp_path, name):
    """Names from stranger files (model path, cluster and node names) holding quotes, $(...),
    backticks or ';': the command line, run by a shell, runs only verl's entry point (a stand-in
    python3 that records its arguments), which receives each value unchanged."""
    wl = _workload_file(tmp_path, "qwen3-4b-grpo-sync", kl="none", reward="rule",
                        name=f"w {name}", models={
                            "actor": load_workload("qwen3-4b-grpo-sync").to_dict()["models"][
                                "actor"] | {"name": f"m {name}"}})
    cluster_file = tmp_path / "c.yaml"
    cluster_file.write_text(yaml.safe_dump({"name": f"c {name}", "nodes": [
        {"name": f"n {name}", "gpu": "A100-80GB", "count": 8, "region": "us-east-1"}]}))
    workload, cluster = load_workload(wl), load_cluster(str(cluster_file))
    save_plan(_fsdp(colocated_plan(workload, cluster)), tmp_path / "p.json")
    out = tmp_path / "o.yaml"
    code, _, err = run(capsys, "export", "--to", "verl", "-w", wl, "-c", cluster_file, "-p",
                       tmp_path / "p.json", "--out", out, "--model-path", f"actor={name}")
    assert code == 0, err
    bin_dir, record = tmp_path / "bin", tmp_path / "argv.json"
    bin_dir.mkdir()
    fake = bin_dir / "python3"
    fake.write_text("#!/bin/sh\nexec \"$HETRL_PY\" -c 'import json, os, sys; json.dump("
                    "sys.argv[1:], open(os.environ[\"HETRL_RECORD\"], \"w\"))' \"$@\"\n")
    fake.chmod(0o755)
    lines = out.read_text().splitlines()
    start = lines.index("# The command line:") + 1
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("# "))
    script = "\n".join(line[2:] for line in lines[start:end])
    import sys

    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HETRL_PY": sys.executable,
           "HETRL_RECORD": str(record), "HOME": "/nonexistent"}
    done = subprocess.run(["sh", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "PWNED").exists()
    argv = json.loads(record.read_text())
    assert argv[:2] == ["-m", "verl.trainer.main_ppo"]
    from hetrl.export.verl_keys import hydra_value

    assert f"actor_rollout_ref.model.path={hydra_value(name)}" in argv
    text = out.read_text()
    assert read_mapping(out)[verl.CUSTOM_SECTION]["nodes"]["global_pool"] == [f"n {name}"]
    assert all(line.startswith("#") for line in text.splitlines()[:text.splitlines().index(
        "# The command line:")])


def test_hydra_reads_a_quoted_value_back_unchanged(verl_installed):
    """Hydra's grammar and OmegaConf's interpolation do not touch a quoted value."""
    from hetrl.export.verl_keys import command_args
    from tests.verl_accept import compose

    for name in HOSTILE:
        cfg = compose("ppo_trainer", command_args({"actor_rollout_ref.model.path": name}))
        assert cfg.actor_rollout_ref.model.path == name


@pytest.mark.parametrize("where", ["model", "cluster", "node", "path"])
def test_newlines_and_nul_are_refused(capsys, tmp_path, where):
    bad = "evil\n$(touch PWNED)" if where != "path" else "evil\x00"
    base = load_workload("qwen3-4b-grpo-sync").to_dict()["models"]["actor"]
    wl = _workload_file(tmp_path, "qwen3-4b-grpo-sync", kl="none", reward="rule", models={
        "actor": base | ({"name": bad} if where == "model" else {})})
    cluster_file = tmp_path / "c.yaml"
    cluster_file.write_text(yaml.safe_dump({"name": bad if where == "cluster" else "c", "nodes": [
        {"name": bad if where == "node" else "n0", "gpu": "A100-80GB", "count": 8,
         "region": "us-east-1"}]}))
    try:
        workload, cluster = load_workload(wl), load_cluster(str(cluster_file))
    except Exception as exc:  # a loader that refuses it first is as good
        assert "evil" in str(exc)
        return
    save_plan(_fsdp(colocated_plan(workload, cluster)), tmp_path / "p.json")
    out = tmp_path / "o.yaml"
    extra = ("--model-path", f"actor={bad}") if where in ("path", "model") else ()
    code, _, err = run(capsys, "export", "--to", "verl", "-w", wl, "-c", cluster_file, "-p",
                       tmp_path / "p.json", "--out", out, *extra)
    assert_user_error(code, err, "control characters", command="export")
    assert not out.exists()


def test_verl_accepts_an_expert_parallel_fp8_export(capsys, tmp_path, verl_configs):
    """Qwen3-30B-A3B with ep 4 (each expert-parallel group inside a node) and FP8 rollouts on
    two nodes of 8 H100: Megatron's expert_model_parallel_size, the rollout's data_parallel_size
    ep and expert_parallel_size tp x ep (verl's RolloutConfig checks that product), vLLM's fp8
    quantisation; verl composes and builds it, and the closest plan keeps ep (ratio 1.00)."""
    cluster_file = tmp_path / "h100x16.yaml"
    cluster_file.write_text("name: h100x16\nnodes:\n  - {gpu: H100, count: 8, repeat: 2}\n")
    workload_arg = _workload_file(tmp_path, "qwen3-30b-a3b-grpo-sync", gen_precision="fp8")
    workload, cluster = load_workload(workload_arg), load_cluster(str(cluster_file))
    save_plan(colocated_plan(workload, cluster, tp=2, ep=4), tmp_path / "plan.json")
    out = tmp_path / "overrides.yaml"
    code, text, err = run(capsys, "export", "--to", "verl", "-w", workload_arg, "-c",
                          cluster_file, "-p", tmp_path / "plan.json", "--out", out, "--json")
    assert code == 0, err
    report = json.loads(text)
    assert report["ratio"] == pytest.approx(1.0)
    flat = verl.flatten({k: v for k, v in read_mapping(out).items()
                         if k != verl.CUSTOM_SECTION})
    _check_keys(flat, verl_configs, report["config_name"])
    assert flat["actor_rollout_ref.actor.megatron.expert_model_parallel_size"] == 4
    assert flat["actor_rollout_ref.rollout.data_parallel_size"] == 4
    assert flat["actor_rollout_ref.rollout.expert_parallel_size"] == 8
    assert flat["actor_rollout_ref.rollout.quantization"] == "fp8"
    built = _accepted(tmp_path, out, workload)
    assert built["rollout"].expert_parallel_size == 8
    layout = verl.layout_from_overrides(read_mapping(out), workload, cluster)
    assert verl.closest_plan(layout, workload, cluster).placement("actor_training").ep == 4


@pytest.mark.parametrize("to", ["verl", "openrlhf"])
def test_an_export_prices_both_plans_with_the_target_frameworks_costs(capsys, tmp_path, to):
    """A workload written for another framework (here a bare trainer's, no per-step costs) is
    priced, on export, with the per-step costs of the framework that will run it."""
    workload = load_workload("qwen3-4b-ppo-sync").with_(framework="megatron-lm",
                                                       recompute_logprobs=True)
    cluster = load_cluster("a100x8")
    wfile, pfile = tmp_path / "w.yaml", tmp_path / "p.json"
    wfile.write_text(yaml.safe_dump(workload.to_dict()))
    plan = colocated_plan(workload, cluster, tp=2)
    save_plan(plan, pfile)
    code, text, err = run(capsys, "export", "--to", to, "-w", wfile, "-c", "a100x8", "-p",
                          pfile, "--out", tmp_path / "o.txt", "--json")
    assert code == 0, err
    theirs = CostModel(workload.with_(framework=to), cluster).estimate(plan).iteration_s
    ours = CostModel(workload, cluster).estimate(plan).iteration_s
    assert json.loads(text)["iteration_s"]["plan"] == pytest.approx(theirs, rel=1e-9)
    assert theirs > ours  # the framework's calls and loops cost time a bare trainer does not pay


@pytest.mark.parametrize("cluster_name", ["paper64-multi-country", "examples/cluster-fleet.yaml"])
def test_plan_launch_with_verl_exports_as_it_is_and_verl_accepts_it(capsys, tmp_path,
                                                                    verl_configs, cluster_name):
    """Issue 58, item 6: `hetrl plan --launch-with verl` searches only what verl can launch, so
    its plan exports with a closest-plan ratio of 1.00 and verl's config code builds it."""
    w = "examples/workload-llama8b-grpo-rule.yaml"
    plan_file = tmp_path / "plan.json"
    code, text, err = run(capsys, "plan", "-w", w, "-c", cluster_name, "--budget-evals", "400",
                          "--launch-with", "verl", "-o", plan_file, "--json")
    assert code == 0, err
    found = json.loads(text)
    assert found["launch_with"] == "verl" and "launchable" not in found
    # never worse than verl's own placement (its schedulers' plans, as verl launches them)
    own = found["own_plans_compared"]
    assert set(own) == {"verl", "verl-async"}
    assert found["iteration_s"] <= min(v["iteration_s"] for v in own.values())
    code, text, err = run(capsys, "export", "--to", "verl", "-w", w, "-c", cluster_name, "-p",
                          plan_file, "--out", tmp_path / "o.yaml", "--json")
    assert code == 0, err
    report = json.loads(text)
    assert report["ratio"] == 1.0
    assert report["iteration_s"]["plan"] == pytest.approx(found["iteration_s"], rel=1e-12)
    _check_keys(report["overrides"], verl_configs, report["config_name"])
    _accepted(tmp_path, tmp_path / "o.yaml", load_workload(w))


def test_plan_says_how_verl_would_launch_its_best_plan(capsys, tmp_path):
    """Without --launch-with, `hetrl plan` prices its best plan as verl would launch it (the
    export's closest plan, verl's per-step costs) and says how far that is."""
    w, c = "examples/workload-llama8b-grpo-rule.yaml", "examples/cluster-fleet.yaml"
    code, text, err = run(capsys, "plan", "-w", w, "-c", c, "--budget-evals", "300", "-o",
                          tmp_path / "p.json", "--json")
    assert code == 0, err
    rec = json.loads(text)["launchable"]
    assert rec["framework"] == "verl" and rec["why_not"] is None
    plan = load_plan(tmp_path / "p.json", load_workload(w), load_cluster(c))
    closest = verl.closest_plan(verl.verl_layout(plan, load_workload(w), load_cluster(c)),
                                load_workload(w), load_cluster(c))
    est = CostModel(load_workload(w), load_cluster(c)).estimate(closest)
    assert rec["iteration_s"] == pytest.approx(est.iteration_s) and rec["feasible"] == est.feasible
    # beside it, the best plan verl can launch that hetrl knows here: the faster of this plan as
    # verl runs it and verl's own placements, launched
    assert rec["best_launchable_s"] <= rec["iteration_s"]
    assert rec["best_launchable_from"] in ("this plan", "verl's placement",
                                           "verl-async's placement")
    code, text, _ = run(capsys, "plan", "-w", w, "-c", c, "--budget-evals", "300", "-o",
                        tmp_path / "p.json")
    assert "verl would launch it" in text and "--launch-with verl" in text


def test_plan_of_a_workload_verl_cannot_run_suggests_no_launch_search(capsys, tmp_path):
    """A workload verl runs no plan of (a bf16 optimizer): `hetrl plan` says so once, without
    suggesting `--launch-with verl` (which refuses the workload), and --json says
    workload_launchable false."""
    wl = load_workload("examples/workload-llama8b-grpo-rule.yaml").with_(
        optimizer_precision="bf16")
    w = tmp_path / "w.yaml"
    w.write_text(yaml.safe_dump(wl.to_dict()))
    c = "examples/cluster-fleet.yaml"
    code, text, err = run(capsys, "plan", "-w", w, "-c", c, "--budget-evals", "100", "-o",
                          tmp_path / "p.json", "--json")
    assert code == 0, err
    rec = json.loads(text)["launchable"]
    assert rec["workload_launchable"] is False and "optimizer_precision" in rec["why_not"]
    code, text, _ = run(capsys, "plan", "-w", w, "-c", c, "--budget-evals", "100", "-o",
                        tmp_path / "p.json")
    assert "verl runs no plan of this workload" in text and "--launch-with" not in text
    code, _, err = run(capsys, "plan", "-w", w, "-c", c, "--budget-evals", "100", "-o",
                       tmp_path / "q.json", "--launch-with", "verl")
    assert code == 2 and "optimizer_precision" in err
