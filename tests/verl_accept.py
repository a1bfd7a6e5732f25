"""Does verl accept an export? Real verl (``pip install --no-deps verl==0.9.1`` and the config
packages of the ``verl`` extra; no GPU packages) given the exported command line:

1. the config composed as ``main_ppo`` composes it (Hydra, verl's ``trainer/config``, the
   command's overrides) and checked by ``validate_config`` with ``main_ppo``'s arguments;
2. the v1 trainers' start-up checks (trainer_separate_async.py's ``__init__``, which needs
   transfer_queue to import: its asserts are restated here) and the resource pools
   trainer_base.py's ``_init_resource_pool_mgr`` builds, against the export's custom section;
3. the dataclasses the workers build (engine_workers.py ``init_model``: model, actor, reference,
   rollout, checkpoint engine; trainer_base.py: the critic and its engine; reward_model.py: the
   reward model) with verl's own ``omega_conf_to_dataclass``, and the layout arithmetic they
   assert (rollout world sizes, Megatron's tp x pp x cp, the uneven stage split).

The models' Hugging Face ids are checked, then replaced by local directories holding a config
of the same architecture and a tiny tokenizer (no download): ``HFModelConfig`` reads both."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hetrl.spec.model import ModelShape


def fake_model(where: Path, shape: ModelShape, arch: str) -> str:
    """A directory verl's HFModelConfig loads: ``config.json`` of ``shape`` (a Qwen3 or a Llama
    architecture) and a three-token tokenizer."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    where.mkdir(parents=True, exist_ok=True)
    qwen = arch == "qwen3"
    config = {"architectures": ["Qwen3ForCausalLM" if qwen else "LlamaForCausalLM"],
              "model_type": "qwen3" if qwen else "llama", "num_hidden_layers": shape.layers,
              "hidden_size": shape.hidden, "intermediate_size": shape.ffn,
              "num_attention_heads": shape.heads, "num_key_value_heads": shape.kv_heads,
              "head_dim": shape.head_dim, "vocab_size": shape.vocab,
              "tie_word_embeddings": shape.tied_embeddings, "max_position_embeddings": 32768,
              "torch_dtype": "bfloat16"}
    if shape.moe is not None and qwen:  # Qwen3-MoE's config keys
        config.update({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
                       "num_experts": shape.moe.experts,
                       "num_experts_per_tok": shape.moe.top_k,
                       "moe_intermediate_size": shape.moe.expert_ffn,
                       "decoder_sparse_step": shape.moe.layer_freq, "mlp_only_layers": []})
    (where / "config.json").write_text(json.dumps(config))
    vocab = {"<unk>": 0, "<pad>": 1, "</s>": 2}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, "<unk>")),
                                  unk_token="<unk>", pad_token="<pad>", eos_token="</s>")
    tok.save_pretrained(str(where))
    return str(where)


def compose(config_name: str, overrides: list[str]):
    """verl's trainer config as ``main_ppo`` composes it from its command line."""
    import verl
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return hydra_compose(config_name=config_name, overrides=overrides)


def accept(cfg, pools: dict[str, Any], local: dict[str, str], layers: dict[str, int]) -> dict:
    """Run verl's checks on ``cfg`` (composed) and return what they built. ``pools`` is the
    export's custom section, ``local`` maps each exported model path to a local directory,
    ``layers`` each model (actor, critic) to its layer count. Raises where verl would."""
    from omegaconf import OmegaConf, open_dict
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config
    from verl.workers.config import HFModelConfig

    built: dict[str, Any] = {}
    use_ref, use_critic = need_reference_policy(cfg), need_critic(cfg)
    for key in ("actor_rollout_ref.model.path", "critic.model.path",
                "reward.reward_model.model_path"):  # (validate_config builds the critic's)
        value = OmegaConf.select(cfg, key)
        if value is not None and (key != "critic.model.path" or use_critic):
            OmegaConf.update(cfg, key, local[value])
    validate_config(config=cfg, use_reference_policy=use_ref, use_critic=use_critic)  # main_ppo
    built["use_reference_policy"], built["use_critic"] = bool(use_ref), bool(use_critic)
    OmegaConf.resolve(cfg)  # TaskRunnerV1.run
    arr, trainer = cfg.actor_rollout_ref, cfg.trainer
    n_gpus = trainer.nnodes * trainer.n_gpus_per_node
    mode = trainer.v1.trainer_mode
    reward = cfg.reward.reward_model
    if mode == "separate_async":  # trainer_separate_async.PPOTrainerSeparateAsync.__init__
        assert cfg.data.train_batch_size == (trainer.v1.separate_async.parameter_sync_step
                                             * arr.actor.ppo_mini_batch_size)
        assert arr.rollout.nnodes > 0 and arr.rollout.n_gpus_per_node > 0
        assert arr.rollout.checkpoint_engine.backend != "naive"
        if reward.enable:
            assert reward.enable_resource_pool
    # trainer_base._init_resource_pool_mgr
    spec = {"global_pool": [trainer.n_gpus_per_node] * trainer.nnodes}
    if reward.enable_resource_pool:
        assert reward.n_gpus_per_node > 0 and reward.nnodes > 0
        spec["reward_pool"] = [reward.n_gpus_per_node] * reward.nnodes
    if mode == "separate_async":  # the standalone rollout (LLMServerManager.create)
        spec["rollout_pool"] = [arr.rollout.n_gpus_per_node] * arr.rollout.nnodes
    assert spec == dict(pools["resource_pool_spec"]), (spec, pools["resource_pool_spec"])
    if not reward.enable_resource_pool:
        reward.nnodes, reward.n_gpus_per_node = trainer.nnodes, trainer.n_gpus_per_node
    # engine_workers.ActorRolloutRefWorker.init_model
    model = omega_conf_to_dataclass(arr.model)
    built["model"] = model
    if use_ref:
        with open_dict(arr.ref):
            arr.ref.ppo_mini_batch_size = arr.actor.ppo_mini_batch_size
            arr.ref.ppo_micro_batch_size = arr.ref.pop("log_prob_micro_batch_size", None)
            arr.ref.ppo_micro_batch_size_per_gpu = arr.ref.pop(
                "log_prob_micro_batch_size_per_gpu", None)
            arr.ref.use_dynamic_bsz = arr.ref.pop("log_prob_use_dynamic_bsz", False)
            arr.ref.ppo_max_token_len_per_gpu = arr.ref.pop("log_prob_max_token_len_per_gpu",
                                                            None)
        built["ref"] = omega_conf_to_dataclass(arr.ref)
    actor = omega_conf_to_dataclass(arr.actor)
    built["actor"] = actor
    assert arr.actor.use_dynamic_bsz == arr.rollout.log_prob_use_dynamic_bsz
    if arr.actor.use_dynamic_bsz:
        assert arr.rollout.log_prob_max_token_len_per_gpu is not None
        assert arr.actor.ppo_max_token_len_per_gpu is not None
    else:
        assert arr.rollout.log_prob_micro_batch_size_per_gpu is not None
        assert arr.actor.ppo_micro_batch_size_per_gpu is not None
    rollout = omega_conf_to_dataclass(arr.rollout)
    built["rollout"] = rollout
    rollout_gpus = arr.rollout.nnodes * arr.rollout.n_gpus_per_node \
        if mode == "separate_async" else n_gpus
    per_replica = (rollout.tensor_model_parallel_size * rollout.data_parallel_size
                   * rollout.pipeline_model_parallel_size)
    assert rollout_gpus % per_replica == 0, (rollout_gpus, per_replica)
    built["checkpoint_engine"] = omega_conf_to_dataclass(arr.rollout.checkpoint_engine)
    if arr.actor.strategy == "megatron":
        for name, section in (("actor", arr.actor), ("ref", arr.ref), ("critic", cfg.critic)):
            if (name == "ref" and not use_ref) or (name == "critic" and not use_critic):
                continue
            m = section.megatron
            assert n_gpus % (m.tensor_model_parallel_size * m.pipeline_model_parallel_size
                             * m.context_parallel_size) == 0
            _check_stages(m, layers["critic" if name == "critic" else "actor"])
    if use_critic:  # trainer_base.PPOTrainer._setup
        critic = omega_conf_to_dataclass(cfg.critic)
        critic.engine.infer_max_token_len_per_gpu = critic.ppo_infer_max_token_len_per_gpu
        critic.engine.max_token_len_per_gpu = critic.ppo_infer_max_token_len_per_gpu
        built["critic"] = critic
    if reward.enable:  # experimental/reward_loop/reward_model.py
        rm = omega_conf_to_dataclass(reward)
        r = rm.rollout
        size = r.tensor_model_parallel_size * r.data_parallel_size * \
            r.pipeline_model_parallel_size
        world = rm.n_gpus_per_node * rm.nnodes
        assert world // size > 0 and world % size == 0, (world, size)
        built["reward"] = rm
        built["reward_model"] = HFModelConfig(path=rm.model_path)
    return built


def _check_stages(megatron, layers: int) -> None:
    """Megatron's uneven split: the first and last stages as set, the rest equal."""
    pp = megatron.pipeline_model_parallel_size
    over = megatron.override_transformer_config
    first = over.get("num_layers_in_first_pipeline_stage")
    last = over.get("num_layers_in_last_pipeline_stage")
    if first is None and last is None:
        assert layers % pp == 0, f"{layers} layers over pp {pp} need an uneven split"
        return
    rest = layers - (first or 0) - (last or 0)
    middle = pp - (first is not None) - (last is not None)
    assert rest > 0 if middle else rest == 0
    assert middle == 0 or rest % middle == 0, (layers, pp, first, last)


def export_command(out: Path) -> list[str]:
    """The command line written in an export's header, as the shell splits it."""
    import shlex

    lines = out.read_text().splitlines()
    start = lines.index("# The command line:") + 1
    cmd = []
    for line in lines[start:]:
        if not line.startswith("# "):
            break
        cmd.append(line[2:])
    return shlex.split(" ".join(c.removesuffix("\\") for c in cmd))


def accepted_export(tmp_path: Path, out: Path, workload) -> dict:
    """verl's checks (:func:`accept`) on the export in ``out``, from its command line; the
    models' Hugging Face ids replaced by fake local models under ``tmp_path``."""
    from hetrl.export import verl
    from hetrl.export.verl_keys import PATH_KEYS
    from hetrl.io import read_mapping

    data = read_mapping(out)
    argv = export_command(out)
    assert argv[:3] == ["python3", "-m", "verl.trainer.main_ppo"]
    rest = argv[3:]
    name = "ppo_trainer"
    if rest and rest[0].startswith("--config-name="):
        name = rest.pop(0).split("=", 1)[1]
    cfg = compose(name, rest)
    local, layers = {}, {}
    for role, key in PATH_KEYS.items():
        if role in workload.models_by_role:
            shape = workload.model(role)
            path = verl.flatten(data)[key]
            arch = "qwen3" if shape.name.startswith("Qwen3") else "llama"
            local[path] = fake_model(tmp_path / "models" / role, shape, arch)
            layers[role] = shape.layers
    return accept(cfg, data[verl.CUSTOM_SECTION], local, layers)
