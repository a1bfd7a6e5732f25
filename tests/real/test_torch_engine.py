"""Torch engines on CPU: generation, scoring, training, and pipeline = whole-model updates."""

from __future__ import annotations

import math

import pytest
import torch

from real.algos import AlgoConfig, gae, last_token_rewards, token_log_probs
from real.engines.base import (
    InferenceEngine,
    RolloutEngine,
    TrainingEngine,
    make_batch,
    select_rows,
    split_indices,
    token_weights,
)
from real.engines.torch_engine import TorchInference, TorchRollout, TorchTrainer
from real.tokenizer import EOS, ByteTokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

TOK = ByteTokenizer()
PROMPTS = [TOK.encode("Q: 2+2?\nA:"), TOK.encode("hi"), TOK.encode("x")]


def _batch(spec, seed=0, n=4, new=6):
    rollout = TorchRollout(spec, seed)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(n)]
    return make_batch(prompts, rollout.generate(prompts, new, 1.0, seed=seed))


def test_engines_satisfy_the_protocols(small):
    assert isinstance(TorchRollout(small, 0), RolloutEngine)
    assert isinstance(TorchInference("reference", small, 0), InferenceEngine)
    assert isinstance(TorchTrainer("actor", small, 0), TrainingEngine)


def test_greedy_generation_matches_a_plain_loop(small):
    """Batched, left-padded, KV-cached decoding = one prompt at a time without a cache."""
    rollout = TorchRollout(small, 0)
    responses = rollout.generate(PROMPTS, 8, temperature=0.0)
    for prompt, response in zip(PROMPTS, responses, strict=True):
        ids, expected = list(prompt), []
        while len(expected) < 8 and EOS not in expected:
            nxt = int(rollout.model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
            expected.append(nxt)
            ids.append(nxt)
        assert response == expected


def test_sampling_is_seeded_and_weights_load(small):
    a, b = TorchRollout(small, 0), TorchRollout(small, 1)
    first = a.generate(PROMPTS, 6, 1.0, seed=3)
    assert first == a.generate(PROMPTS, 6, 1.0, seed=3)
    assert first != a.generate(PROMPTS, 6, 1.0, seed=4)
    b.update_weights(a.state_dict())
    assert b.generate(PROMPTS, 6, 1.0, seed=3) == first
    with pytest.raises(ValueError, match="max_new_tokens = 600"):
        a.generate(PROMPTS, 600)


def test_generation_stops_at_eos_and_keeps_it(small):
    rollout = TorchRollout(small, 0)
    head = torch.nn.Linear(small.hidden, small.vocab)       # logits = bias: token 50 or EOS
    torch.nn.init.zeros_(head.weight)
    head.bias.data.fill_(-30.0)
    head.bias.data[50], head.bias.data[EOS] = 0.0, -0.5
    rollout.model.lm_head = head
    responses = rollout.generate(PROMPTS * 4, 8, 1.0, seed=0)
    for r in responses:
        assert 1 <= len(r) <= 8 and set(r) <= {50, EOS} and EOS not in r[:-1]
    assert len({len(r) for r in responses}) > 2               # rows finish at different steps
    assert any(r[-1] == EOS for r in responses)


def test_inference_roles(small):
    batch = _batch(small)
    ref = TorchInference("reference", small, 0)
    logp = ref.log_probs(batch)
    full = token_log_probs(ref.model(input_ids=batch.input_ids).logits, batch.input_ids)
    assert torch.allclose(logp, full * batch.response_mask, atol=1e-5)
    assert (logp[batch.response_mask == 0] == 0).all() and (logp[batch.response_mask == 1] < 0).all()

    critic = TorchInference("critic", small, 1)
    values = critic.values(batch)
    raw = critic.model(batch.input_ids)
    assert torch.allclose(values[:, 1:], raw[:, :-1] * batch.response_mask[:, 1:], atol=1e-6)

    rm = TorchInference("reward", small, 2)
    scores = rm.scores(batch)
    assert scores.shape == (batch.size,)
    for i in range(batch.size):          # scored alone, without padding, the same number
        alone = rm.model(batch.input_ids[i: i + 1, : batch.lengths[i]])[0, -1]
        assert scores[i].item() == pytest.approx(alone.item(), abs=1e-5)
    with pytest.raises(ValueError, match="needs the critic role"):
        rm.values(batch)
    with pytest.raises(ValueError, match="role = 'policy'"):
        TorchInference("policy", small, 0)
    # the actor's old log-probs (recompute_logprobs): the same model as the reference of one seed
    actor = TorchInference("actor", small, 0)
    assert torch.equal(actor.log_probs(batch), logp)
    with pytest.raises(ValueError, match="needs the critic role"):
        actor.values(batch)


def _actor_extras(spec, batch):
    ref = TorchInference("reference", spec, 7).log_probs(batch)
    g = torch.Generator().manual_seed(0)
    adv = torch.randn(batch.input_ids.shape, generator=g) * batch.response_mask
    return {"advantages": adv, "ref_logp": ref}


def _critic_extras(spec, batch):
    values = TorchInference("critic", spec, 7).values(batch)
    rewards = last_token_rewards(torch.tensor([1.0, 0.0, 0.5, 1.0])[: batch.size], batch.response_mask)
    _, returns = gae(rewards, values, batch.response_mask, 1.0, 0.95)
    return {"returns": returns, "old_values": values}


def test_trainer_updates_and_reports(small):
    batch = _batch(small)
    trainer = TorchTrainer("actor", small, 0, cfg=AlgoConfig(kl_coef=0.1))
    before = trainer.state_dict()
    stats = trainer.forward_backward(batch, _actor_extras(small, batch))
    assert set(stats) == {"loss", "policy_loss", "kl", "clip_frac", "approx_kl"}
    assert stats["clip_frac"] == 0.0 and stats["approx_kl"] == 0.0   # old_logp = current
    trainer.step()
    after = trainer.state_dict()
    assert after.keys() == before.keys()
    assert not torch.equal(after["lm_head.weight"], before["lm_head.weight"])
    assert all(p.grad is None for p in trainer.parameters())
    with pytest.raises(ValueError, match="'advantages'"):
        trainer.forward_backward(batch, {"ref_logp": torch.zeros(batch.input_ids.shape)})
    with pytest.raises(ValueError, match="role = 'reward'"):
        TorchTrainer("reward", small, 0)


def test_micro_batches_accumulate_to_the_full_batch_gradient(small):
    batch = _batch(small, n=5)
    extras = _actor_extras(small, batch)
    whole, split = TorchTrainer("actor", small, 0), TorchTrainer("actor", small, 0)
    whole.forward_backward(batch, extras)
    parts = split_indices(batch.size, 3)
    scales = token_weights([batch.select(rows) for rows in parts])
    for rows, scale in zip(parts, scales, strict=True):
        split.forward_backward(batch.select(rows), select_rows(extras, rows), scale)
    for p, q in zip(whole.parameters(), split.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, atol=1e-6)


@pytest.mark.parametrize("role", ["actor", "critic"])
def test_pipeline_stages_update_like_the_whole_model(small, role):
    """Two stage trainers over two micro-batches = one whole-model trainer over the batch."""
    batch = _batch(small)
    extras = (_actor_extras if role == "actor" else _critic_extras)(small, batch)
    cfg = AlgoConfig(lr=1e-3, critic_lr=1e-3, grad_clip=0.5)   # small enough to clip
    whole = TorchTrainer(role, small, 3, cfg=cfg)
    whole.forward_backward(batch, extras)
    norm = math.sqrt(whole.grad_sq_norm())
    assert norm > cfg.grad_clip
    whole.step()

    stages = [TorchTrainer(role, small, 3, cfg=cfg, stage=s, stages=[0, 1, 2]) for s in (0, 1)]
    parts = split_indices(batch.size, 2)
    scales = token_weights([batch.select(rows) for rows in parts])
    for m, (rows, scale) in enumerate(zip(parts, scales, strict=True)):
        micro, ext = batch.select(rows), select_rows(extras, rows)
        hidden = stages[0].stage_forward(m, micro.input_ids, micro)
        loss = stages[1].stage_forward(m, hidden, micro, ext, scale)
        assert isinstance(loss, float)
    for m in range(len(parts)):
        grad = stages[1].stage_backward(m)
        assert stages[0].stage_backward(m, grad) is None
    global_norm = math.sqrt(sum(s.grad_sq_norm() for s in stages))
    assert global_norm == pytest.approx(norm, rel=1e-5)
    for s in stages:
        s.step(global_norm)

    merged = {**stages[0].stage_state_dict(), **stages[1].stage_state_dict()}
    expected = whole.state_dict()
    assert merged.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.allclose(merged[key], value, atol=1e-5), key
    with pytest.raises(ValueError, match="stage_state_dict"):
        stages[0].state_dict()


def test_pipeline_errors(small):
    batch = _batch(small, n=2)
    with pytest.raises(ValueError, match="stage and stages"):
        TorchTrainer("actor", small, 0, stages=[0, 1, 2])
    with pytest.raises(ValueError, match="stage = 2"):
        TorchTrainer("actor", small, 0, stage=2, stages=[0, 1, 2])
    first = TorchTrainer("actor", small, 0, stage=0, stages=[0, 1, 2])
    first.stage_forward(0, batch.input_ids, batch)
    with pytest.raises(ValueError, match="already in flight"):
        first.stage_forward(0, batch.input_ids, batch)
    with pytest.raises(ValueError, match="grad_output"):
        first.stage_backward(0)
    with pytest.raises(ValueError, match="still pending"):
        first.step()
    with pytest.raises(ValueError, match="use stage_forward"):
        first.forward_backward(batch, {})


def test_one_ppo_iteration_trains_the_critic(small):
    """Rollout -> reward model -> critic -> GAE -> actor and critic updates, end to end."""
    cfg = AlgoConfig(algorithm="ppo", critic_lr=1e-2)
    batch = _batch(small)
    scores = TorchInference("reward", small, 2).scores(batch)
    values = TorchInference("critic", small, 1).values(batch)
    ref = TorchInference("reference", small, 0).log_probs(batch)
    adv, ret = gae(last_token_rewards(scores, batch.response_mask), values,
                   batch.response_mask, cfg.gamma, cfg.lam)
    actor = TorchTrainer("actor", small, 0, cfg=cfg)
    stats = actor.forward_backward(batch, {"advantages": adv, "ref_logp": ref})
    assert stats["kl"] == pytest.approx(0.0, abs=1e-6)      # actor = reference at the start
    actor.step()
    critic = TorchTrainer("critic", small, 1, cfg=cfg)
    # Fit returns shifted by 1; old_values default to the current values (no clipping).
    extras = {"returns": ret + 1.0 * batch.response_mask}
    losses = []
    for _ in range(8):
        losses.append(critic.forward_backward(batch, extras)["loss"])
        critic.step()
    assert losses[-1] < 0.5 * losses[0]
