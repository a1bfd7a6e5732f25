"""Engine protocols and the batch they exchange.

A batch is right-padded: each row is prompt then response then PAD. Token-aligned tensors
([B, T]) put the action "emit ids[t]" at column t (see :mod:`real.algos`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Protocol, runtime_checkable

import torch

from hetrl.errors import require
from real.tokenizer import PAD

Extras = Mapping[str, torch.Tensor]
"""Per-token training inputs [B, T]: old_logp, ref_logp, advantages, returns, old_values."""


@dataclass(frozen=True)
class RolloutBatch:
    """Prompt + response sequences as tensors on one device.

    ``input_ids`` [B, T] long, right-padded; ``attention_mask`` [B, T] long (1 on real tokens);
    ``response_mask`` [B, T] float32 (1 on response tokens); ``position_ids`` [B, T] long
    (``arange(T)`` per row); ``prompt_lens`` and ``lengths`` [B] long (prompt and total tokens).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    position_ids: torch.Tensor
    prompt_lens: torch.Tensor
    lengths: torch.Tensor

    @property
    def size(self) -> int:
        """B, the number of sequences."""
        return self.input_ids.shape[0]

    @property
    def num_response_tokens(self) -> int:
        """Response tokens in the batch (the denominator of token-mean losses)."""
        return int(self.response_mask.sum().item())

    def _map(self, fn) -> RolloutBatch:
        return RolloutBatch(**{f.name: fn(getattr(self, f.name)) for f in fields(self)})

    def to(self, device: str | torch.device) -> RolloutBatch:
        """The batch on ``device``."""
        return self._map(lambda t: t.to(device))

    def select(self, indices: Sequence[int] | torch.Tensor) -> RolloutBatch:
        """Rows ``indices`` (a data-parallel shard or a micro-batch); T is kept."""
        index = _index(indices, self.size)
        return self._map(lambda t: t[index.to(t.device)])

    def split(self, n: int) -> list[RolloutBatch]:
        """``n`` contiguous micro-batches whose sizes differ by at most one."""
        return [self.select(rows) for rows in split_indices(self.size, n)]


def _index(indices: Sequence[int] | torch.Tensor, size: int) -> torch.Tensor:
    index = torch.as_tensor(indices, dtype=torch.long)
    require(index.dim() == 1 and len(index) > 0, "indices", indices, "must be a non-empty list")
    require(bool(((index >= 0) & (index < size)).all()), "indices", indices,
            f"must lie in [0, {size})")
    return index


def split_indices(size: int, n: int) -> list[list[int]]:
    """Row indices of ``n`` contiguous parts of ``range(size)``, sizes differing by <= 1."""
    require(isinstance(n, int) and 1 <= n <= size, "n", n, f"must be an integer in [1, {size}]")
    base, extra = divmod(size, n)
    bounds = [0]
    for i in range(n):
        bounds.append(bounds[-1] + base + (1 if i < extra else 0))
    return [list(range(a, b)) for a, b in zip(bounds, bounds[1:], strict=False)]


def select_rows(extras: Extras, indices: Sequence[int] | torch.Tensor) -> dict[str, torch.Tensor]:
    """The same rows of every tensor in ``extras`` (to go with :meth:`RolloutBatch.select`)."""
    out = {}
    for key, tensor in extras.items():
        out[key] = tensor[_index(indices, tensor.shape[0]).to(tensor.device)]
    return out


def token_weights(micro_batches: Iterable[RolloutBatch]) -> list[float]:
    """Loss scales for gradient accumulation over micro-batches of one batch.

    Each micro-batch's token-mean loss times its share of the response tokens sums to the
    token-mean loss of the whole batch. Equal shares if there are no response tokens.
    """
    counts = [b.num_response_tokens for b in micro_batches]
    total = sum(counts)
    if total == 0:
        return [1.0 / len(counts)] * len(counts)
    return [c / total for c in counts]


def make_batch(prompts: list[list[int]], responses: list[list[int]], pad: int = PAD) -> RolloutBatch:
    """Right-padded batch of ``prompt + response`` rows (CPU tensors); prompts are non-empty."""
    require(len(prompts) == len(responses) and len(prompts) > 0, "responses", len(responses),
            f"must be as many as the prompts ({len(prompts)}), at least one")
    for i, prompt in enumerate(prompts):
        require(len(prompt) > 0, f"prompts[{i}]", prompt, "must be non-empty")
    rows = [list(p) + list(r) for p, r in zip(prompts, responses, strict=True)]
    B, T = len(rows), max(len(r) for r in rows)
    input_ids = torch.full((B, T), pad, dtype=torch.long)
    attention_mask = torch.zeros((B, T), dtype=torch.long)
    response_mask = torch.zeros((B, T), dtype=torch.float32)
    for i, (row, prompt) in enumerate(zip(rows, prompts, strict=True)):
        input_ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        attention_mask[i, : len(row)] = 1
        response_mask[i, len(prompt): len(row)] = 1.0
    return RolloutBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        response_mask=response_mask,
        position_ids=torch.arange(T).expand(B, T).clone(),
        prompt_lens=torch.tensor([len(p) for p in prompts], dtype=torch.long),
        lengths=torch.tensor([len(r) for r in rows], dtype=torch.long),
    )


@runtime_checkable
class RolloutEngine(Protocol):
    """Samples responses with the current actor weights."""

    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float,
                 seed: int) -> list[list[int]]:
        """Response token ids per prompt (ending with EOS, or at ``max_new_tokens``)."""
        ...

    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load the actor's full state dict."""
        ...

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The current weights (CPU copies)."""
        ...


@runtime_checkable
class InferenceEngine(Protocol):
    """Forward-only scoring of a batch; each role implements one of the three methods."""

    def log_probs(self, batch: RolloutBatch) -> torch.Tensor:
        """Token log-probabilities [B, T] (reference role)."""
        ...

    def values(self, batch: RolloutBatch) -> torch.Tensor:
        """Action-aligned values [B, T] (critic role)."""
        ...

    def scores(self, batch: RolloutBatch) -> torch.Tensor:
        """Sequence scores [B] (reward-model role)."""
        ...

    def load_state(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load a full state dict."""
        ...


@runtime_checkable
class TrainingEngine(Protocol):
    """Gradient accumulation and optimizer steps for the actor or the critic."""

    def forward_backward(self, batch: RolloutBatch, extras: Extras,
                         scale: float = 1.0) -> dict[str, float]:
        """Accumulate gradients of ``scale`` x the loss; return loss statistics."""
        ...

    def step(self, grad_norm: float | None = None) -> None:
        """Clip, apply and zero the accumulated gradients."""
        ...

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Full model weights (CPU copies)."""
        ...

    def parameters(self) -> list[torch.nn.Parameter]:
        """The trainable parameters (whose grads a data-parallel all-reduce averages)."""
        ...


def check_generate_args(prompts: list[list[int]], max_new_tokens: int, temperature: float,
                        max_positions: int) -> int:
    """Validate a rollout engine's ``generate`` arguments (clear errors naming the argument);
    returns the longest prompt's length (tokens)."""
    require(len(prompts) > 0 and all(len(p) > 0 for p in prompts), "prompts", prompts,
            "must be a non-empty list of non-empty token lists")
    require(isinstance(max_new_tokens, int) and max_new_tokens >= 1, "max_new_tokens",
            max_new_tokens, "must be an integer >= 1")
    require(temperature >= 0, "temperature", temperature, "must be >= 0 (0 is greedy)")
    longest = max(len(p) for p in prompts)
    require(longest + max_new_tokens <= max_positions, "max_new_tokens", max_new_tokens,
            f"longest prompt ({longest}) + max_new_tokens must be <= max_positions "
            f"({max_positions})")
    return longest
