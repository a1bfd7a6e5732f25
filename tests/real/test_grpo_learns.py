"""A few GRPO iterations with the "target-byte" reward visibly raise the mean reward."""

from __future__ import annotations

import pytest
import torch

from real.algos import AlgoConfig, grpo_advantages, token_advantages
from real.data import generate_problems, prompt_text, reward_fn
from real.engines.base import make_batch
from real.engines.torch_engine import TorchInference, TorchRollout, TorchTrainer
from real.tokenizer import ByteTokenizer

pytestmark = pytest.mark.usefixtures("one_thread")


def test_grpo_raises_the_target_byte_reward(small):
    cfg = AlgoConfig(algorithm="grpo", lr=2e-2, group_size=4, max_new_tokens=8)
    tok, reward = ByteTokenizer(), reward_fn("target-byte")
    problems = [p for p in generate_problems(4, seed=0) for _ in range(cfg.group_size)]
    prompts = [tok.encode(prompt_text(p)) for p in problems]
    rollout, reference = TorchRollout(small, 0), TorchInference("reference", small, 0)
    actor = TorchTrainer("actor", small, 0, cfg=cfg)
    means = []
    for it in range(20):
        responses = rollout.generate(prompts, cfg.max_new_tokens, cfg.temperature, seed=it)
        scores = torch.tensor([reward(tok.decode(r), p) for r, p in zip(responses, problems, strict=True)])
        means.append(scores.mean().item())
        batch = make_batch(prompts, responses)
        advantages = token_advantages(grpo_advantages(scores, cfg.group_size), batch.response_mask)
        actor.forward_backward(batch, {"advantages": advantages,
                                       "ref_logp": reference.log_probs(batch)})
        actor.step()
        rollout.update_weights(actor.state_dict())
    first, last = sum(means[:3]) / 3, sum(means[-3:]) / 3
    assert first < 0.05 and last > first + 0.3, means
