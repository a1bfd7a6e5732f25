"""Model shapes: derived parameter counts checked by hand, Hugging Face configs, errors."""

from __future__ import annotations

import json

import pytest

from hetrl.errors import SpecError
from hetrl.spec.model import ModelShape, model_preset, model_presets, resolve_model


def test_qwen3_8b_parameter_count_by_hand():
    m = model_preset("Qwen3-8B")
    attn = 2 * 4096 * (32 * 128) + 2 * 4096 * (8 * 128)  # q,o + k,v = 41,943,040
    mlp = 3 * 4096 * 12288                                # 150,994,944
    per_layer = attn + mlp + 2 * 4096                     # + two RMSNorms = 192,946,176
    assert m.params_per_layer == per_layer == 192_946_176
    assert m.embedding_params == 2 * 151936 * 4096        # untied: embedding + head
    assert m.params == 36 * per_layer + 2 * 151936 * 4096 + 4096 == 8_190_726_144


def test_llama31_8b_parameter_count_matches_published():
    # Meta's published count for Llama-3.1-8B is 8,030,261,248.
    m = model_preset("Llama-3.1-8B")
    assert m.params == 8_030_261_248


def test_qwen3_4b_ties_embeddings():
    m = model_preset("Qwen3-4B")
    assert m.tied_embeddings
    assert m.embedding_params == 151936 * 2560            # counted once
    per_layer = 2 * 2560 * 4096 + 2 * 2560 * 1024 + 3 * 2560 * 9728 + 2 * 2560
    assert m.params == 36 * per_layer + 151936 * 2560 + 2560 == 4_022_458_880
    untied = ModelShape(**{**m.to_dict(), "tied_embeddings": False})
    assert untied.params - m.params == 151936 * 2560


def test_kv_bytes_per_token():
    # K and V, 36 layers x 8 KV heads x 128 dims, 2 bytes each (bf16): 147,456 bytes.
    assert model_preset("Qwen3-8B").kv_bytes_per_token == 2 * 36 * 8 * 128 * 2 == 147_456


def test_presets_are_case_insensitive_and_unknown_names_list_known():
    assert model_preset("qwen3-14b").name == "Qwen3-14B"
    assert {"Qwen3-4B", "Qwen3-8B", "Qwen3-14B", "Llama-3.1-8B"} <= set(model_presets())
    with pytest.raises(SpecError) as err:
        model_preset("GPT-5", field="models.actor")
    assert err.value.field == "models.actor" and "Qwen3-8B" in str(err.value)


QWEN3_8B_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "head_dim": 128,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_attention_heads": 32,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
    "tie_word_embeddings": False,
    "vocab_size": 151936,
}


def test_from_hf_config_reads_a_config_json(tmp_path):
    path = tmp_path / "Qwen3-8B" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(QWEN3_8B_CONFIG))
    m = ModelShape.from_hf_config(path)
    assert m.name == "Qwen3-8B"  # the directory name when the config has no _name_or_path
    assert m == model_preset("Qwen3-8B")
    assert m.params == 8_190_726_144


def test_from_hf_config_defaults_kv_heads_and_head_dim(tmp_path):
    # A Llama-2-style config: no num_key_value_heads (MHA), no head_dim (hidden / heads).
    cfg = {"hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
           "num_hidden_layers": 32, "vocab_size": 32000}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    m = ModelShape.from_hf_config(path, name="llama2-7b")
    assert (m.name, m.kv_heads, m.head_dim, m.tied_embeddings) == ("llama2-7b", 32, 128, False)
    assert m.params == 6_738_415_616  # Llama-2-7B's published count


def test_from_hf_config_errors_name_the_key(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({k: v for k, v in QWEN3_8B_CONFIG.items() if k != "vocab_size"}))
    with pytest.raises(SpecError) as err:
        ModelShape.from_hf_config(path)
    assert err.value.field == "hf_config[config.json].vocab_size"
    path.write_text("{not json")
    with pytest.raises(SpecError, match="cannot read JSON"):
        ModelShape.from_hf_config(path)


def test_resolve_model_accepts_name_mapping_and_hf_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_8B_CONFIG))
    by_name = resolve_model("Qwen3-8B")
    by_dict = resolve_model(by_name.to_dict())
    by_file = resolve_model({"hf_config": "config.json", "name": "Qwen3-8B"}, base_dir=tmp_path)
    assert by_name == by_dict == by_file


@pytest.mark.parametrize("name", sorted(model_presets()))
def test_from_dict_round_trip(name):
    m = model_preset(name)
    assert ModelShape.from_dict(m.to_dict()) == m


def test_from_dict_parses_string_booleans_and_defaults_name():
    d = {k: v for k, v in model_preset("Qwen3-4B").to_dict().items() if k != "name"}
    d["tied_embeddings"] = "true"
    m = ModelShape.from_dict(d)
    assert m.name == "custom" and m.tied_embeddings is True


SHAPE = model_preset("Qwen3-8B").to_dict()


@pytest.mark.parametrize(("change", "field", "problem"), [
    ({"kv_heads": 6}, "kv_heads", "must divide heads (32)"),
    ({"layers": 0}, "layers", "must be >= 1"),
    ({"hidden": -4096}, "hidden", "must be >= 1"),
    ({"heads": 32.0}, "heads", "must be an integer"),
    ({"tied_embeddings": "maybe"}, "tied_embeddings", "true or false"),
])
def test_bad_shapes_are_rejected(change, field, problem):
    with pytest.raises(SpecError) as err:
        ModelShape.from_dict({**SHAPE, **change})
    assert err.value.field.endswith(f".{field}")
    assert problem in str(err.value)


def test_missing_and_unknown_keys():
    with pytest.raises(SpecError) as err:
        ModelShape.from_dict({k: v for k, v in SHAPE.items() if k != "ffn"}, field="models.critic")
    assert err.value.field == "models.critic.ffn"
    with pytest.raises(SpecError) as err:
        ModelShape.from_dict({**SHAPE, "experts": 8})
    assert err.value.field == "model.experts" and "unknown key" in str(err.value)
