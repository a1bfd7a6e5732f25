"""verl's config keys for a placement (:class:`hetrl.export.verl.VerlLayout`) and a workload,
and the file and command line that carry them.

Every value is quoted where it is written: ``shlex.quote`` for the shell, Hydra's quoting for an
override's value and OmegaConf's ``\\${`` for an interpolation; the keys verl's generated config
lacks (:func:`is_new_key`) go on the command line with Hydra's ``++`` (add or override)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from typing import Any

from hetrl.errors import SpecError
from hetrl.export.safe import text
from hetrl.spec.model import hf_id
from hetrl.spec.workload import WorkloadSpec

CUSTOM_SECTION = "hetrl_resource_pools"
CONFIG_NAMES = {"fsdp": "ppo_trainer", "megatron": "ppo_megatron_trainer"}
#: vLLM's share of a GPU when the workload leaves it open (``gen_gpu_memory_utilization: null``):
#: verl's default when the rollout shares GPUs with training, vLLM's own on a standalone pool.
DEFAULT_GPU_MEMORY_UTILIZATION = {"hybrid": 0.5, "standalone": 0.9}
#: The roles verl loads a model for (the reference is the actor's model: actor_rollout_ref).
PATH_ROLES = ("actor", "critic", "reward")
#: Where verl reads each role's model.
PATH_KEYS = {"actor": "actor_rollout_ref.model.path", "critic": "critic.model.path",
             "reward": "reward.reward_model.model_path"}
#: The models verl may train or score with Megatron, and the prefix of their config keys.
MEGATRON_MODELS = (("actor", "actor_rollout_ref.actor"), ("ref", "actor_rollout_ref.ref"),
                   ("critic", "critic"))
_STAGE_KEYS = (".override_transformer_config.num_layers_in_first_pipeline_stage",
               ".override_transformer_config.num_layers_in_last_pipeline_stage")
#: FP8 keys inside free-form mappings of verl's YAML (Megatron's TransformerConfig overrides,
#: vLLM's engine arguments)
_FP8_KEYS = (".override_transformer_config.fp8", "rollout.engine_kwargs.vllm.kv_cache_dtype")
_CRITIC_ENGINE = ("use_dynamic_bsz", "micro_batch_size_per_gpu", "infer_micro_batch_size_per_gpu")


def is_new_key(key: str) -> bool:
    """Whether ``key`` is a field of verl's config dataclasses that its generated YAML lacks
    (Hydra then needs ``++key=value``; the tests check both ways against verl's YAML)."""
    return key.endswith(_STAGE_KEYS) or key == "critic.ppo_infer_max_token_len_per_gpu" or any(
        key == f"critic.{s}.{f}" for s in ("fsdp", "megatron") for f in _CRITIC_ENGINE) or \
        key.endswith(_FP8_KEYS)


def model_paths(workload: WorkloadSpec, given: Mapping[str, str]) -> dict[str, str]:
    """Each loaded role's model path: ``given`` (``--model-path ROLE=PATH``) first, else the
    built-in model's Hugging Face id; SpecError for a role with neither, or an unknown role."""
    roles = [r for r in PATH_ROLES if r in workload.models_by_role]
    for role, path in given.items():
        if role not in roles:
            why = ("verl loads the reference from the actor's path (actor_rollout_ref.model)"
                   if role == "reference" else f"the workload's roles with a model: {roles}")
            raise SpecError(f"--model-path {role}", path, why)
        text(f"--model-path {role}", path)
    out = {}
    for role in roles:
        name = workload.model(role).name
        path = given.get(role) or hf_id(name)
        if not path:
            raise SpecError(f"models.{role}", name, "not a built-in model with a Hugging Face "
                            f"id: give its path with --model-path {role}=PATH (verl loads it "
                            f"from {PATH_KEYS[role]})")
        out[role] = path
    return out


def _longest(wl: WorkloadSpec) -> int:
    return wl.prompt_length.max + wl.response_length.max


def token_budgets(wl: WorkloadSpec) -> tuple[int, int] | None:
    """(training, inference) tokens per GPU when either batches by tokens (verl asserts
    ``actor.use_dynamic_bsz == rollout.log_prob_use_dynamic_bsz``, so both then do; the other
    budget is its count x the longest sequence); None when both batch by count."""
    if wl.micro_batch_tokens is None and wl.inference_micro_batch_tokens is None:
        return None
    return (wl.micro_batch_tokens or wl.micro_batch_size * _longest(wl),
            wl.inference_micro_batch_tokens or wl.inference_micro_batch_size * _longest(wl))


def stage_ends(layout, model: str) -> tuple[int, int] | None:
    """The layers of ``model``'s first and last pipeline stages where its split is uneven
    (Megatron's num_layers_in_first/last_pipeline_stage), else None."""
    stages = layout.stages.get(model)
    return (stages[0], stages[-1]) if stages and len(set(stages)) > 1 else None


def ref_stage_override(layout) -> tuple[int | None, int | None] | None:
    """The stage ends the export writes for the reference (None: none, it inherits the
    actor's): verl's reference takes the actor's override_transformer_config
    (ref/megatron_ref.yaml) unless it sets its own, so a Megatron reference writes its uneven
    split, or (None, None) for its even one where the actor's split is uneven."""
    if layout.strategy != "megatron" or "ref" not in layout.layouts:
        return None
    own = stage_ends(layout, "ref")
    if own is not None:
        return own
    return (None, None) if stage_ends(layout, "actor") is not None else None


def check_workload(workload: WorkloadSpec) -> None:
    """Refuse (SpecError) a workload verl runs with no plan: ppo_mini_batch_size is a whole
    number of prompts, so optimizer_steps must divide batch_prompts; and selective
    recomputation and a bf16 optimizer, which the export has no setting for."""
    task = workload.selective_recompute_task()
    if task is not None:
        raise SpecError("recompute", "selective",
                        f"verl 0.9.1 has no op-level selective checkpointing for {task} "
                        "(enable_gradient_checkpointing is full recomputation; Megatron's "
                        "selective granularity recomputes the attention core only): write true "
                        "or false")
    if workload.optimizer_precision != "fp32":
        raise SpecError("optimizer_precision", workload.optimizer_precision,
                        "the verl export trains with fp32 master weights and Adam states "
                        "(Megatron's distributed optimizer; FSDP with fsdp_config.model_dtype "
                        "fp32, verl's default): write fp32")
    if workload.batch_prompts % workload.optimizer_steps:
        raise SpecError("optimizer_steps", workload.optimizer_steps,
                        f"must divide batch_prompts ({workload.batch_prompts}): verl's "
                        "ppo_mini_batch_size is a whole number of prompts")


def check_batches(layout, workload: WorkloadSpec) -> None:
    """Refuse (SpecError) a layout whose batch verl 0.9.1 cannot split: ``validate_config``
    asserts that data.train_batch_size x rollout.n is divisible by the actor's data-parallel
    size x ppo_micro_batch_size_per_gpu (Megatron; FSDP: by the pool's GPUs) unless batches
    go by tokens; its workers split each mini-batch (ppo_mini_batch_size x rollout.n) evenly
    over a trainer's data-parallel ranks (engine_workers.py asserts it)."""
    wl = workload
    n = len(layout.pool("global_pool").devices)
    samples = wl.batch_prompts * wl.responses_per_prompt
    mini = wl.batch_prompts // wl.optimizer_steps * wl.responses_per_prompt
    for model in ("actor", "critic"):
        if model not in layout.layouts:
            continue
        tp, pp = layout.layouts[model]
        dp = n // (tp * pp)
        if model == "actor" and token_budgets(wl) is None:
            minimal = dp * wl.micro_batch_size if layout.strategy == "megatron" else n
            if samples % minimal:
                raise SpecError("verl global_pool", f"{n} GPUs",
                                f"verl asserts data.train_batch_size x rollout.n ({samples}) "
                                f"divisible by the actor's data-parallel size x "
                                f"ppo_micro_batch_size_per_gpu ({minimal}; "
                                "verl/utils/config.py validate_config)")
        if mini % dp:
            raise SpecError("verl global_pool", f"{n} GPUs",
                            f"verl splits each mini-batch (ppo_mini_batch_size x rollout.n = "
                            f"{mini}) evenly over the {model}'s {dp} data-parallel ranks")


def overrides(layout, workload: WorkloadSpec, paths: Mapping[str, str]) -> dict[str, Any]:
    """verl's config keys (dotted) and values for ``layout``, ``workload`` and the model
    ``paths`` (:func:`model_paths`)."""
    wl = workload
    g = layout.pool("global_pool")
    budgets = token_budgets(wl)
    out: dict[str, Any] = {
        "algorithm.adv_estimator": "gae" if wl.algorithm == "ppo" else "grpo",
        "algorithm.use_kl_in_reward": wl.kl == "reward",
        "data.train_batch_size": wl.batch_prompts,
        "data.max_prompt_length": wl.prompt_length.max,
        "data.max_response_length": wl.response_length.max,
        "trainer.nnodes": len(g.nodes),
        "trainer.n_gpus_per_node": g.gpus_per_node,
        "actor_rollout_ref.model.path": paths["actor"],
        "actor_rollout_ref.actor.strategy": layout.strategy,
        "actor_rollout_ref.actor.use_kl_loss": wl.kl == "loss",
        "actor_rollout_ref.actor.ppo_mini_batch_size": wl.batch_prompts // wl.optimizer_steps,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": wl.micro_batch_size,
        "actor_rollout_ref.actor.use_dynamic_bsz": budgets is not None,
        "actor_rollout_ref.model.use_remove_padding": wl.remove_padding,
        "actor_rollout_ref.model.enable_gradient_checkpointing":
            wl.task_recompute("actor_training"),
        "actor_rollout_ref.rollout.name": "vllm",
        "actor_rollout_ref.rollout.n": wl.responses_per_prompt,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": layout.layouts["rollout"][0],
        "actor_rollout_ref.rollout.pipeline_model_parallel_size": layout.layouts["rollout"][1],
        "actor_rollout_ref.rollout.max_num_seqs": wl.gen_max_concurrency,
        "actor_rollout_ref.rollout.enforce_eager": not wl.gen_cuda_graphs,
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu":
            wl.inference_micro_batch_size,
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz": budgets is not None,
    }
    if "ref" in layout.layouts:
        out["actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"] = \
            wl.inference_micro_batch_size
        out["actor_rollout_ref.ref.log_prob_use_dynamic_bsz"] = budgets is not None
    if budgets is not None:
        out["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"] = budgets[0]
        out["actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu"] = budgets[1]
        if "ref" in layout.layouts:
            out["actor_rollout_ref.ref.log_prob_max_token_len_per_gpu"] = budgets[1]
    standalone = layout.rollout_pool == "rollout_pool"
    util = wl.gen_gpu_memory_utilization
    out["actor_rollout_ref.rollout.gpu_memory_utilization"] = util if util is not None else \
        DEFAULT_GPU_MEMORY_UTILIZATION["standalone" if standalone else "hybrid"]
    if wl.mode == "sync":
        out["trainer.v1.trainer_mode"] = "sync"
    elif standalone:
        r = layout.pool("rollout_pool")
        out.update({"trainer.v1.trainer_mode": "separate_async",
                    "trainer.v1.separate_async.parameter_sync_step": wl.optimizer_steps,
                    "actor_rollout_ref.hybrid_engine": False,
                    "actor_rollout_ref.rollout.nnodes": len(r.nodes),
                    "actor_rollout_ref.rollout.n_gpus_per_node": r.gpus_per_node,
                    "actor_rollout_ref.rollout.checkpoint_engine.backend": "nccl"})
    else:
        out["trainer.v1.trainer_mode"] = "colocate_async"
    if layout.strategy == "megatron":
        for model, prefix in MEGATRON_MODELS:
            if model in layout.layouts:
                tp, pp = layout.layouts[model]
                out[f"{prefix}.megatron.tensor_model_parallel_size"] = tp
                out[f"{prefix}.megatron.pipeline_model_parallel_size"] = pp
                if not wl.sequence_parallel:  # (verl's default is on)
                    out[f"{prefix}.megatron.sequence_parallel"] = False
                ends = ref_stage_override(layout) if model == "ref" else \
                    stage_ends(layout, model)
                if ends is not None:
                    out[f"{prefix}.megatron{_STAGE_KEYS[0]}"] = ends[0]
                    out[f"{prefix}.megatron{_STAGE_KEYS[1]}"] = ends[1]
    out.update(_experts_and_fp8(layout, wl))
    if "critic" in layout.layouts:
        out.update(_critic(layout.strategy, wl, budgets, paths["critic"]))
    if layout.reward_pool is not None:
        out["reward.reward_model.enable"] = True
        out["reward.reward_model.model_path"] = paths["reward"]
        out["reward.reward_model.rollout.name"] = "vllm"
        out["reward.reward_model.rollout.tensor_model_parallel_size"] = layout.layouts["reward"][0]
        out["reward.reward_model.rollout.pipeline_model_parallel_size"] = \
            layout.layouts["reward"][1]
        out["reward.reward_model.enable_resource_pool"] = layout.reward_pool == "reward_pool"
        if layout.reward_pool == "reward_pool":
            rp = layout.pool("reward_pool")
            out["reward.reward_model.nnodes"] = len(rp.nodes)
            out["reward.reward_model.n_gpus_per_node"] = rp.gpus_per_node
    return out


def _experts_and_fp8(layout, wl: WorkloadSpec) -> dict[str, Any]:
    """Mixture of experts and FP8: Megatron's ``expert_model_parallel_size`` per model; a vLLM
    model's expert parallelism as ``data_parallel_size`` ep with ``expert_parallel_size`` tp x ep
    (verl's RolloutConfig requires that product); FP8 rollouts as vLLM's ``quantization: fp8``
    with an FP8 KV cache (``engine_kwargs.vllm.kv_cache_dtype``); Megatron's FP8 recipe as
    ``override_transformer_config.fp8: hybrid`` (e4m3 forward, e5m2 gradients)."""
    out: dict[str, Any] = {}
    expert = layout.expert
    for model, prefix in MEGATRON_MODELS:
        if model in expert and layout.strategy == "megatron":
            out[f"{prefix}.megatron.expert_model_parallel_size"] = expert[model]
    for model, prefix in (("rollout", "actor_rollout_ref.rollout"),
                          ("reward", "reward.reward_model.rollout")):
        if model in expert:
            out[f"{prefix}.data_parallel_size"] = expert[model]
            out[f"{prefix}.expert_parallel_size"] = layout.layouts[model][0] * expert[model]
    if wl.gen_fp8:
        out["actor_rollout_ref.rollout.quantization"] = "fp8"
        out["actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_dtype"] = "fp8"
    if wl.train_fp8 and layout.strategy == "megatron":
        for model, prefix in MEGATRON_MODELS:
            if model in layout.layouts:
                out[f"{prefix}.megatron.override_transformer_config.fp8"] = "hybrid"
    return out


def _critic(strategy: str, wl: WorkloadSpec, budgets: tuple[int, int] | None,
            path: str) -> dict[str, Any]:
    """The critic's keys. verl's v1 trainer builds the critic's engine from ``critic.<strategy>``
    (trainer_base.py: ``use_dynamic_bsz`` True unless set, both token budgets
    ``ppo_infer_max_token_len_per_gpu``), not from ``critic.ppo_micro_batch_size_per_gpu``,
    which only its validation reads: the engine keys are what batch the critic."""
    out: dict[str, Any] = {
        "critic.strategy": strategy,
        "critic.model.path": path,
        "critic.ppo_micro_batch_size_per_gpu": wl.micro_batch_size,
        "critic.use_dynamic_bsz": budgets is not None,
        "critic.model.use_remove_padding": wl.remove_padding,
        "critic.model.enable_gradient_checkpointing": wl.task_recompute("critic_training"),
    }
    if strategy == "fsdp":
        out["critic.forward_micro_batch_size_per_gpu"] = wl.inference_micro_batch_size
    if budgets is not None:
        out["critic.ppo_max_token_len_per_gpu"] = budgets[0]
        out["critic.ppo_infer_max_token_len_per_gpu"] = budgets[0]
    else:
        engine = f"critic.{strategy}"
        out[f"{engine}.use_dynamic_bsz"] = False
        out[f"{engine}.micro_batch_size_per_gpu"] = wl.micro_batch_size
        out[f"{engine}.infer_micro_batch_size_per_gpu"] = wl.inference_micro_batch_size
    return out


def nested(flat: Mapping[str, Any]) -> dict[str, Any]:
    """Dotted keys as nested mappings."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        node = out
        *path, last = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return out


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys (lists are values)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out


def _omegaconf_literal(value: str) -> str:
    """``value`` with OmegaConf's interpolation escaped: ``${`` reads back as itself (and the
    backslashes before it, doubled, as themselves)."""
    return re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + "\\${", value)


def hydra_value(value: Any) -> str:
    """``value`` in Hydra's override grammar: a string single-quoted (a quote, and the
    backslashes before a quote or at the end, escaped) so that no character is grammar;
    numbers and booleans bare."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return repr(value)
    s = _omegaconf_literal(text("value", value))
    return "'" + re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""),
                        s) + "'"


def command_args(flat: Mapping[str, Any]) -> list[str]:
    """The overrides as Hydra arguments (``++`` for :func:`is_new_key`), one a string, unquoted
    for the shell."""
    return [f"{'++' if is_new_key(k) else ''}{k}={hydra_value(v)}" for k, v in flat.items()]


def command_line(flat: Mapping[str, Any], strategy: str) -> str:
    """The verl command a user would type: its entry point and every override, each quoted for a
    POSIX shell."""
    args = " \\\n    ".join(shlex.quote(a) for a in command_args(flat))
    name = CONFIG_NAMES[strategy]
    config = f" --config-name={name}" if name != "ppo_trainer" else ""
    return f"python3 -m verl.trainer.main_ppo{config} \\\n    {args}"


def render(flat: Mapping[str, Any], pools: Mapping[str, Any], header: list[str]) -> str:
    """The overrides file: a comment block, verl's keys nested, then the custom section."""
    import yaml

    for line in header:
        text("header", line)
    lines = [f"# {line}" if line else "#" for line in header]
    literal = {k: _omegaconf_literal(v) if isinstance(v, str) else v for k, v in flat.items()}
    body = yaml.safe_dump(nested(literal), sort_keys=False)
    custom = yaml.safe_dump({CUSTOM_SECTION: dict(pools)}, sort_keys=False,
                            default_flow_style=None)
    note = ["", f"# {CUSTOM_SECTION}: NOT a verl key (verl does not read it). verl's trainer "
            "builds", "# ResourcePoolManager(resource_pool_spec, mapping) in code from the keys "
            "above;", "# this section writes those arguments out, and the nodes and devices each "
            "pool", "# should hold (Ray places pools itself: `hetrl export --launcher` writes an "
            "entry", "# point that pins them). `hetrl export` reads it back to rebuild the "
            "closest plan."]
    return "\n".join(lines) + "\n" + body + "\n".join(note) + "\n" + custom
