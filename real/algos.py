"""PPO and GRPO building blocks as pure functions on tensors.

Shapes: B sequences, T tokens (right-padded, prompt then response), V vocabulary.
Token-aligned quantities put the action "emit ids[t]" at position t: its log-probability,
advantage, reward and value (the value of the state ids[<t]) all live at column t, and
``response_mask`` [B, T] selects the positions that count.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hetrl.errors import require

ALGORITHMS = ("ppo", "grpo")
KL_KINDS = ("k1", "k3")


@dataclass(frozen=True)
class AlgoConfig:
    """Hyper-parameters of one RL algorithm run.

    ``lr`` is the actor's Adam learning rate, ``critic_lr`` the critic's; ``grad_clip`` the
    global gradient-norm limit; ``kl_coef`` weighs the ``kl_kind`` estimator of KL(actor||ref)
    in the actor loss; ``temperature`` divides logits both when sampling and when scoring.
    """

    algorithm: str = "ppo"
    gamma: float = 1.0
    lam: float = 0.95
    clip: float = 0.2
    kl_coef: float = 0.05
    kl_kind: str = "k3"
    value_clip: float = 0.2
    lr: float = 1e-3
    critic_lr: float = 1e-3
    grad_clip: float = 1.0
    group_size: int = 4
    max_new_tokens: int = 16
    temperature: float = 1.0

    def __post_init__(self) -> None:
        require(self.algorithm in ALGORITHMS, "algorithm", self.algorithm,
                f"must be one of {ALGORITHMS}")
        require(self.kl_kind in KL_KINDS, "kl_kind", self.kl_kind, f"must be one of {KL_KINDS}")
        for key in ("gamma", "lam"):
            require(0.0 <= getattr(self, key) <= 1.0, key, getattr(self, key), "must be in [0, 1]")
        for key in ("clip", "value_clip", "lr", "critic_lr", "grad_clip", "temperature"):
            require(getattr(self, key) > 0, key, getattr(self, key), "must be > 0")
        require(self.kl_coef >= 0, "kl_coef", self.kl_coef, "must be >= 0")
        require(isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1,
                "max_new_tokens", self.max_new_tokens, "must be an integer >= 1")
        require(isinstance(self.group_size, int) and self.group_size >= 1, "group_size",
                self.group_size, "must be an integer >= 1")
        require(self.algorithm != "grpo" or self.group_size >= 2, "group_size", self.group_size,
                "must be >= 2 for grpo (advantages are normalised within a group)")


def _same_shape(**tensors: torch.Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    first = next(iter(shapes.values()))
    for name, shape in shapes.items():
        require(shape == first, name, shape, f"must have the shape of the other inputs {shapes}")


def token_log_probs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Log-probabilities [B, T] (float32) of ``input_ids`` [B, T] under ``logits`` [B, T, V].

    Column t holds log p(ids[t] | ids[<t]), read from logits[:, t-1]; column 0 is 0.
    """
    require(logits.dim() == 3 and logits.shape[:2] == input_ids.shape, "logits",
            tuple(logits.shape), f"must be [B, T, V] with [B, T] = {tuple(input_ids.shape)}")
    shifted = logits[:, :-1].float()
    picked = shifted.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return F.pad(picked - torch.logsumexp(shifted, dim=-1), (1, 0))


def align_to_actions(values: torch.Tensor) -> torch.Tensor:
    """Per-position outputs [B, T] (column t has read tokens <= t) moved to action alignment:
    column t gets column t-1 (the state before emitting ids[t]); column 0 is 0."""
    return F.pad(values[:, :-1], (1, 0))


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over positions where ``mask`` is 1 (scalar); 0 if the mask is empty."""
    _same_shape(x=x, mask=mask)
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp_min(1.0)


def last_token_rewards(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sequence scores [B] placed on the last masked position of each row: [B, T].

    Rows with an empty mask get no reward.
    """
    require(scores.dim() == 1 and scores.shape[0] == mask.shape[0], "scores",
            tuple(scores.shape), f"must be [B] with B = {mask.shape[0]}")
    T = mask.shape[1]
    last = T - 1 - torch.flip(mask, dims=[1]).to(torch.long).argmax(dim=1)
    out = torch.zeros(mask.shape, dtype=scores.dtype, device=scores.device)
    out[torch.arange(mask.shape[0], device=mask.device), last] = scores
    return out * mask.to(scores.dtype)


def token_advantages(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sequence advantages [B] (GRPO) spread over the masked positions: [B, T]."""
    require(advantages.dim() == 1 and advantages.shape[0] == mask.shape[0], "advantages",
            tuple(advantages.shape), f"must be [B] with B = {mask.shape[0]}")
    return advantages[:, None] * mask.to(advantages.dtype)


@torch.no_grad()
def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float,
        lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the masked (response) positions only.

    ``rewards``, ``values``, ``mask``: [B, T], action-aligned. Unmasked positions are skipped
    (the next masked position is the successor) and get 0; after the last masked position
    the episode ends (next value 0). Returns ``(advantages, returns)``, both [B, T], with
    ``returns = advantages + values`` on the mask.
    """
    _same_shape(rewards=rewards, values=values, mask=mask)
    B, T = rewards.shape
    m = mask.to(torch.bool)
    advantages = torch.zeros_like(values, dtype=torch.float32)
    next_value = torch.zeros(B, device=values.device)
    next_adv = torch.zeros(B, device=values.device)
    for t in reversed(range(T)):
        v = values[:, t].float()
        delta = rewards[:, t].float() + gamma * next_value - v
        adv = delta + gamma * lam * next_adv
        advantages[:, t] = torch.where(m[:, t], adv, 0.0)
        next_value = torch.where(m[:, t], v, next_value)
        next_adv = torch.where(m[:, t], adv, next_adv)
    returns = torch.where(m, advantages + values.float(), 0.0)
    return advantages, returns


@torch.no_grad()
def grpo_advantages(scores: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """GRPO advantages [B] of ``scores`` [B]: rows ``[k*g, (k+1)*g)`` form group k, and each
    score becomes ``(score - group mean) / (group std + eps)`` (std with Bessel's correction).
    """
    require(isinstance(group_size, int) and group_size >= 2, "group_size", group_size,
            "must be an integer >= 2")
    require(scores.dim() == 1 and scores.shape[0] % group_size == 0, "scores",
            tuple(scores.shape), f"must be [B] with B a multiple of group_size ({group_size})")
    groups = scores.float().view(-1, group_size)
    normed = (groups - groups.mean(dim=1, keepdim=True)) / (groups.std(dim=1, keepdim=True) + eps)
    return normed.view(-1)


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor, clip: float = 0.2) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate, token mean over the mask (all [B, T]).

    ``loss = mean(-min(r * A, clamp(r, 1 - clip, 1 + clip) * A))`` with ``r = exp(logp -
    old_logp)``. Stats: ``clip_frac`` (share of tokens where the clipped term is taken) and
    ``approx_kl`` (mean of ``old_logp - logp``).
    """
    _same_shape(logp=logp, old_logp=old_logp, advantages=advantages, mask=mask)
    require(clip > 0, "clip", clip, "must be > 0")
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip, 1.0 + clip) * advantages
    loss = masked_mean(-torch.minimum(unclipped, clipped), mask)
    with torch.no_grad():
        stats = {"clip_frac": float(masked_mean((clipped < unclipped).float(), mask)),
                 "approx_kl": float(masked_mean(old_logp - logp, mask))}
    return loss, stats


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
               mask: torch.Tensor, clip: float = 0.2) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped value loss, token mean over the mask (all [B, T]).

    ``loss = 0.5 * mean(max((v - R)^2, (old + clamp(v - old, -clip, clip) - R)^2))``.
    Stats: ``vf_clip_frac`` (share of tokens where the clipped term is larger).
    """
    _same_shape(values=values, old_values=old_values, returns=returns, mask=mask)
    require(clip > 0, "clip", clip, "must be > 0")
    clipped = old_values + torch.clamp(values - old_values, -clip, clip)
    err, err_clipped = (values - returns) ** 2, (clipped - returns) ** 2
    loss = 0.5 * masked_mean(torch.maximum(err, err_clipped), mask)
    with torch.no_grad():
        stats = {"vf_clip_frac": float(masked_mean((err_clipped > err).float(), mask))}
    return loss, stats


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor,
               kind: str = "k3") -> torch.Tensor:
    """Estimate of KL(actor || reference) per token, mean over the mask (scalar).

    ``k1 = logp - ref_logp`` (unbiased, can be negative); ``k3 = exp(ref_logp - logp) -
    (ref_logp - logp) - 1`` (unbiased, non-negative, lower variance; Schulman 2020).
    """
    _same_shape(logp=logp, ref_logp=ref_logp, mask=mask)
    require(kind in KL_KINDS, "kind", kind, f"must be one of {KL_KINDS}")
    diff = ref_logp - logp
    per_token = -diff if kind == "k1" else torch.exp(diff) - diff - 1.0
    return masked_mean(per_token, mask)


TRAINER_ROLES = ("actor", "critic")


def trainer_loss(role: str, cfg: AlgoConfig, out: torch.Tensor, input_ids: torch.Tensor,
                 response_mask: torch.Tensor,
                 extras: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
    """The training loss of ``role`` on one (micro-)batch, shared by every training engine.

    ``out``: the model's output, logits [B, T, V] (actor) or per-position values [B, T]
    (critic); ``input_ids`` [B, T]; ``response_mask`` [B, T]. ``extras`` [B, T] (moved to
    ``out``'s device): the actor needs ``advantages`` and (if ``cfg.kl_coef`` > 0)
    ``ref_logp``; the critic ``returns``. ``old_logp`` / ``old_values`` default to the current
    output, detached (one update per rollout). Actor: clipped policy loss on logits /
    ``cfg.temperature`` plus ``cfg.kl_coef`` x the ``cfg.kl_kind`` KL to the reference.
    Critic: clipped value loss on action-aligned values. Returns (scalar loss, statistics).
    """
    require(role in TRAINER_ROLES, "role", role, f"must be one of {TRAINER_ROLES}")

    def need(key: str) -> torch.Tensor:
        require(key in extras, "extras", sorted(extras), f"needs {key!r} for the {role}")
        return extras[key].to(out.device)

    mask = response_mask
    if role == "actor":
        logp = token_log_probs(out / cfg.temperature, input_ids)
        old = need("old_logp") if "old_logp" in extras else logp.detach()
        loss, stats = policy_loss(logp, old, need("advantages"), mask, cfg.clip)
        stats["policy_loss"] = float(loss.detach())
        if cfg.kl_coef > 0:
            kl = kl_penalty(logp, need("ref_logp"), mask, cfg.kl_kind)
            loss = loss + cfg.kl_coef * kl
            stats["kl"] = float(kl.detach())
    else:
        values = align_to_actions(out.float())
        old = need("old_values") if "old_values" in extras else values.detach()
        loss, stats = value_loss(values, old, need("returns"), mask, cfg.value_clip)
    stats["loss"] = float(loss.detach())
    return loss, stats
