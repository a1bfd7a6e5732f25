"""Torch engines for one device ("cpu" or "cuda[:i]"); all randomness comes from explicit seeds.

Training and scoring run the model as :class:`~real.model.StageModule` (causal attention, no
padding mask), so the reference, the actor and their pipeline stages compute identical
log-probabilities for identical weights.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

import torch
from transformers.cache_utils import DynamicCache

from hetrl.errors import require
from real.algos import TRAINER_ROLES, AlgoConfig, align_to_actions, token_log_probs, trainer_loss
from real.engines.base import Extras, RolloutBatch, check_generate_args
from real.model import (
    CACHE_KWARG,
    StageModule,
    TinyModelSpec,
    build_causal_lm,
    build_value_model,
    split_stages,
    validate_boundaries,
)
from real.moe import shard_experts
from real.tokenizer import EOS, PAD

INFERENCE_ROLES = ("reference", "actor", "critic", "reward")
#: Roles whose inference is log-probs of a language model: the reference, and the actor
#: recomputing its old log-probs (recompute_logprobs).
LOGPROB_ROLES = ("reference", "actor")


def _cpu_copy(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}


def grad_sq_norm(params) -> float:
    """Sum of squared gradients of ``params`` (those with a gradient), float."""
    return sum(float(p.grad.float().pow(2).sum()) for p in params if p.grad is not None)


@torch.no_grad()
def clipped_step(params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer,
                 grad_clip: float, grad_norm: float | None = None) -> None:
    """Scale the gradients of ``params`` to global norm <= ``grad_clip`` (``grad_norm`` is that
    norm, default the params' own), step ``optimizer`` and zero the gradients."""
    norm = math.sqrt(grad_sq_norm(params)) if grad_norm is None else grad_norm
    coef = grad_clip / (norm + 1e-6)
    if coef < 1.0:
        for p in params:
            if p.grad is not None:
                p.grad.mul_(coef)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


class TorchRollout:
    """Samples responses from a causal LM with a KV cache (left-padded prompts)."""

    def __init__(self, spec: TinyModelSpec, seed: int, device: str = "cpu"):
        self.spec = spec
        self.device = torch.device(device)
        self.model = build_causal_lm(spec, seed).to(self.device).eval()
        self.last_phases: tuple[tuple[str, float, float, dict], ...] = ()

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float = 1.0,
                 seed: int = 0) -> list[list[int]]:
        """Response ids per prompt: sampled from softmax(logits / temperature) (greedy when
        ``temperature`` is 0) with a generator seeded by ``seed``; a response ends after EOS
        (kept) or at ``max_new_tokens`` tokens.

        Sets ``last_phases``: (name, start s, end s, meta) of the ``prefill`` (the forward over
        the prompts that samples the first token; meta ``sequences``, ``prompt_tokens``) and the
        ``decode`` (the one-token steps after it; meta ``steps``, ``tokens``, ``batch``), times
        from the call's start (the worker records them as ``phase`` spans)."""
        t0 = time.perf_counter()
        longest = check_generate_args(prompts, max_new_tokens, temperature,
                                      self.spec.max_positions)
        B = len(prompts)
        ids = torch.full((B, longest), PAD, dtype=torch.long)
        mask = torch.zeros((B, longest), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, longest - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, longest - len(p):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(dim=1) - 1).clamp_min(0)
        next_position = mask.sum(dim=1, keepdim=True)
        generator = torch.Generator(device=self.device).manual_seed(seed)
        cache = DynamicCache(config=self.model.config)
        done = torch.zeros(B, dtype=torch.bool, device=self.device)
        out_tokens = []
        t_prefill = None
        decode_tokens = 0
        for _ in range(max_new_tokens):
            logits = self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                                use_cache=True, **{CACHE_KWARG: cache}).logits[:, -1].float()
            if temperature == 0:
                token = logits.argmax(dim=-1)
            else:
                probs = torch.softmax(logits / temperature, dim=-1)
                token = torch.multinomial(probs, 1, generator=generator).squeeze(1)
            if t_prefill is not None:
                decode_tokens += int((~done).sum())
            token = torch.where(done, PAD, token)
            out_tokens.append(token)
            if t_prefill is None:
                t_prefill = time.perf_counter() - t0
            done |= token == EOS
            if bool(done.all()):
                break
            ids = token[:, None]
            mask = torch.cat([mask, torch.ones_like(ids)], dim=1)
            positions = next_position
            next_position = next_position + 1
        t_end = time.perf_counter() - t0
        t_prefill = t_end if t_prefill is None else t_prefill
        self.last_phases = (
            ("prefill", 0.0, t_prefill, {"sequences": B,
                                         "prompt_tokens": sum(len(p) for p in prompts)}),
            ("decode", t_prefill, t_end, {"steps": len(out_tokens) - 1, "tokens": decode_tokens,
                                          "batch": B}))
        responses = []
        for row in torch.stack(out_tokens, dim=1).tolist():
            responses.append(row[: row.index(EOS) + 1] if EOS in row else row)
        return responses

    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load the actor's full state dict (all keys must match)."""
        self.model.load_state_dict(state_dict, strict=True)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The current weights (CPU copies)."""
        return _cpu_copy(self.model)


class TorchInference:
    """Forward-only reference policy, actor (old log-probs), critic or reward model (all under
    ``torch.no_grad``).

    ``temperature`` divides the reference's logits, as the actor's are when it samples and
    trains.
    """

    def __init__(self, role: str, spec: TinyModelSpec, seed: int, device: str = "cpu",
                 temperature: float = 1.0):
        require(role in INFERENCE_ROLES, "role", role, f"must be one of {INFERENCE_ROLES}")
        require(temperature > 0, "temperature", temperature, "must be > 0")
        self.role = role
        self.device = torch.device(device)
        self.temperature = temperature
        build = build_causal_lm if role in LOGPROB_ROLES else build_value_model
        self.model = build(spec, seed).to(self.device).eval()
        self.module = StageModule(self.model, 0, spec.layers)

    def _forward(self, method: str, role: str, batch: RolloutBatch) -> tuple[torch.Tensor, RolloutBatch]:
        require(self.role == role, "role", self.role, f"{method}() needs the {role} role")
        batch = batch.to(self.device)
        return self.module(batch.input_ids, batch.position_ids), batch

    @torch.no_grad()
    def log_probs(self, batch: RolloutBatch) -> torch.Tensor:
        """Reference (or actor) log-probabilities [B, T] (float32), 0 outside the response mask."""
        logits, batch = self._forward("log_probs", self.role if self.role in LOGPROB_ROLES
                                      else "reference", batch)
        return token_log_probs(logits / self.temperature, batch.input_ids) * batch.response_mask

    @torch.no_grad()
    def values(self, batch: RolloutBatch) -> torch.Tensor:
        """Critic values [B, T], action-aligned, 0 outside the response mask."""
        values, batch = self._forward("values", "critic", batch)
        return align_to_actions(values.float()) * batch.response_mask

    @torch.no_grad()
    def scores(self, batch: RolloutBatch) -> torch.Tensor:
        """Reward-model scores [B]: the value head at each row's last real token."""
        values, batch = self._forward("scores", "reward", batch)
        return values.float()[torch.arange(batch.size, device=self.device), batch.lengths - 1]

    def load_state(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load a full state dict (all keys must match)."""
        self.model.load_state_dict(state_dict, strict=True)


class TorchTrainer:
    """Actor (clipped policy loss + KL to the reference) or critic (clipped value loss).

    Whole-model mode (``stages`` None): :meth:`forward_backward` then :meth:`step`.
    Pipeline mode: ``stages`` are layer boundaries (``[0, 2, 4]``) and ``stage`` this
    trainer's index; only that stage's layers are kept, driven by :meth:`stage_forward` and
    :meth:`stage_backward` per micro-batch. Either way gradients accumulate until
    :meth:`step`, so a data-parallel all-reduce of :meth:`parameters` grads can run between.

    Expert parallelism (``ep_group``, whole-model mode, a mixture-of-experts ``spec``): this
    rank keeps its slice of every layer's experts (:func:`real.moe.shard_experts`) and the
    group's ranks exchange tokens in every forward and backward, so they must run the same
    number of micro-batches; gradients of :meth:`expert_parameters` are summed over the
    replicas holding the same experts, the others over all; :meth:`gather_experts` (every rank
    of the group, after :meth:`step`) assembles the whole experts that :meth:`state_dict`
    exports.
    """

    def __init__(self, role: str, spec: TinyModelSpec, seed: int, device: str = "cpu",
                 cfg: AlgoConfig | None = None, stage: int | None = None,
                 stages: list[int] | None = None, ep_group: Any = None):
        require(role in TRAINER_ROLES, "role", role, f"must be one of {TRAINER_ROLES}")
        require((stage is None) == (stages is None), "stage", stage,
                "stage and stages must be given together (pipeline mode) or not at all")
        self.role = role
        self.stages = stages
        self.cfg = cfg or AlgoConfig()
        self.device = torch.device(device)
        model = (build_causal_lm if role == "actor" else build_value_model)(spec, seed)
        self.ep_group = ep_group
        self.experts = {}
        if ep_group is not None:
            require(stages is None and spec.experts > 0, "ep_group", ep_group,
                    "expert parallelism needs a mixture-of-experts model in whole-model mode")
            self.experts = shard_experts(model, ep_group)
        #: the whole experts :meth:`gather_experts` assembled since the last step (None: stale)
        self.gathered_experts: dict[str, torch.Tensor] | None = None
        self._routed_tokens = self._passes = 0
        if stages is None:
            self.pipeline = False
            self.module = StageModule(model, 0, spec.layers)
        else:
            validate_boundaries(stages, spec.layers)
            require(isinstance(stage, int) and 0 <= stage < len(stages) - 1, "stage", stage,
                    f"must be an index in [0, {len(stages) - 1})")
            self.pipeline = True
            self.module = split_stages(model, stages)[stage]
        self.module.to(self.device).train()
        lr = self.cfg.lr if role == "actor" else self.cfg.critic_lr
        self.optimizer = torch.optim.Adam(self.module.parameters(), lr=lr)
        self._pending: dict[int, tuple[torch.Tensor | None, torch.Tensor]] = {}

    def _loss(self, out: torch.Tensor, batch: RolloutBatch,
              extras: Extras) -> tuple[torch.Tensor, dict[str, float]]:
        return trainer_loss(self.role, self.cfg, out, batch.input_ids, batch.response_mask,
                            dict(extras))

    def forward_backward(self, batch: RolloutBatch, extras: Extras,
                         scale: float = 1.0) -> dict[str, float]:
        """Accumulate gradients of ``scale`` x the token-mean loss of ``batch`` (whole model).

        ``extras`` [B, T]: actor needs ``advantages`` and (if kl_coef > 0) ``ref_logp``;
        critic needs ``returns``. ``old_logp`` / ``old_values`` default to the current
        model's (one update per rollout). For micro-batches pass :func:`token_weights` as
        ``scale``. Returns loss statistics (floats).
        """
        require(not self.pipeline, "stages", self.stages,
                "forward_backward() is whole-model only; pipeline stages use stage_forward()")
        batch = batch.to(self.device)
        loss, stats = self._loss(self.module(batch.input_ids, batch.position_ids), batch, extras)
        (loss * scale).backward()
        if self.experts:
            self._routed_tokens += batch.input_ids.numel()
            self._passes += 1
        return stats

    def stage_forward(self, micro_id: int, x: torch.Tensor, batch: RolloutBatch | None = None,
                      extras: Extras | None = None, scale: float = 1.0) -> torch.Tensor | float:
        """Forward micro-batch ``micro_id`` through this stage, keeping its graph.

        ``x``: input_ids [B, T] on the first stage, the previous stage's hidden states
        [B, T, H] otherwise. ``batch`` supplies position ids (all stages) and, with ``extras``,
        the loss (last stage, scaled by ``scale``). Returns detached hidden states, or on the
        last stage the (unscaled) loss value.
        """
        require(micro_id not in self._pending, "micro_id", micro_id, "is already in flight")
        batch = batch.to(self.device) if batch is not None else None
        leaf = None
        if self.module.first:
            inputs = x.to(self.device)
        else:
            leaf = inputs = x.detach().to(self.device).requires_grad_(True)
        out = self.module(inputs, batch.position_ids if batch is not None else None)
        if not self.module.last:
            self._pending[micro_id] = (leaf, out)
            return out.detach()
        require(batch is not None and extras is not None, "batch", batch,
                "the last stage needs the batch and extras to compute the loss")
        loss, _ = self._loss(out, batch, extras)
        self._pending[micro_id] = (leaf, loss * scale)
        return float(loss.detach())

    def stage_backward(self, micro_id: int,
                       grad_output: torch.Tensor | None = None) -> torch.Tensor | None:
        """Backward micro-batch ``micro_id``; returns the gradient for the previous stage's
        output [B, T, H] (None on the first stage). The last stage takes no ``grad_output``."""
        require(micro_id in self._pending, "micro_id", micro_id, "has no pending forward")
        require((grad_output is None) == self.module.last, "grad_output",
                None if grad_output is None else tuple(grad_output.shape),
                "must be given exactly on non-last stages")
        leaf, out = self._pending.pop(micro_id)
        if grad_output is None:
            out.backward()
        else:
            out.backward(grad_output.to(self.device))
        return None if leaf is None else leaf.grad

    def grad_sq_norm(self) -> float:
        """Sum of squared gradients of this trainer's parameters (add over pipeline stages)."""
        return grad_sq_norm(self.module.parameters())

    def step(self, grad_norm: float | None = None) -> None:
        """Scale gradients to global norm <= ``cfg.grad_clip``, Adam step, zero gradients.

        ``grad_norm`` is the global norm; default this trainer's own. Pipeline stages pass
        ``sqrt(sum of grad_sq_norm() over stages)`` so they clip as the whole model would.
        """
        require(not self._pending, "micro_id", sorted(self._pending), "still pending backward")
        if self.experts and grad_norm is None:  # the whole model's norm: every rank's experts
            import torch.distributed as dist

            expert_sq = torch.tensor(grad_sq_norm(self.expert_parameters()), dtype=torch.float64)
            dist.all_reduce(expert_sq, group=self.ep_group)
            grad_norm = math.sqrt(grad_sq_norm(self.dense_parameters()) + float(expert_sq))
        clipped_step(list(self.module.parameters()), self.optimizer, self.cfg.grad_clip, grad_norm)
        self.gathered_experts = None

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Full model weights (CPU copies) for the rollout engine; whole-model mode only."""
        require(not self.pipeline, "stages", self.stages,
                "state_dict() is whole-model only; pipeline stages use stage_state_dict()")
        out = _cpu_copy(self.module)
        if self.experts:
            require(self.gathered_experts is not None, "experts", len(self.experts),
                    "are sharded: gather_experts() after the step assembles them")
            out.update(self.gathered_experts)
        return out

    def stage_state_dict(self) -> dict[str, torch.Tensor]:
        """This stage's weights (CPU copies) under the full model's names; the stages' dicts
        merge into the full state dict."""
        return _cpu_copy(self.module)

    def parameters(self) -> list[torch.nn.Parameter]:
        """Trainable parameters, in a fixed order."""
        return list(self.module.parameters())

    def expert_parameters(self) -> list[torch.nn.Parameter]:
        """This rank's routed experts' parameters (none without expert parallelism)."""
        return [p for e in self.experts.values() for p in (e.gate_up_proj, e.down_proj)]

    def dense_parameters(self) -> list[torch.nn.Parameter]:
        """The parameters every replica holds whole (all but :meth:`expert_parameters`)."""
        experts = {id(p) for p in self.expert_parameters()}
        return [p for p in self.module.parameters() if id(p) not in experts]

    def take_alltoall(self) -> tuple[int, int, int]:
        """Since the last call: the bytes this rank's all-to-alls sent to other ranks (each
        forward's dispatch and combine, and as much again in the backward: the same rows go
        back), their number, and the tokens its MoE layers routed (padding included, per
        layer)."""
        sent = sum(e.bytes_sent for e in self.experts.values())
        for e in self.experts.values():
            e.bytes_sent = 0
        tokens, self._routed_tokens = self._routed_tokens, 0
        passes, self._passes = self._passes, 0
        return 2 * sent, passes * 4 * len(self.experts), tokens

    def gather_experts(self) -> int:
        """All-gather every layer's experts over the expert-parallel group (a collective of
        the group's ranks) for :meth:`state_dict`; returns the bytes this rank received."""
        self.gathered_experts, received = {}, 0
        for name, e in self.experts.items():  # module names are the state dict's prefixes
            gate_up, down = e.gathered()
            self.gathered_experts[f"{name}.gate_up_proj"] = gate_up.cpu()
            self.gathered_experts[f"{name}.down_proj"] = down.cpu()
            received += (gate_up.nbytes + down.nbytes) * (e.ep - 1) // e.ep
        return received
