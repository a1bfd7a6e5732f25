"""The engine registry and the vLLM weight layout (no GPU, no vLLM, no megatron-core needed)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from hetrl.errors import HetrlError, SpecError
from real.algos import AlgoConfig
from real.engines import ENGINES, build_engine, engine_class, validate_engines
from real.engines.base import InferenceEngine, RolloutEngine, TrainingEngine
from real.engines.torch_engine import TorchInference, TorchRollout, TorchTrainer
from real.engines.vllm_ext import hf_to_vllm, request_seed, vllm_to_hf
from real.model import TinyModelSpec, build_causal_lm


def test_registry_names_every_kind_and_builds_torch(small):
    assert set(ENGINES) == {"torch", "vllm", "megatron"}
    assert engine_class("generation") is TorchRollout
    assert engine_class("inference", "torch") is TorchInference
    assert engine_class("training", "torch") is TorchTrainer
    algo = AlgoConfig(temperature=0.7)
    gen = build_engine("generation", "torch", "actor", small, 0, "cpu", algo)
    inf = build_engine("inference", "torch", "reference", small, 0, "cpu", algo)
    tr = build_engine("training", "torch", "actor", small, 0, "cpu", algo, stage=1, stages=[0, 1, 2])
    assert isinstance(gen, RolloutEngine) and isinstance(inf, InferenceEngine)
    assert isinstance(tr, TrainingEngine) and inf.temperature == 0.7 and tr.pipeline


def test_validate_engines_names_field_and_value():
    assert validate_engines({"generation": "vllm", "training": "megatron"}, "cuda") == {
        "generation": "vllm", "training": "megatron"}
    with pytest.raises(SpecError, match=r"engines.generation.*megatron.*choose one of torch, vllm"):
        validate_engines({"generation": "megatron"}, "cuda")
    with pytest.raises(SpecError, match=r"engines.rollout.*unknown task kind"):
        validate_engines({"rollout": "torch"})
    with pytest.raises(SpecError, match=r"engines.generation.*vllm.*needs device cuda"):
        validate_engines({"generation": "vllm"}, "cpu")
    assert validate_engines({"training": "megatron"}, "cpu") == {"training": "megatron"}


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_vllm_engine_without_vllm_says_how_to_install():
    with pytest.raises(HetrlError, match=r"needs vLLM and a CUDA GPU: pip install -e '.\[gpu\]'"):
        engine_class("generation", "vllm")


@pytest.mark.skipif(importlib.util.find_spec("megatron") is not None,
                    reason="megatron-core is installed here")
def test_megatron_engine_without_megatron_says_how_to_install(small):
    with pytest.raises(HetrlError, match=r"needs megatron-core: pip install -e '.\[gpu\]'"):
        build_engine("training", "megatron", "actor", small, 0, "cpu", AlgoConfig())


@pytest.mark.parametrize("spec", [TinyModelSpec(hidden=32, layers=2, heads=2, kv_heads=1,
                                                head_dim=16, ffn=64), TinyModelSpec()])
def test_vllm_layout_round_trip(spec):
    hf = build_causal_lm(spec, 5).state_dict()
    fused = hf_to_vllm(hf, spec)
    assert fused["model.layers.0.self_attn.qkv_proj.weight"].shape == (
        (spec.heads + 2 * spec.kv_heads) * spec.head_dim, spec.hidden)
    assert fused["model.layers.1.mlp.gate_up_proj.weight"].shape == (2 * spec.ffn, spec.hidden)
    assert not any(k.endswith((".q_proj.weight", ".up_proj.weight")) for k in fused)
    assert fused["lm_head.weight"].shape == (320, spec.hidden)  # 259 padded to 64s
    assert not fused["model.embed_tokens.weight"][spec.vocab:].any()
    back = vllm_to_hf(fused, spec)
    assert sorted(back) == sorted(hf)
    assert all(torch.equal(back[k], hf[k]) for k in hf)


def test_request_seeds_are_deterministic_and_distinct():
    seeds = [request_seed(3, i) for i in range(64)]
    assert seeds == [request_seed(3, i) for i in range(64)]
    assert len(set(seeds)) == 64 and all(0 <= s < 2**63 for s in seeds)
    assert request_seed(4, 0) != request_seed(3, 0)
