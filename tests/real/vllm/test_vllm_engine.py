"""VLLMRollout on vLLM's CPU build, in vLLM's multi-process mode (its default) and in-process:
seeded sampling, greedy equality with TorchRollout in float32, and trainer weight updates."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from real.algos import AlgoConfig
from real.engines.base import make_batch
from real.engines.torch_engine import TorchRollout, TorchTrainer
from real.model import TinyModelSpec
from real.worker import digest
from tests.real.vllm.conftest import SPEC

PROMPTS = [[1, 72, 105, 33], [1, 50, 51, 52, 53, 54], [1, 80], [1, 99, 98, 97]]
#: vLLM's engine-core client per VLLM_ENABLE_V1_MULTIPROCESSING. The multi-process mode comes
#: first: the in-process engine caches vLLM's environment variables for the rest of the process.
CLIENTS = {"1": "SyncMPClient", "0": "InprocClient"}


@pytest.fixture(scope="module", params=list(CLIENTS), ids=lambda m: f"multiprocessing={m}")
def rollout(request):
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM not installed")
    from real.engines.vllm_engine import VLLMRollout

    mode = request.param
    before = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = mode
    engine = VLLMRollout(SPEC, seed=0, device="cpu")
    assert type(engine.llm.llm_engine.engine_core).__name__ == CLIENTS[mode]
    yield engine
    engine.close()
    if before is None:
        os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    else:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = before


def _greedy(engine, n: int = 8):
    return engine.generate(PROMPTS, max_new_tokens=n, temperature=0.0, seed=0)


def _trained(seed: int) -> dict[str, torch.Tensor]:
    """The actor's weights after one policy-gradient step on its own samples (seeded)."""
    responses = TorchRollout(SPEC, seed=0).generate(PROMPTS, max_new_tokens=8, temperature=1.0,
                                                    seed=seed)
    batch = make_batch(PROMPTS, responses)
    g = torch.Generator().manual_seed(seed)
    advantages = torch.randn(batch.input_ids.shape, generator=g) * batch.response_mask
    trainer = TorchTrainer("actor", SPEC, 0, "cpu", AlgoConfig(lr=1e-2))
    trainer.forward_backward(batch, {"advantages": advantages,
                                     "ref_logp": torch.zeros_like(advantages)})
    trainer.step()
    return trainer.state_dict()


def test_seeded_sampling_is_reproducible(rollout):
    a = rollout.generate(PROMPTS * 2, max_new_tokens=8, temperature=1.0, seed=11)
    assert a == rollout.generate(PROMPTS * 2, max_new_tokens=8, temperature=1.0, seed=11)
    assert all(1 <= len(r) <= 8 and all(0 <= t < SPEC.vocab for t in r) for r in a)
    assert a[: len(PROMPTS)] != a[len(PROMPTS):]  # a group's repeats sample with other seeds
    assert a != rollout.generate(PROMPTS * 2, max_new_tokens=8, temperature=1.0, seed=12)


def test_greedy_equals_torch_before_and_after_updates(rollout):
    torch_rollout = TorchRollout(SPEC, seed=0)
    assert digest(rollout.state_dict()) == digest(torch_rollout.state_dict())
    assert _greedy(rollout) == _greedy(torch_rollout)
    for step in (1, 2):  # repeated updates, each from a trainer step
        new = _trained(seed=step)
        assert digest(new) != digest(torch_rollout.state_dict())
        rollout.update_weights(new)
        torch_rollout.update_weights(new)
        assert digest(rollout.state_dict()) == digest(new)  # float32: exact
        assert _greedy(rollout) == _greedy(torch_rollout)


def test_update_rejects_a_partial_state_dict(rollout):
    from hetrl.errors import HetrlError

    state = TorchRollout(SPEC, seed=0).state_dict()
    state.pop("lm_head.weight")
    with pytest.raises(HetrlError, match="lm_head"):
        rollout.update_weights(state)


def test_unsupported_head_dim_is_a_clear_error():
    pytest.importorskip("vllm")
    from hetrl.errors import HetrlError
    from real.engines.vllm_engine import VLLMRollout

    with pytest.raises(HetrlError, match=r"head_dim.*16.*CPU attention supports"):
        VLLMRollout(TinyModelSpec(), seed=0, device="cpu")
