"""WorkloadSpec: one RL post-training job (algorithm, models per role, batch, lengths)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from hetrl.errors import SpecError, integer, is_int, is_number, one_of, positive_int, require
from hetrl.limits import MAX_BATCH_PROMPTS, MAX_BATCH_TOKENS, MAX_RESPONSES_PER_PROMPT, MAX_SAMPLES
from hetrl.spec.lengths import LengthDist
from hetrl.spec.model import ModelShape, resolve_model
from hetrl.spec.task_batching import (
    TaskBatching,
    check_recompute,
    parse_task_batching,
    recompute_mode,
)
from hetrl.spec.tasks import ALGORITHMS, KL_MODES, REWARDS, TaskInfo, roles_for, tasks_for

MODES = ("sync", "async")
#: Bytes per stored weight value of each precision. ``fp8`` is Megatron's FP8 recipe for
#: training and inference tasks (FP8 matmuls, BF16 weights kept: 2 bytes) and, for generation,
#: FP8 weights and KV cache (1 byte, :attr:`WorkloadSpec.gen_fp8`).
PRECISIONS = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 2}
OPTIMIZERS = ("adam", "adamw")
#: The precisions an optimizer keeps its states in (hetrl.cost.params.OPTIMIZER_PRECISIONS).
OPTIMIZER_PRECISIONS = ("fp32", "bf16")
#: What a padded micro-batch pads its sequences to (``remove_padding: false``).
PAD_TO = ("longest", "max")
#: Version 2 added ``recompute_logprobs`` and ``backends``; a version-1 file (or trace) that
#: omits them means what it was written with: no recomputation, Megatron layouts only.
SCHEMA_VERSION = 2
#: Training backends a workload may let the search use (hetrl.plan.BACKENDS).
SEARCH_BACKENDS = ("megatron", "fsdp")
READABLE_VERSIONS = (1, 2)
#: The RL frameworks whose per-step costs a workload may pay (hetrl.cost.profiles): ``none`` and
#: ``megatron-lm`` have no RL controller (a standalone engine or trainer, a bare training run).
FRAMEWORKS = ("verl", "openrlhf", "deepspeed-chat", "nemo-aligner", "nemo-rl", "areal",
              "megatron-lm", "none")


@dataclass(frozen=True)
class WorkloadSpec:
    """An RL job.

    ``models`` holds (role, shape) pairs for the roles the algorithm uses; use :meth:`model`.
    ``batch_prompts`` prompts per iteration, each answered ``responses_per_prompt`` times.
    Lengths are in tokens. ``micro_batch_size`` is sequences per training micro-batch and
    ``inference_micro_batch_size`` sequences per inference forward; ``micro_batch_tokens`` and
    ``inference_micro_batch_tokens`` (optional) batch by a token budget instead, ignoring the
    count (verl ``use_dynamic_bsz``: ``ppo_max_token_len_per_gpu``,
    ``log_prob_max_token_len_per_gpu``). ``remove_padding`` (verl ``use_remove_padding``): only
    real tokens cost; false pads every sequence of a micro-batch to ``pad_to``: its longest
    ("longest") or the longest possible, prompt max + response max ("max", verl's static
    padding). ``gen_max_concurrency`` caps the sequences a generation replica decodes at once
    (vLLM ``max_num_seqs``).
    ``optimizer_steps`` is PPO mini-batches (optimizer updates) per iteration.
    ``staleness`` is the async bound k (generation may run k iterations ahead); 0 in sync mode.
    ``reward`` is "model" (a reward model scores the responses: ``reward_inference``) or "rule"
    (an answer checker on the CPU, priced as negligible: no reward model, no such task).
    ``gen_sleep_level``: how a co-located rollout engine sleeps between rollouts (vLLM sleep
    mode): 1 offloads its weights to host memory (and back), 2 discards them (the weight sync
    reloads them); either frees the KV cache and keeps the CUDA graphs. 0: no sleep mode (verl's
    ``free_cache_engine`` before vLLM had one): the weights stay on the GPU, the KV cache is
    freed and rebuilt, and the CUDA graphs (``gen_cuda_graphs``) are captured again.
    ``kl`` says where the KL to the reference enters (hetrl.spec.tasks.KL_MODES): "loss" (the
    default) or "reward" price a reference model and its forward (``reference_inference``);
    "none" (DAPO, GPG) has neither.
    ``task_batching``: (task, :class:`~hetrl.spec.task_batching.TaskBatching`) pairs that
    override the micro-batching and padding above for one task each (verl sets every role's
    micro-batch and ``use_remove_padding`` apart).
    ``recompute_logprobs`` adds the actor's forward pass that recomputes the rollouts' old
    log-probs (task ``actor_inference``, placed in actor_training's group), as verl, NeMo-RL and
    OpenRLHF run it. Workload files default it to true; this constructor and the paper's presets
    to false (the paper's task set).
    ``backends``: the training backends the search may give training and inference tasks
    (``megatron`` always; ``fsdp`` adds ZeRO-3 layouts). Workload files default to both; this
    constructor and the paper's presets to Megatron's alone (the paper's search space).
    The rollout engine as configured: ``gen_cuda_graphs`` (vLLM's default; false: an eager
    engine, ``enforce_eager``) and ``gen_gpu_memory_utilization`` (vLLM's share of each GPU for
    its weights and KV pool; null: the pool takes what other tasks leave).
    Megatron training as configured: ``overlap_grad_reduce`` (Megatron's
    ``--overlap-grad-reduce``: each stage's gradient reduce-scatter and parameter all-gather
    start during its last micro-batch's backward) and ``tp_comm_overlap`` (``--tp-comm-overlap``:
    tensor-parallel collectives pipelined with the GEMMs). Both default to false, Megatron's
    defaults; an FSDP placement always overlaps its gathers (docs/cost-model.md).
    ``sequence_parallel`` (Megatron's ``--sequence-parallel``, on in verl's Megatron workers):
    with tensor parallelism, the norms' and dropouts' activations are split over the tp ranks
    too; false keeps them whole on every rank (Korthikanti et al. 2022).
    ``precision``: the models' precision; ``fp8`` runs training and inference tasks with
    Megatron's FP8 recipe (FP8 matmuls at the GPU's FP8 peak, BF16 master weights) and the
    rollout in FP8 too. ``gen_precision``: the rollout's alone (null: ``precision``'s); ``fp8``
    holds its weights and KV cache in one byte (vLLM ``quantization: fp8``,
    ``kv_cache_dtype: fp8``) and runs its matmuls at the FP8 peak. FP8 needs a GPU type with
    FP8 tensor cores (``fp8_tflops`` in the GPU table).
    ``optimizer_precision``: what the trained models' optimizer keeps per parameter: ``fp32``
    (mixed precision: fp32 gradients, master weights and Adam states, as Megatron, DeepSpeed and
    verl train) or ``bf16`` (the bf16 weights stepped in place, bf16 gradients and Adam states,
    no master copy, as torch.optim.Adam over a bf16 model does).
    ``framework``: the RL framework that runs the job (:data:`FRAMEWORKS`), whose per-step
    costs (its controller's calls, the batch its driver moves, its per-micro-batch loop) the
    estimate charges: its profile in hetrl.cost.profiles (default ``verl``).
    """

    name: str
    algorithm: str
    mode: str
    models: tuple[tuple[str, ModelShape], ...]
    batch_prompts: int
    responses_per_prompt: int
    prompt_length: LengthDist
    response_length: LengthDist
    staleness: int = 0
    precision: str = "bf16"
    optimizer: str = "adam"
    optimizer_precision: str = "fp32"
    micro_batch_size: int = 4
    inference_micro_batch_size: int = 16
    micro_batch_tokens: int | None = None
    inference_micro_batch_tokens: int | None = None
    remove_padding: bool = True
    pad_to: str = "longest"
    gen_max_concurrency: int = 256
    optimizer_steps: int = 1
    recompute: bool | str = False
    reward: str = "model"
    recompute_logprobs: bool = False
    backends: tuple[str, ...] = ("megatron",)
    gen_cuda_graphs: bool = True
    gen_gpu_memory_utilization: float | None = None
    overlap_grad_reduce: bool = False
    tp_comm_overlap: bool = False
    sequence_parallel: bool = True
    kl: str = "loss"
    gen_sleep_level: int = 1
    task_batching: tuple[tuple[str, TaskBatching], ...] = ()
    gen_precision: str | None = None
    framework: str = "verl"
    schema_version: int = field(default=SCHEMA_VERSION)

    def __post_init__(self) -> None:
        require(isinstance(self.name, str) and self.name != "", "name", self.name,
                "must be a non-empty string")
        if self.gen_gpu_memory_utilization is not None:
            u = self.gen_gpu_memory_utilization
            require(is_number(u) and 0 < u <= 1,
                    "gen_gpu_memory_utilization", u,
                    "must be a fraction in (0, 1] (vLLM gpu_memory_utilization) or null")
        require(isinstance(self.backends, tuple) and all(isinstance(b, str) for b in self.backends)
                and "megatron" in self.backends
                and set(self.backends) <= set(SEARCH_BACKENDS)
                and len(set(self.backends)) == len(self.backends), "backends",
                list(self.backends) if isinstance(self.backends, tuple) else self.backends,
                f"must list megatron and optionally fsdp, each once (of {list(SEARCH_BACKENDS)})")
        check_recompute("recompute", self.recompute)
        for key in ("recompute_logprobs", "gen_cuda_graphs", "overlap_grad_reduce",
                    "tp_comm_overlap", "sequence_parallel"):
            require(isinstance(getattr(self, key), bool), key, getattr(self, key),
                    "must be true or false (a YAML boolean, not a string)")
        one_of("algorithm", self.algorithm, ALGORITHMS)
        one_of("mode", self.mode, MODES)
        integer("staleness", self.staleness)
        if self.mode == "sync":
            require(self.staleness == 0, "staleness", self.staleness, "must be 0 in sync mode")
        else:
            positive_int("staleness", self.staleness)
            require(self.staleness <= 64, "staleness", self.staleness, "must be <= 64")
        one_of("reward", self.reward, REWARDS)
        one_of("kl", self.kl, KL_MODES)
        one_of("framework", self.framework, FRAMEWORKS)
        require(self.gen_sleep_level in (0, 1, 2) and not isinstance(self.gen_sleep_level, bool),
                "gen_sleep_level", self.gen_sleep_level,
                "must be 1 (weights to host memory) or 2 (weights discarded), vLLM's sleep "
                "levels, or 0 (no sleep mode: the engine restarts cold)")
        for key in ("precision", "optimizer", "optimizer_precision", "pad_to"):
            require(isinstance(getattr(self, key), str), key, getattr(self, key),
                    "must be a string")
        require(isinstance(self.prompt_length, LengthDist), "prompt_length", self.prompt_length,
                "must be a length distribution")
        require(isinstance(self.response_length, LengthDist), "response_length",
                self.response_length, "must be a length distribution")
        roles = [r for r, _ in self.models]
        need = roles_for(self.algorithm, self.reward, self.kl)
        for role in need:
            require(role in roles, f"models.{role}", None, f"is required for {self.algorithm}")
        for role in roles:
            if role == "reward" and self.reward == "rule":
                raise SpecError("models.reward", role,
                                "is not used with reward: rule (the rule scores the responses)")
            if role == "reference" and self.kl == "none":
                raise SpecError("models.reference", role,
                                "is not used with kl: none (no KL, so no reference model)")
            require(role in need, f"models.{role}", role,
                    f"is not a role of {self.algorithm}; roles: {list(need)}")
        require(len(set(roles)) == len(roles), "models", roles, "each role at most once")
        if self.kl != "none":
            require(self.models_by_role["reference"] == self.models_by_role["actor"],
                    "models.reference", self.models_by_role["reference"].name,
                    f"must equal the actor's shape ({self.models_by_role['actor'].name}): "
                    "the reference is a frozen copy of the initial actor")
        positive_int("batch_prompts", self.batch_prompts, MAX_BATCH_PROMPTS)
        positive_int("responses_per_prompt", self.responses_per_prompt, MAX_RESPONSES_PER_PROMPT)
        require(self.samples <= MAX_SAMPLES, "batch_prompts", self.batch_prompts,
                f"times responses_per_prompt ({self.responses_per_prompt}) is {self.samples:,} "
                f"sequences per iteration; the limit is {MAX_SAMPLES:,}")
        for key in ("micro_batch_size", "inference_micro_batch_size", "gen_max_concurrency",
                    "optimizer_steps"):
            positive_int(key, getattr(self, key), MAX_SAMPLES)
        longest = self.prompt_length.max + self.response_length.max
        for key in ("micro_batch_tokens", "inference_micro_batch_tokens"):
            value = getattr(self, key)
            require(value is None or (is_int(value) and longest <= value <= MAX_BATCH_TOKENS),
                    key, value,
                    f"must be null or an integer >= the longest sequence, prompt_length.max + "
                    f"response_length.max = {longest} tokens (verl asserts max_token_len >= "
                    f"the sequence length), at most {MAX_BATCH_TOKENS:,}")
        require(isinstance(self.remove_padding, bool), "remove_padding", self.remove_padding,
                "must be true or false (a YAML boolean, not a string)")
        require(self.pad_to in PAD_TO, "pad_to", self.pad_to, f"must be one of {list(PAD_TO)}")
        require(self.pad_to != "max" or not self.remove_padding, "pad_to", self.pad_to,
                "pads only with remove_padding: false")
        self._check_task_batching(longest)
        require(self.optimizer_steps <= self.samples, "optimizer_steps", self.optimizer_steps,
                f"must be <= samples per iteration ({self.samples})")
        require(self.precision in PRECISIONS, "precision", self.precision,
                f"must be one of {list(PRECISIONS)}")
        require(self.gen_precision is None or self.gen_precision in PRECISIONS,
                "gen_precision", self.gen_precision,
                f"must be one of {list(PRECISIONS)} or null (precision's)")
        require(self.optimizer in OPTIMIZERS, "optimizer", self.optimizer,
                f"must be one of {list(OPTIMIZERS)}")
        require(self.optimizer_precision in OPTIMIZER_PRECISIONS, "optimizer_precision",
                self.optimizer_precision, f"must be one of {list(OPTIMIZER_PRECISIONS)}")
        require(self.optimizer_precision == "fp32" or PRECISIONS[self.precision] == 2,
                "optimizer_precision", self.optimizer_precision,
                f"steps the 2-byte weights in place: needs a 2-byte precision (bf16, fp16, "
                f"fp8), not {self.precision}")
        require(is_int(self.schema_version) and self.schema_version in READABLE_VERSIONS,
                "schema_version", self.schema_version,
                f"this hetrl reads versions {list(READABLE_VERSIONS)}")
        if self.schema_version == 1:
            require(not self.recompute_logprobs, "recompute_logprobs", self.recompute_logprobs,
                    "needs schema_version 2 (version 1 has no actor_inference task)")

    def _check_task_batching(self, longest: int) -> None:
        require(isinstance(self.task_batching, tuple) and all(
            isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], TaskBatching)
            for x in self.task_batching), "task_batching", self.task_batching,
            "must be (task, TaskBatching) pairs")
        names = self.task_names
        seen = [t for t, _ in self.task_batching]
        require(len(set(seen)) == len(seen), "task_batching", seen, "each task at most once")
        for task, b in self.task_batching:
            require(task in names and self.task(task).kind != "generation",
                    f"task_batching.{task}", task,
                    f"is not an inference or training task of this workload: {list(names)}")
            require(b.micro_batch_tokens is None or b.micro_batch_tokens >= longest,
                    f"task_batching.{task}.micro_batch_tokens", b.micro_batch_tokens,
                    f"must be >= the longest sequence, {longest} tokens")
            pad_to = b.pad_to if b.pad_to is not None else self.pad_to
            remove = b.remove_padding if b.remove_padding is not None else self.remove_padding
            require(pad_to in PAD_TO, f"task_batching.{task}.pad_to", pad_to,
                    f"must be one of {list(PAD_TO)}")
            require(pad_to != "max" or not remove, f"task_batching.{task}.pad_to", pad_to,
                    "pads only with remove_padding: false")
            require(b.recompute is None or self.task(task).kind == "training",
                    f"task_batching.{task}.recompute", b.recompute,
                    "activation recomputation is a training task's setting")
        models = dict(self.models)
        for t in self.tasks:
            if t.kind == "training" and self.task_recompute_mode(t.name) == "selective":
                own = self.task_batching_of(t.name)
                field_name = "recompute" if own is None or own.recompute is None \
                    else f"task_batching.{t.name}.recompute"
                require(models[t.role].moe is None, field_name, "selective",
                        f"selective recomputation is priced for dense layers only; "
                        f"{t.name}'s model {models[t.role].name} is a mixture of experts "
                        f"(write true or false)")

    def task_batching_of(self, task: str) -> TaskBatching | None:
        """``task``'s own micro-batching, or None where it follows the workload's."""
        for t, b in self.task_batching:
            if t == task:
                return b
        return None

    def task_recompute_mode(self, task: str) -> str:
        """How ``task`` recomputes activations in its backward pass, one of
        :data:`~hetrl.spec.task_batching.RECOMPUTE_MODES`: its own ``task_batching`` setting,
        else the workload's ``recompute`` (false: "none", true: "full", "selective")."""
        own = self.task_batching_of(task)
        value = self.recompute if own is None or own.recompute is None else own.recompute
        return recompute_mode(value)

    def selective_recompute_task(self) -> str | None:
        """The first training task that recomputes selectively (None: none does): exports refuse
        it where the framework has no such checkpointing."""
        return next((t.name for t in self.tasks if t.kind == "training"
                     and self.task_recompute_mode(t.name) == "selective"), None)

    def task_recompute(self, task: str) -> bool:
        """Whether ``task`` recomputes every layer in its backward pass (full recomputation;
        selective recomputation is :meth:`task_recompute_mode`'s "selective")."""
        return self.task_recompute_mode(task) == "full"

    # --- derived ---
    @property
    def models_by_role(self) -> dict[str, ModelShape]:
        return dict(self.models)

    def model(self, role: str) -> ModelShape:
        for r, shape in self.models:
            if r == role:
                return shape
        raise KeyError(role)

    @property
    def tasks(self) -> tuple[TaskInfo, ...]:
        return tasks_for(self.algorithm, self.reward, self.recompute_logprobs, self.kl)

    @property
    def task_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tasks)

    @cached_property
    def _task_index(self) -> dict[str, TaskInfo]:
        return {t.name: t for t in self.tasks}

    def task(self, name: str) -> TaskInfo:
        info = self._task_index.get(name)
        if info is None:
            raise SpecError("task", name, f"not a task of {self.algorithm}: {list(self.task_names)}")
        return info

    @property
    def samples(self) -> int:
        """Sequences (prompt + response) per iteration."""
        return self.batch_prompts * self.responses_per_prompt

    @property
    def bytes_per_value(self) -> int:
        return PRECISIONS[self.precision]

    @property
    def gen_fp8(self) -> bool:
        """Whether the rollout runs in FP8 (weights and KV cache in one byte, FP8 matmuls)."""
        return (self.gen_precision or self.precision) == "fp8"

    @property
    def train_fp8(self) -> bool:
        """Whether training and inference tasks run Megatron's FP8 recipe (FP8 matmuls)."""
        return self.precision == "fp8"

    def fp8_for(self, kind: str) -> bool:
        """Whether tasks of ``kind`` ("generation", "inference", "training") use FP8."""
        return self.gen_fp8 if kind == "generation" else self.train_fp8

    def with_(self, **changes: Any) -> WorkloadSpec:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)

    # --- serialisation ---
    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "name": self.name,
            "algorithm": self.algorithm,
            "mode": self.mode,
            "staleness": self.staleness,
            "models": {role: shape.to_dict() for role, shape in self.models},
            "batch_prompts": self.batch_prompts,
            "responses_per_prompt": self.responses_per_prompt,
            "prompt_length": self.prompt_length.to_dict(),
            "response_length": self.response_length.to_dict(),
            "precision": self.precision,
            "optimizer": self.optimizer,
            "micro_batch_size": self.micro_batch_size,
            "inference_micro_batch_size": self.inference_micro_batch_size,
            "micro_batch_tokens": self.micro_batch_tokens,
            "inference_micro_batch_tokens": self.inference_micro_batch_tokens,
            "remove_padding": self.remove_padding,
            "pad_to": self.pad_to,
            "gen_max_concurrency": self.gen_max_concurrency,
            "optimizer_steps": self.optimizer_steps,
            "recompute": self.recompute,
            "reward": self.reward,
            "kl": self.kl,
            "gen_sleep_level": self.gen_sleep_level,
            **({"task_batching": {t: b.to_dict() for t, b in self.task_batching}}
               if self.task_batching else {}),
            "recompute_logprobs": self.recompute_logprobs,
            "backends": list(self.backends),
            "gen_cuda_graphs": self.gen_cuda_graphs,
            "gen_gpu_memory_utilization": self.gen_gpu_memory_utilization,
            "overlap_grad_reduce": self.overlap_grad_reduce,
            "tp_comm_overlap": self.tp_comm_overlap,
            **({"gen_precision": self.gen_precision} if self.gen_precision is not None else {}),
            # (written only when off: the workloads written before it read as they did)
            **({} if self.sequence_parallel else {"sequence_parallel": False}),
            **({} if self.framework == "verl" else {"framework": self.framework}),
            **({} if self.optimizer_precision == "fp32"
               else {"optimizer_precision": self.optimizer_precision}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], base_dir: Path | None = None) -> WorkloadSpec:
        """Build from a mapping. ``model: NAME`` sets every role; ``models: {role: ...}`` per role
        (a preset name, a shape mapping or ``{hf_config: path}``); ``models`` overrides ``model``."""
        require(isinstance(data, Mapping), "workload", type(data).__name__, "must be a mapping")
        known = set(cls.__dataclass_fields__) | {"model"}
        for key in data:
            require(key in known, str(key), data[key], f"unknown key; known keys: {sorted(known)}")
        for key in ("algorithm", "batch_prompts", "responses_per_prompt", "prompt_length",
                    "response_length"):
            require(key in data, key, None, "is required")
        algorithm = one_of("algorithm", data["algorithm"], ALGORITHMS)
        per_role: dict[str, Any] = {}
        reward = one_of("reward", data.get("reward", "model"), REWARDS)
        kl = one_of("kl", data.get("kl", "loss"), KL_MODES)
        if "model" in data:
            per_role = {role: data["model"] for role in roles_for(algorithm, reward, kl)}
        given = data.get("models")
        given = {} if given is None else given
        require(isinstance(given, Mapping), "models", given, "must be a mapping role -> model")
        for role in given:
            require(role in ("actor", "reference", "reward", "critic"), f"models.{role}", role,
                    "unknown role; roles: actor, reference, reward, critic")
        per_role.update(given)
        if "actor" in per_role and "reference" not in per_role and kl != "none":
            per_role["reference"] = per_role["actor"]
        models = tuple(
            (role, resolve_model(per_role[role], f"models.{role}", base_dir))
            for role in ("actor", "reference", "reward", "critic") if role in per_role
        )
        for role in per_role:
            require(role in ("actor", "reference", "reward", "critic"), f"models.{role}", role,
                    "unknown role; roles: actor, reference, reward, critic")
        mode = data.get("mode", "sync")
        values = {k: v for k, v in data.items() if k not in ("model", "models")}
        values["models"] = models
        values["mode"] = mode
        values.setdefault("name", "custom")
        values.setdefault("staleness", 1 if mode == "async" else 0)
        # a file without the key: what real systems run (version 2), or the task set of its
        # time (version 1)
        values.setdefault("recompute_logprobs", values.get("schema_version", SCHEMA_VERSION) != 1)
        # the training backends a search may use: with FSDP for files of version 2
        raw = values.get("backends", ["megatron", "fsdp"] if values.get(
            "schema_version", SCHEMA_VERSION) != 1 else ["megatron"])
        require(isinstance(raw, list | tuple), "backends", raw, "must be a list, e.g. [megatron, fsdp]")
        values["backends"] = tuple(raw)
        if "task_batching" in values:
            values["task_batching"] = parse_task_batching(
                values["task_batching"],
                tuple(t.name for t in tasks_for(algorithm, reward,
                                                values["recompute_logprobs"] is True, kl)))
        values["prompt_length"] = LengthDist.from_dict(data["prompt_length"], "prompt_length")
        values["response_length"] = LengthDist.from_dict(data["response_length"], "response_length")
        return cls(**values)
