"""Per-task micro-batching: verl configures each role's micro-batches and padding apart
(``actor.ppo_micro_batch_size_per_gpu``, ``critic.ppo_micro_batch_size_per_gpu``,
``rollout.log_prob_micro_batch_size_per_gpu``, ``ref.log_prob_micro_batch_size_per_gpu``, each
model's ``use_remove_padding`` and ``enable_gradient_checkpointing``). A workload's
``task_batching`` overrides its defaults (``micro_batch_size`` / ``micro_batch_tokens`` for
training tasks, the ``inference_`` ones for inference tasks, ``remove_padding`` and ``pad_to``
for all, ``recompute`` for training tasks) for the tasks it names::

    task_batching:
      critic_inference: {micro_batch_size: 1, remove_padding: false}
      critic_training: {micro_batch_size: 1, remove_padding: false, recompute: true}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from hetrl.errors import SpecError, is_int, require
from hetrl.limits import MAX_BATCH_TOKENS, MAX_SAMPLES

#: How a training task recomputes activations in its backward pass: "none" (``recompute:
#: false``), "full" (``true``: every layer from its input; Megatron's ``recompute_granularity:
#: full``, FSDP's gradient checkpointing) and "selective" (PyTorch's selective activation
#: checkpointing with torchtitan's op policy: each layer keeps its matmul outputs except every
#: second one and the attention's output, and recomputes the rest; docs/cost-model.md).
#: Megatron's own "selective" (the attention core) keeps what flash attention keeps anyway:
#: write ``false`` for it.
RECOMPUTE_MODES = ("none", "full", "selective")


def check_recompute(field: str, value: Any) -> None:
    """A ``recompute`` value: true, false or "selective" (exit 2 otherwise)."""
    require(isinstance(value, bool) or value == "selective", field, value,
            "must be true or false (YAML booleans, not strings) or selective")


def recompute_mode(value: bool | str) -> str:
    """The :data:`RECOMPUTE_MODES` entry of a checked ``recompute`` value."""
    return value if isinstance(value, str) else ("full" if value else "none")


#: Tasks whose micro-batching a workload may set (generation batches by its engine instead).
BATCHED_TASKS = ("reward_inference", "reference_inference", "critic_inference",
                 "actor_inference", "actor_training", "critic_training")


@dataclass(frozen=True)
class TaskBatching:
    """One task's micro-batching where it differs from its workload's: sequences per
    micro-batch, or a token budget per micro-batch (tokens), its padding and (training tasks)
    whether it recomputes activations in the backward pass (None: the workload's)."""

    micro_batch_size: int | None = None
    micro_batch_tokens: int | None = None
    remove_padding: bool | None = None
    pad_to: str | None = None
    recompute: bool | str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) is not None}

    @classmethod
    def from_dict(cls, data: Any, field: str) -> TaskBatching:
        require(isinstance(data, Mapping), field, data,
                "must be a mapping {micro_batch_size, micro_batch_tokens, remove_padding, pad_to, "
                "recompute}")
        known = [f.name for f in fields(cls)]
        for key, value in data.items():
            require(key in known, f"{field}.{key}", value, f"unknown key; known keys: {known}")
        size, tokens = data.get("micro_batch_size"), data.get("micro_batch_tokens")
        require(size is None or (is_int(size) and 1 <= size <= MAX_SAMPLES),
                f"{field}.micro_batch_size", size, f"must be an integer in [1, {MAX_SAMPLES:,}]")
        require(tokens is None or (is_int(tokens) and 1 <= tokens <= MAX_BATCH_TOKENS),
                f"{field}.micro_batch_tokens", tokens,
                f"must be an integer in [1, {MAX_BATCH_TOKENS:,}] tokens")
        padding = data.get("remove_padding")
        require(padding is None or isinstance(padding, bool), f"{field}.remove_padding", padding,
                "must be true or false (a YAML boolean, not a string)")
        pad_to = data.get("pad_to")
        require(pad_to is None or isinstance(pad_to, str), f"{field}.pad_to", pad_to,
                "must be a string")
        recompute = data.get("recompute")
        if recompute is not None:
            check_recompute(f"{field}.recompute", recompute)
        return cls(size, tokens, padding, pad_to, recompute)


def parse_task_batching(data: Any, tasks: tuple[str, ...]) -> tuple[tuple[str, TaskBatching], ...]:
    """A workload file's ``task_batching`` mapping, for the workload's ``tasks``, in task order."""
    if data is None:
        return ()
    require(isinstance(data, Mapping), "task_batching", data,
            "must be a mapping task -> {micro_batch_size, micro_batch_tokens, remove_padding, "
            "pad_to}")
    for task in data:
        require(task in BATCHED_TASKS, f"task_batching.{task}", task,
                f"not a batched task; tasks: {list(BATCHED_TASKS)}")
        if task not in tasks:
            raise SpecError(f"task_batching.{task}", task,
                            f"is not a task of this workload: {list(tasks)}")
    return tuple((t, TaskBatching.from_dict(data[t], f"task_batching.{t}"))
                 for t in tasks if t in data)
