"""PPO/GRPO functions on tiny tensors, every expected number worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from real.algos import (
    AlgoConfig,
    align_to_actions,
    gae,
    grpo_advantages,
    kl_penalty,
    last_token_rewards,
    masked_mean,
    policy_loss,
    token_advantages,
    token_log_probs,
    value_loss,
)


def test_token_log_probs_reads_the_previous_position():
    # logits[0] = [0, 0]: p = 1/2 each; logits[1] = [ln 3, 0]: p(0) = 3/4; logits[2] unused.
    logits = torch.tensor([[[0.0, 0.0], [math.log(3.0), 0.0], [100.0, -100.0]]])
    ids = torch.tensor([[1, 1, 0]])
    expected = torch.tensor([[0.0, math.log(0.5), math.log(0.75)]])
    assert torch.allclose(token_log_probs(logits, ids), expected, atol=1e-6)
    with pytest.raises(ValueError, match="logits"):
        token_log_probs(logits[:, :2], ids)


def test_align_to_actions_and_masked_mean():
    assert align_to_actions(torch.tensor([[1.0, 2.0, 3.0]])).tolist() == [[0.0, 1.0, 2.0]]
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    assert masked_mean(x, mask).item() == pytest.approx(8 / 3)     # (1 + 3 + 4) / 3
    assert masked_mean(x, torch.zeros_like(mask)).item() == 0.0
    with pytest.raises(ValueError, match="mask"):
        masked_mean(x, mask[:, :1])


def test_last_token_rewards_and_token_advantages():
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    out = last_token_rewards(torch.tensor([2.0, 3.0]), mask)
    assert out.tolist() == [[0.0, 0.0, 2.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
    adv = token_advantages(torch.tensor([0.5, -1.0]), mask)
    assert adv.tolist() == [[0.0, 0.5, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0]]


def test_gae_by_hand():
    # Response at positions 1..3, reward 1 at the end; gamma 0.9, lam 0.5 (gamma*lam = 0.45):
    # t3: delta = 1 - 0.7 = 0.3;            A3 = 0.3
    # t2: delta = 0.9*0.7 - 0.6 = 0.03;     A2 = 0.03 + 0.45*0.3 = 0.165
    # t1: delta = 0.9*0.6 - 0.5 = 0.04;     A1 = 0.04 + 0.45*0.165 = 0.11425
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    values = torch.tensor([[9.0, 0.5, 0.6, 0.7]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0]])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.5)
    assert torch.allclose(adv, torch.tensor([[0.0, 0.11425, 0.165, 0.3]]), atol=1e-6)
    assert torch.allclose(ret, torch.tensor([[0.0, 0.61425, 0.765, 1.0]]), atol=1e-6)
    # gamma = lam = 1: advantage = (sum of later rewards) - value.
    adv, _ = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    assert torch.allclose(adv, torch.tensor([[0.0, 0.5, 0.4, 0.3]]), atol=1e-6)


def test_gae_skips_unmasked_positions():
    # Position 1 is not a response token: its reward 5 and value 9 are ignored, and position 0's
    # successor is position 2. t2: A = 1 - 0.4 = 0.6; t0: A = (0 + 0.4 - 0.2) + 0.6 = 0.8.
    adv, _ = gae(torch.tensor([[0.0, 5.0, 1.0]]), torch.tensor([[0.2, 9.0, 0.4]]),
                 torch.tensor([[1.0, 0.0, 1.0]]), gamma=1.0, lam=1.0)
    assert torch.allclose(adv, torch.tensor([[0.8, 0.0, 0.6]]), atol=1e-6)


def test_grpo_advantages_by_hand():
    # Group [1, 0, 0, 0]: mean 0.25, std (Bessel) sqrt((0.5625 + 3 * 0.0625) / 3) = 0.5.
    # Group [2, 2, 2, 2]: std 0, so every advantage is 0.
    adv = grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 2.0, 2.0, 2.0]), group_size=4)
    assert torch.allclose(adv, torch.tensor([1.5, -0.5, -0.5, -0.5, 0, 0, 0, 0]), atol=1e-5)
    with pytest.raises(ValueError, match="multiple of group_size"):
        grpo_advantages(torch.zeros(6), group_size=4)
    with pytest.raises(ValueError, match="group_size = 1"):
        grpo_advantages(torch.zeros(4), group_size=1)


def test_policy_loss_by_hand():
    # ratios 1.5, 1.1, 0.5 with advantages 1, 1, -1 and clip 0.2:
    #   t0: min(1.5, 1.2) = 1.2 (clipped)   t1: min(1.1, 1.1) = 1.1   t2: min(-0.5, -0.8) = -0.8 (clipped)
    # loss = -(1.2 + 1.1 - 0.8) / 3 = -0.5; only t1 carries gradient: d/dlogp = -1.1 / 3.
    old = torch.zeros(1, 3)
    logp = torch.log(torch.tensor([[1.5, 1.1, 0.5]])).requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0, -1.0]])
    loss, stats = policy_loss(logp, old, adv, torch.ones(1, 3), clip=0.2)
    assert loss.item() == pytest.approx(-0.5, abs=1e-6)
    assert stats["clip_frac"] == pytest.approx(2 / 3)
    assert stats["approx_kl"] == pytest.approx(-math.log(1.5 * 1.1 * 0.5) / 3, abs=1e-6)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[0.0, -1.1 / 3, 0.0]]), atol=1e-6)


def test_value_loss_by_hand():
    # old values 0, clip 0.2, so clipped values are clamp(v, -0.2, 0.2):
    #   v=1,    R=0.5: (0.5)^2 = 0.25  vs (0.2-0.5)^2 = 0.09   -> 0.25
    #   v=-0.5, R=1:   (1.5)^2 = 2.25  vs (1.2)^2 = 1.44       -> 2.25
    #   v=0.5,  R=1:   (0.5)^2 = 0.25  vs (0.8)^2 = 0.64       -> 0.64 (clipped term)
    # loss = 0.5 * (0.25 + 2.25 + 0.64) / 3 = 0.52333...
    values = torch.tensor([[1.0, -0.5, 0.5]])
    loss, stats = value_loss(values, torch.zeros(1, 3), torch.tensor([[0.5, 1.0, 1.0]]),
                             torch.ones(1, 3), clip=0.2)
    assert loss.item() == pytest.approx(0.5 * 3.14 / 3, abs=1e-6)
    assert stats["vf_clip_frac"] == pytest.approx(1 / 3)


def test_kl_penalty_by_hand():
    # logp = ln[1/2, 1/4], ref = ln[1/4, 1/2]: k1 = [ln 2, -ln 2], mean 0;
    # k3 = e^d - d - 1 with d = ref - logp = [-ln 2, ln 2]: [ln 2 - 1/2, 1 - ln 2], mean 1/4.
    logp = torch.log(torch.tensor([[0.5, 0.25]]))
    ref = torch.log(torch.tensor([[0.25, 0.5]]))
    mask = torch.ones(1, 2)
    assert kl_penalty(logp, ref, mask, "k1").item() == pytest.approx(0.0, abs=1e-6)
    assert kl_penalty(logp, ref, mask, "k3").item() == pytest.approx(0.25, abs=1e-6)
    assert kl_penalty(logp, logp, mask).item() == 0.0
    with pytest.raises(ValueError, match="kind = 'k2'"):
        kl_penalty(logp, ref, mask, "k2")


def test_algo_config_defaults_and_errors():
    cfg = AlgoConfig()
    assert (cfg.algorithm, cfg.gamma, cfg.lam, cfg.clip, cfg.kl_coef, cfg.group_size) == (
        "ppo", 1.0, 0.95, 0.2, 0.05, 4)
    with pytest.raises(ValueError, match="algorithm = 'dpo'"):
        AlgoConfig(algorithm="dpo")
    with pytest.raises(ValueError, match="lam = 1.5"):
        AlgoConfig(lam=1.5)
    with pytest.raises(ValueError, match="group_size = 1"):
        AlgoConfig(algorithm="grpo", group_size=1)
    with pytest.raises(ValueError, match="temperature = 0"):
        AlgoConfig(temperature=0)
