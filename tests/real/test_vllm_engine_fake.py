"""VLLMRollout's adapter logic against a stand-in ``vllm`` module (no vLLM, no GPU).

The stand-in mimics the few vLLM 0.33 calls the engine makes (``LLM(...)``, ``generate`` with
``TokensPrompt`` and per-request ``SamplingParams``, ``collective_rpc`` into the worker
extension, ``reset_prefix_cache``) and holds weights in vLLM's layout (fused, vocabulary padded).
It checks what the engine sends and how it reads answers back, not vLLM itself: that is
test_gpu_engines.py, where vLLM is installed.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import torch

from real.engines.vllm_ext import HetrlWorkerExtension, hf_to_vllm
from real.model import TinyModelSpec
from real.tokenizer import EOS
from real.worker import digest

SPEC = TinyModelSpec(hidden=32, layers=2, heads=2, kv_heads=1, head_dim=16, ffn=64)


class _FakeModel:
    def __init__(self, params: dict[str, torch.Tensor]):
        self.params = params

    def named_parameters(self):
        return iter(self.params.items())

    def load_weights(self, weights):
        fused = hf_to_vllm(dict(weights), SPEC)
        for name, tensor in fused.items():
            self.params[name] = tensor.clone()
        return set(fused)


class _FakeWorker(HetrlWorkerExtension):
    def __init__(self, model: _FakeModel):
        self.model = model

    def get_model(self):
        return self.model


class _FakeLLM:
    def __init__(self, model: str, **kwargs):
        from safetensors.torch import load_file

        self.kwargs = kwargs
        state = load_file(str(Path(model) / "model.safetensors"))
        self.worker = _FakeWorker(_FakeModel(hf_to_vllm(state, SPEC)))
        self.resets = 0
        self.calls: list[tuple] = []

    def generate(self, requests, params, use_tqdm=True):
        out = []
        for req, p in zip(requests, params, strict=True):
            self.calls.append((tuple(req["prompt_token_ids"]), p.seed, p.max_tokens, p.temperature))
            g = torch.Generator().manual_seed(p.seed)
            ids = torch.randint(3, 250, (p.max_tokens,), generator=g).tolist()
            if p.seed % 2:  # odd seeds stop on EOS after two tokens
                ids = ids[:2] + [EOS]
            completion = types.SimpleNamespace(token_ids=ids, stop_reason=None)
            out.append(types.SimpleNamespace(outputs=[completion]))
        return out

    def collective_rpc(self, method, args=()):
        return [getattr(self.worker, method)(*args)]

    def reset_prefix_cache(self):
        self.resets += 1


@pytest.fixture
def engine(monkeypatch):
    fake = types.ModuleType("vllm")
    fake.LLM = _FakeLLM
    fake.SamplingParams = lambda **kw: types.SimpleNamespace(**kw)
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = dict
    fake.inputs = inputs
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    monkeypatch.delitem(sys.modules, "real.engines.vllm_engine", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    from real.engines.vllm_engine import VLLMRollout

    rollout = VLLMRollout(SPEC, seed=0, dtype="float32")
    yield rollout
    rollout.close()
    sys.modules.pop("real.engines.vllm_engine", None)


def test_engine_arguments_and_initial_weights(engine):
    from real.engines.torch_engine import TorchRollout

    kw = engine.llm.kwargs
    assert kw["skip_tokenizer_init"] and kw["enforce_eager"] and not kw["enable_prefix_caching"]
    assert kw["worker_extension_cls"] == "real.engines.vllm_ext.HetrlWorkerExtension"
    assert kw["max_model_len"] == SPEC.max_positions and kw["dtype"] == "float32"
    assert digest(engine.state_dict()) == digest(TorchRollout(SPEC, 0).state_dict())


def test_generate_seeds_each_request_and_ends_at_eos(engine):
    prompts = [[1, 5, 6]] * 4
    out = engine.generate(prompts, max_new_tokens=6, temperature=0.8, seed=3)
    seeds = [c[1] for c in engine.llm.calls]
    assert len(set(seeds)) == 4 and all(c[2] == 6 and c[3] == 0.8 for c in engine.llm.calls)
    for resp, s in zip(out, seeds, strict=True):
        assert (resp[-1] == EOS and len(resp) == 3) if s % 2 else len(resp) == 6
    assert out == engine.generate(prompts, max_new_tokens=6, temperature=0.8, seed=3)


def test_update_weights_loads_everything_and_reads_back(engine):
    from real.model import build_causal_lm

    new = build_causal_lm(SPEC, 42).state_dict()
    engine.update_weights(new)
    assert engine.llm.resets == 1
    assert digest(engine.state_dict()) == digest(new)
    partial = {k: v for k, v in new.items() if not k.startswith("lm_head")}
    with pytest.raises(Exception, match="lm_head"):
        engine.update_weights(partial)
