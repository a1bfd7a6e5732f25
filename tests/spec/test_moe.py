"""Mixture-of-experts and MLA model shapes: derived counts, presets, files and bad input."""

from __future__ import annotations

import json

import pytest

from hetrl.errors import SpecError
from hetrl.spec.model import ModelShape, model_preset, resolve_model
from hetrl.spec.moe import MLA, MoE


@pytest.mark.parametrize(("name", "total", "active"), [
    # the model cards' counts (hetrl/data/moe_models.yaml): derived, never typed in
    ("Qwen3-30B-A3B", 30.5e9, 3.3e9),
    ("Qwen3-235B-A22B", 235e9, 22e9),
    ("DeepSeek-V3", 671e9, 37e9),
])
def test_presets_match_the_model_cards(name: str, total: float, active: float) -> None:
    m = model_preset(name)
    assert m.params == pytest.approx(total, rel=0.02)
    assert m.active_params == pytest.approx(active, rel=0.03)


def test_qwen3_30b_a3b_by_hand() -> None:
    m = model_preset("Qwen3-30B-A3B")
    h = 2048
    attn = 2 * h * 32 * 128 + 2 * h * 4 * 128
    experts = 128 * 3 * h * 768
    layer = attn + 2 * h + h * 128 + experts  # norms, router (h x 128), experts
    assert m.moe_layers == 48
    assert m.expert_params == 48 * experts
    assert m.params == 48 * layer + 2 * 151936 * h + h
    assert m.active_params == m.params - 48 * experts * (1 - 8 / 128)


def test_deepseek_v3_dense_layers_and_mla() -> None:
    m = model_preset("DeepSeek-V3")
    assert m.moe_layers == 58  # 61 layers, the first 3 dense
    assert m.moe_layers_in(0, 3) == 0 and m.moe_layers_in(0, 4) == 1
    assert m.kv_values_per_token_layer == 512 + 64  # the latent and the positional key
    assert m.kv_bytes_per_token == 61 * 576 * 2


def test_layer_frequency_counts_every_other_layer() -> None:
    moe = MoE(experts=8, top_k=2, expert_ffn=64, dense_layers=1, layer_freq=2)
    assert [moe.is_moe_layer(i) for i in range(6)] == [False, True, False, True, False, True]
    assert moe.moe_layers_in(0, 6) == 3 and moe.moe_layers_in(2, 5) == 1


def test_a_single_expert_has_no_router() -> None:
    dense = model_preset("Qwen3-8B")
    one = ModelShape(**{**dense.to_dict(), "moe": MoE(1, 1, dense.ffn)})
    assert one.params == dense.params and one.active_params == dense.params


def test_round_trip_and_dense_dicts_unchanged() -> None:
    m = model_preset("DeepSeek-V3")
    assert ModelShape.from_dict(json.loads(json.dumps(m.to_dict()))) == m
    assert "moe" not in model_preset("Qwen3-8B").to_dict()  # dense dicts read as before


@pytest.mark.parametrize(("moe", "field", "limit"), [
    ({"experts": 8, "top_k": 9, "expert_ffn": 64}, "model.moe.top_k", "must be <= experts (8)"),
    ({"experts": 8, "top_k": 2, "expert_ffn": 64, "shared_ffn": 128}, "model.moe.shared_ffn",
     "a shared-expert width without shared experts"),
    ({"experts": 0, "top_k": 1, "expert_ffn": 64}, "model.moe.experts", ">= 1"),
    ({"experts": 8, "top_k": 2, "expert_ffn": 64, "router": "argmax"}, "model.moe.router",
     "must be one of"),
    ({"experts": 8, "top_k": 2}, "model.moe.expert_ffn", "is required"),
    ({"experts": 8, "top_k": 2, "expert_ffn": 64, "capacity": 2}, "model.moe.capacity",
     "unknown key"),
])
def test_bad_moe_blocks_name_field_value_and_limit(moe: dict, field: str, limit: str) -> None:
    shape = {"layers": 4, "hidden": 64, "ffn": 128, "heads": 4, "kv_heads": 2, "head_dim": 16,
             "vocab": 100, "moe": moe}
    with pytest.raises(SpecError) as exc:
        resolve_model(shape)
    assert exc.value.field == field and limit in str(exc.value)


def test_dense_layers_must_leave_an_moe_layer() -> None:
    with pytest.raises(SpecError, match="dense_layers = 4: must be < layers"):
        ModelShape.from_dict({"layers": 4, "hidden": 64, "ffn": 128, "heads": 4, "kv_heads": 2,
                              "head_dim": 16, "vocab": 100,
                              "moe": {"experts": 4, "top_k": 1, "expert_ffn": 32,
                                      "dense_layers": 4}})


def test_hugging_face_configs(tmp_path) -> None:
    qwen = {"num_hidden_layers": 48, "hidden_size": 2048, "intermediate_size": 6144,
            "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
            "decoder_sparse_step": 1, "mlp_only_layers": [], "num_attention_heads": 32,
            "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
            "tie_word_embeddings": False}
    (tmp_path / "qwen.json").write_text(json.dumps(qwen))
    m = ModelShape.from_hf_config(tmp_path / "qwen.json", name="Qwen3-30B-A3B")
    assert m == model_preset("Qwen3-30B-A3B")
    dsv3 = {"num_hidden_layers": 61, "hidden_size": 7168, "intermediate_size": 18432,
            "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
            "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1,
            "scoring_func": "sigmoid", "num_attention_heads": 128, "num_key_value_heads": 128,
            "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280,
            "tie_word_embeddings": False}
    (tmp_path / "dsv3.json").write_text(json.dumps(dsv3))
    assert ModelShape.from_hf_config(tmp_path / "dsv3.json", name="DeepSeek-V3") == \
        model_preset("DeepSeek-V3")


def test_mla_weights_by_hand() -> None:
    mla = MLA(kv_lora_rank=512, rope_dim=64, v_head_dim=128, q_lora_rank=1536)
    h, heads = 7168, 128
    q = h * 1536 + 1536 + 1536 * heads * 192
    kv = h * 576 + 512 + 512 * heads * 256
    assert mla.attn_params(h, heads, 128) == q + kv + heads * 128 * h
