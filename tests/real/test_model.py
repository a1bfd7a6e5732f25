"""Tiny Qwen3 models: seeded init, parameter count vs the cost model, pipeline stages."""

from __future__ import annotations

import copy

import pytest
import torch

from real.model import (
    TinyModelSpec,
    build_causal_lm,
    build_value_model,
    model_shape,
    qk_norm_params,
    split_stages,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_init_is_seeded_and_leaves_the_global_rng_alone(small):
    state = torch.get_rng_state()
    a, b, c = build_causal_lm(small, 0), build_causal_lm(small, 0), build_causal_lm(small, 1)
    assert torch.equal(torch.get_rng_state(), state)
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(x, y), name
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)
    v1, v2 = build_value_model(small, 5), build_value_model(small, 5)
    assert torch.equal(v1.value_head.weight, v2.value_head.weight)


def test_parameter_count_matches_the_cost_model_up_to_qk_norms():
    # ModelShape counts attention, MLP, two RMSNorms per layer, embeddings, head and final norm.
    # Qwen3 also normalises q and k per head (head_dim weights each): 2 * 4 * 16 = 128 more,
    # 0.07% of 181,184, which the cost model treats as negligible.
    spec = TinyModelSpec()
    shape = model_shape(spec)
    per_layer = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64
    assert shape.params == 4 * per_layer + 2 * 259 * 64 + 64 == 181_184
    assert qk_norm_params(spec) == 128
    assert _count(build_causal_lm(spec, 0)) == shape.params + qk_norm_params(spec)
    # The value model swaps the lm_head (259 x 64) for a 64 -> 1 linear with bias.
    assert _count(build_value_model(spec, 0)) == shape.params + 128 - 259 * 64 + 65


def test_spec_errors():
    with pytest.raises(ValueError, match="kv_heads = 3"):
        TinyModelSpec(kv_heads=3)
    with pytest.raises(ValueError, match="spec.layers = 0"):
        TinyModelSpec(layers=0)


def _right_padded(batch: int, length: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 259, (batch, length), generator=g)
    lengths = torch.tensor([length, length - 3, 2])[:batch]
    mask = (torch.arange(length)[None] < lengths[:, None]).long()
    return ids * mask, mask


def test_stages_chain_to_the_full_model_logits_and_gradients():
    spec = TinyModelSpec()   # 4 layers: split 1 + 2 + 1
    model = build_causal_lm(spec, 0)
    reference = copy.deepcopy(model)
    ids, mask = _right_padded(3, 10)
    stages = split_stages(model, [0, 1, 3, 4])
    assert [(s.first, s.last) for s in stages] == [(True, False), (False, False), (False, True)]
    x = ids
    for stage in stages:
        x = stage(x)
    full = reference(input_ids=ids).logits
    assert torch.allclose(x, full, atol=1e-5)
    # With a padding mask the full model gives the same logits on the real tokens.
    padded = reference(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    assert torch.allclose(x[real], padded[real], atol=1e-5)

    weights = torch.randn(full.shape, generator=torch.Generator().manual_seed(1))
    (x * weights).sum().backward()
    (full * weights).sum().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, atol=1e-5), name


def test_value_model_stages(small):
    model = build_value_model(small, 0)
    ids, mask = _right_padded(3, 8)
    first, last = split_stages(model, [0, 1, 2])
    out = last(first(ids))
    assert out.shape == (3, 8)
    assert torch.allclose(out, model(ids), atol=1e-5)
    assert torch.allclose(out[mask.bool()], model(ids, mask)[mask.bool()], atol=1e-5)


def test_stage_state_dicts_merge_into_the_full_one(small):
    for model in (build_causal_lm(small, 0), build_value_model(small, 0)):
        merged = {}
        for stage in split_stages(model, [0, 1, 2]):
            keys = set(stage.state_dict())
            assert not keys & set(merged)
            merged.update(stage.state_dict())
        full = model.state_dict()
        assert merged.keys() == full.keys()
        assert all(torch.equal(merged[k], full[k]) for k in full)


def test_split_stages_errors(small):
    model = build_causal_lm(small, 0)
    for bad, match in (([0, 0, 2], "strictly increase"), ([1, 2], "start at 0"),
                       ([0, 3], "end at the layer count"), ([0], "at least two")):
        with pytest.raises(ValueError, match=match):
            split_stages(model, bad)
    first, last = split_stages(model, [0, 1, 2])
    with pytest.raises(ValueError, match="input_ids"):
        first(torch.zeros(1, 4, 32))
    with pytest.raises(ValueError, match="hidden states"):
        last(torch.zeros(1, 4, dtype=torch.long))
