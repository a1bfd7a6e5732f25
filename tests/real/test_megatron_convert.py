"""HF <-> Megatron weight conversion: pure tensors, no megatron-core needed."""

from __future__ import annotations

import pytest
import torch

from hetrl.errors import SpecError
from real.engines.megatron_convert import fuse_qkv, hf_to_megatron, megatron_to_hf, split_qkv
from real.model import TinyModelSpec, build_causal_lm, build_value_model

SPECS = [TinyModelSpec(hidden=32, layers=2, heads=2, kv_heads=1, head_dim=16, ffn=64),
         TinyModelSpec(hidden=48, layers=3, heads=6, kv_heads=2, head_dim=8, ffn=40),
         TinyModelSpec(hidden=32, layers=1, heads=4, kv_heads=4, head_dim=8, ffn=24)]


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"h{s.heads}g{s.kv_heads}")
@pytest.mark.parametrize("build", [build_causal_lm, build_value_model], ids=["lm", "value"])
def test_round_trip_is_exact(spec, build):
    hf = build(spec, 3).state_dict()
    meg = hf_to_megatron(hf, spec)
    _equal(megatron_to_hf(meg, spec), hf)
    # Megatron's per-layer tensor count: qkv, proj, q/k norms, 2 layer norms, fc1, fc2
    per_layer = [k for k in meg if k.startswith("decoder.layers.0.")]
    assert len(per_layer) == 8
    assert meg["decoder.layers.0.self_attention.linear_qkv.weight"].shape == (
        (spec.heads + 2 * spec.kv_heads) * spec.head_dim, spec.hidden)
    assert meg["decoder.layers.0.mlp.linear_fc1.weight"].shape == (2 * spec.ffn, spec.hidden)
    assert ("output_layer.bias" in meg) == (build is build_value_model)


def test_qkv_interleaves_query_groups():
    """Group g's rows: its P query heads, then its key head, then its value head."""
    spec = SPECS[1]  # 6 heads, 2 groups of 3, head_dim 8
    D, H = spec.head_dim, spec.hidden
    q = torch.arange(spec.heads).repeat_interleave(D)[:, None].expand(-1, H).float()
    k = 100 + torch.arange(spec.kv_heads).repeat_interleave(D)[:, None].expand(-1, H).float()
    v = 200 + torch.arange(spec.kv_heads).repeat_interleave(D)[:, None].expand(-1, H).float()
    rows = fuse_qkv(q, k, v, spec)[:, 0].view(-1, D)[:, 0].tolist()
    assert rows == [0, 1, 2, 100, 200, 3, 4, 5, 101, 201]
    assert all(torch.equal(a, b) for a, b in zip(split_qkv(fuse_qkv(q, k, v, spec), spec),
                                                 (q, k, v), strict=True))


def test_gate_comes_before_up():
    spec = SPECS[0]
    hf = build_causal_lm(spec, 0).state_dict()
    fc1 = hf_to_megatron(hf, spec)["decoder.layers.1.mlp.linear_fc1.weight"]
    assert torch.equal(fc1[: spec.ffn], hf["model.layers.1.mlp.gate_proj.weight"])
    assert torch.equal(fc1[spec.ffn:], hf["model.layers.1.mlp.up_proj.weight"])


def test_unknown_and_extra_state_keys():
    spec = SPECS[0]
    hf = build_causal_lm(spec, 0).state_dict()
    with pytest.raises(SpecError, match="rotary"):
        hf_to_megatron({**hf, "model.rotary.weight": torch.zeros(1)}, spec)
    meg = hf_to_megatron(hf, spec)
    meg["decoder.layers.0.self_attention.linear_qkv._extra_state"] = None
    _equal(megatron_to_hf(meg, spec), hf)
    with pytest.raises(SpecError, match="decoder.layers.0.mlp.router"):
        megatron_to_hf({**meg, "decoder.layers.0.mlp.router.weight": torch.zeros(1)}, spec)
    with pytest.raises(SpecError, match="q_proj"):
        fuse_qkv(torch.zeros(8, spec.hidden), torch.zeros(16, spec.hidden),
                 torch.zeros(16, spec.hidden), spec)


MOE = TinyModelSpec(hidden=32, layers=2, heads=2, kv_heads=1, head_dim=16, ffn=64, experts=4,
                    top_k=2, expert_ffn=16)


@pytest.mark.parametrize("build", [build_causal_lm, build_value_model], ids=["lm", "value"])
def test_moe_round_trip_and_expert_slices(build):
    """A Qwen3-MoE layer: the router renamed, transformers' stacked experts split into one
    linear_fc1 (gate rows, then up rows) and linear_fc2 per expert; exact both ways; an
    expert-parallel rank keeps its experts renumbered from 0, and the gathered names are the
    whole model's."""
    from real.engines.megatron_parallel import expert_slice, global_expert_name

    hf = build(MOE, 3).state_dict()
    meg = hf_to_megatron(hf, MOE)
    _equal(megatron_to_hf(meg, MOE), hf)
    gate_up = hf["model.layers.1.mlp.experts.gate_up_proj"]
    assert torch.equal(meg["decoder.layers.1.mlp.experts.local_experts.2.linear_fc1.weight"],
                       gate_up[2])
    assert torch.equal(meg["decoder.layers.1.mlp.router.weight"], hf["model.layers.1.mlp.gate.weight"])
    mine = expert_slice(meg, 2, 1, MOE.experts)  # rank 1 of 2: experts 2 and 3 as 0 and 1
    name = "decoder.layers.1.mlp.experts.local_experts.0.linear_fc1.weight"
    assert torch.equal(mine[name], gate_up[2])
    assert not any("local_experts.2." in k for k in mine)
    assert global_expert_name(name, 1, 2) == name.replace("experts.0.", "experts.2.")
    assert global_expert_name("decoder.layers.1.mlp.router.weight", 1, 2) is None
    with pytest.raises(SpecError, match="every expert"):
        megatron_to_hf(mine, MOE)
