"""Workloads: the paper's presets, task graphs, round trip, per-role models, errors."""

from __future__ import annotations

import json

import pytest
import yaml

from hetrl.errors import SpecError
from hetrl.io import load_workload
from hetrl.spec.model import model_preset
from hetrl.spec.presets import WORKLOAD_PRESETS, workload_preset
from hetrl.spec.tasks import tasks_for
from hetrl.spec.workload import WorkloadSpec

PRESET_NAMES = [f"qwen3-{size}-{alg}-{mode}" for size in ("4b", "8b", "14b")
                for alg in ("ppo", "grpo") for mode in ("sync", "async")]


def test_exactly_the_twelve_paper_presets():
    paper = [n for n in WORKLOAD_PRESETS if n.startswith("qwen3-") and "-a3b-" not in n]
    assert sorted(paper) == sorted(PRESET_NAMES)
    assert len(PRESET_NAMES) == 12


def test_the_moe_presets_are_the_papers_settings_with_qwen3_30b_a3b():
    for alg in ("ppo", "grpo"):
        for mode in ("sync", "async"):
            moe = workload_preset(f"qwen3-30b-a3b-{alg}-{mode}")
            dense = workload_preset(f"qwen3-8b-{alg}-{mode}")
            assert moe.model("actor").name == "Qwen3-30B-A3B" and moe.model("actor").moe
            assert moe.with_(models=dense.models, name=dense.name) == dense


def test_tiny_presets_are_the_real_backends_cpu_jobs():
    for name in ("tiny-ppo-sync", "tiny-ppo-async", "tiny-grpo-sync", "tiny-grpo-async"):
        w = workload_preset(name)
        assert w.model("actor").name == "tiny-qwen3" and w.model("actor").params < 1_000_000
        assert w.samples == 32 and w.response_length.max == 16


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_preset_matches_the_paper(name):
    w = workload_preset(name)
    size, alg, mode = name.split("-")[1:]
    assert (w.name, w.algorithm, w.mode) == (name, alg, mode)
    assert w.staleness == (1 if mode == "async" else 0)
    assert (w.batch_prompts, w.responses_per_prompt, w.samples) == (384, 8, 3072)
    assert w.prompt_length.max == w.response_length.max == 1024
    assert (w.prompt_length.mean, w.response_length.mean) == (256, 512)
    actor = model_preset(f"Qwen3-{size.upper()}")
    assert all(shape == actor for _, shape in w.models)
    assert w.model("reference") == w.model("actor")


def test_grpo_has_four_tasks_and_no_critic():
    w = workload_preset("qwen3-8b-grpo-sync")
    assert w.task_names == ("actor_generation", "reward_inference", "reference_inference",
                            "actor_training")
    assert [r for r, _ in w.models] == ["actor", "reference", "reward"]
    assert w.task("actor_training").depends_on == ("reward_inference", "reference_inference")
    with pytest.raises(KeyError):
        w.model("critic")


def test_ppo_has_six_tasks_generation_then_inference_then_training():
    w = workload_preset("qwen3-8b-ppo-sync")
    tasks = {t.name: t for t in w.tasks}
    assert len(tasks) == 6
    assert {n: t.kind for n, t in tasks.items()} == {
        "actor_generation": "generation", "reward_inference": "inference",
        "reference_inference": "inference", "critic_inference": "inference",
        "actor_training": "training", "critic_training": "training"}
    inference = ("reward_inference", "reference_inference", "critic_inference")
    assert tasks["actor_generation"].depends_on == ()
    for name in inference:
        assert tasks[name].depends_on == ("actor_generation",)
    for name in ("actor_training", "critic_training"):
        assert tasks[name].depends_on == inference
    # Every dependency points to an earlier stage.
    for t in tasks.values():
        assert all(tasks[d].stage < t.stage for d in t.depends_on)
    assert tasks["critic_training"].role == "critic"


def test_unknown_task_is_a_spec_error(ppo8b):
    with pytest.raises(SpecError) as err:
        workload_preset("qwen3-8b-grpo-sync").task("critic_training")
    assert err.value.field == "task"
    assert ppo8b.task("critic_training").kind == "training"
    with pytest.raises(ValueError, match="unknown algorithm"):
        tasks_for("dpo")


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_round_trip_exact(name):
    w = workload_preset(name)
    d = w.to_dict()
    assert WorkloadSpec.from_dict(d) == w
    assert WorkloadSpec.from_dict(json.loads(json.dumps(d))) == w
    assert WorkloadSpec.from_dict(yaml.safe_load(yaml.safe_dump(d))) == w
    assert WorkloadSpec.from_dict(d).to_dict() == d


BASE = {"algorithm": "ppo", "batch_prompts": 16, "responses_per_prompt": 4,
        "prompt_length": {"mean": 128, "max": 512, "std": 64},
        "response_length": {"mean": 256, "max": 512, "std": 128}}


def test_model_shorthand_sets_every_role():
    w = WorkloadSpec.from_dict({**BASE, "model": "Qwen3-4B"})
    assert [r for r, _ in w.models] == ["actor", "reference", "reward", "critic"]
    assert {s.name for _, s in w.models} == {"Qwen3-4B"}
    assert (w.name, w.mode, w.staleness) == ("custom", "sync", 0)


def test_per_role_models_with_different_sizes():
    w = WorkloadSpec.from_dict({**BASE, "models": {
        "actor": "Qwen3-8B", "critic": "Qwen3-4B", "reward": "Qwen3-4B"}})
    assert w.model("actor").params == 8_190_726_144
    assert w.model("reference") == w.model("actor")        # defaults to the actor
    assert w.model("critic").name == w.model("reward").name == "Qwen3-4B"
    assert WorkloadSpec.from_dict(w.to_dict()) == w


def test_models_override_the_shorthand():
    w = WorkloadSpec.from_dict({**BASE, "model": "Qwen3-8B", "models": {"critic": "Qwen3-4B"}})
    assert w.model("actor").name == "Qwen3-8B" and w.model("critic").name == "Qwen3-4B"


def test_async_defaults_to_staleness_one_and_fixed_lengths_are_integers():
    w = WorkloadSpec.from_dict({**BASE, "model": "Qwen3-4B", "mode": "async",
                                "prompt_length": 100})
    assert w.staleness == 1
    assert w.prompt_length.kind == "fixed" and w.prompt_length.mean == 100


def test_workload_file_with_hf_config_relative_to_the_file(tmp_path):
    (tmp_path / "critic").mkdir()
    cfg = {"hidden_size": 2560, "intermediate_size": 9728, "num_attention_heads": 32,
           "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 36,
           "vocab_size": 151936, "tie_word_embeddings": True}
    (tmp_path / "critic" / "config.json").write_text(json.dumps(cfg))
    spec = {**BASE, "name": "mine", "models": {"actor": "Qwen3-8B", "reward": "Qwen3-8B",
                                               "critic": {"hf_config": "critic/config.json"}}}
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(spec))
    w = load_workload(path)
    assert w.name == "mine"
    assert w.model("critic").params == model_preset("Qwen3-4B").params


@pytest.mark.parametrize(("change", "field", "problem"), [
    ({"algorithm": "dpo"}, "algorithm", "must be one of ['ppo', 'grpo']"),
    ({"staleness": 2}, "staleness", "must be 0 in sync mode"),
    ({"mode": "async", "staleness": 0}, "staleness", "must be >= 1"),
    ({"mode": "semi"}, "mode", "must be one of"),
    ({"algorithm": "grpo", "models": {"critic": "Qwen3-4B"}}, "models.critic",
     "not a role of grpo"),
    ({"models": {"reference": "Qwen3-4B"}}, "models.reference", "must equal the actor"),
    ({"models": {"judge": "Qwen3-4B"}}, "models.judge", "unknown role"),
    ({"model": "GPT-5"}, "models.actor", "unknown model"),
    ({"batch_prompts": 0}, "batch_prompts", "must be >= 1"),
    ({"responses_per_prompt": 2.5}, "responses_per_prompt", "must be an integer"),
    ({"precision": "int4"}, "precision", "must be one of"),
    ({"optimizer_steps": 10_000}, "optimizer_steps", "must be <= samples per iteration (64)"),
    ({"response_length": {"mean": 600, "max": 512, "std": 10}}, "response_length.mean",
     "must be in [min=1, max=512]"),
    ({"batch": 16}, "batch", "unknown key"),
])
def test_errors_name_the_field(change, field, problem):
    with pytest.raises(SpecError) as err:
        WorkloadSpec.from_dict({**BASE, "model": "Qwen3-8B", **change})
    assert err.value.field == field
    assert problem in str(err.value)


def test_missing_required_key_and_missing_role():
    with pytest.raises(SpecError) as err:
        WorkloadSpec.from_dict({k: v for k, v in BASE.items() if k != "batch_prompts"})
    assert err.value.field == "batch_prompts" and "required" in str(err.value)
    with pytest.raises(SpecError) as err:
        WorkloadSpec.from_dict({**BASE, "models": {"actor": "Qwen3-8B", "reward": "Qwen3-8B"}})
    assert err.value.field == "models.critic" and "required for ppo" in str(err.value)


def test_with_revalidates(ppo8b):
    assert ppo8b.with_(batch_prompts=64).samples == 512
    with pytest.raises(SpecError, match="staleness"):
        ppo8b.with_(staleness=3)


def test_a_rule_reward_has_no_reward_model_and_no_reward_task():
    data = {"algorithm": "grpo", "reward": "rule", "model": "Qwen3-8B", "batch_prompts": 8,
            "responses_per_prompt": 4, "prompt_length": 64, "response_length": 64}
    wl = WorkloadSpec.from_dict(data)
    # (a workload file: the actor's log-probs are recomputed unless it says otherwise)
    assert wl.task_names == ("actor_generation", "reference_inference", "actor_inference",
                             "actor_training")
    assert [r for r, _ in wl.models] == ["actor", "reference"]
    assert wl.task("actor_training").depends_on == ("reference_inference", "actor_inference")
    assert WorkloadSpec.from_dict(wl.to_dict()) == wl
    ppo = WorkloadSpec.from_dict({**data, "algorithm": "ppo"})
    assert "reward_inference" not in ppo.task_names and "critic_inference" in ppo.task_names
    # the default is a reward model, as in the paper's jobs
    assert "reward_inference" in WorkloadSpec.from_dict({**data, "reward": "model"}).task_names
    with pytest.raises(SpecError) as err:
        WorkloadSpec.from_dict({**{k: v for k, v in data.items() if k != "model"},
                                "models": {"actor": "Qwen3-8B", "reward": "Qwen3-8B"}})
    assert err.value.field == "models.reward" and "reward: rule" in str(err.value)
    with pytest.raises(SpecError) as err:
        WorkloadSpec.from_dict({**data, "reward": "llm-judge"})
    assert err.value.field == "reward" and "['model', 'rule']" in str(err.value)


def test_recompute_logprobs_defaults_by_file_version():
    """A workload file without the key gets the actor's log-prob recomputation (what verl and
    NeMo-RL run); a version-1 file keeps the task set it was written with; the paper's presets
    keep the paper's tasks."""
    from hetrl.spec.presets import workload_preset

    base = workload_preset("qwen3-4b-grpo-sync").to_dict()
    assert base["recompute_logprobs"] is False
    del base["recompute_logprobs"]
    v2 = WorkloadSpec.from_dict({**base, "schema_version": 2})
    assert v2.recompute_logprobs and "actor_inference" in v2.task_names
    assert v2.task("actor_training").depends_on[-1] == "actor_inference"
    v1 = WorkloadSpec.from_dict({**base, "schema_version": 1})
    assert not v1.recompute_logprobs and "actor_inference" not in v1.task_names
    with pytest.raises(SpecError, match="recompute_logprobs"):
        WorkloadSpec.from_dict({**base, "schema_version": 1, "recompute_logprobs": True})
    with pytest.raises(SpecError, match="recompute_logprobs"):
        WorkloadSpec.from_dict({**base, "recompute_logprobs": "yes"})


def test_kl_none_has_no_reference_model_and_no_reference_task():
    """DAPO and GPG run no KL term: ``kl: none`` drops the reference model and its forward."""
    data = {"algorithm": "grpo", "reward": "rule", "kl": "none", "model": "Qwen3-8B",
            "batch_prompts": 8, "responses_per_prompt": 4, "prompt_length": 64,
            "response_length": 64}
    wl = WorkloadSpec.from_dict(yaml.safe_load(yaml.safe_dump(data)))  # "none" stays a string
    assert wl.kl == "none"
    assert wl.task_names == ("actor_generation", "actor_inference", "actor_training")
    assert [r for r, _ in wl.models] == ["actor"]
    assert wl.task("actor_training").depends_on == ("actor_inference",)
    assert WorkloadSpec.from_dict(wl.to_dict()) == wl
    ppo = WorkloadSpec.from_dict({**data, "algorithm": "ppo"})
    assert "reference_inference" not in ppo.task_names and "critic_training" in ppo.task_names
    # the KL in the loss or in the reward costs one reference forward either way
    for kl in ("loss", "reward"):
        assert "reference_inference" in WorkloadSpec.from_dict({**data, "kl": kl}).task_names
    assert WorkloadSpec.from_dict({k: v for k, v in data.items() if k != "kl"}).kl == "loss"
    with pytest.raises(SpecError) as err:
        WorkloadSpec.from_dict({**{k: v for k, v in data.items() if k != "model"},
                                "models": {"actor": "Qwen3-8B", "reference": "Qwen3-8B"}})
    assert err.value.field == "models.reference" and "kl: none" in str(err.value)
    with pytest.raises(SpecError) as err:
        WorkloadSpec.from_dict({**data, "kl": "off"})
    assert err.value.field == "kl" and "['loss', 'reward', 'none']" in str(err.value)
