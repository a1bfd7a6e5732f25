"""The engines on a CUDA GPU. Every test here is marked ``gpu`` and skips, saying why, without
CUDA or without the library it needs:

* torch engines: need only CUDA;
* megatron: needs megatron-core (small; carried to the GPU test machine);
* vLLM: needs vLLM, whose wheel (hundreds of MB plus its CUDA dependencies) is too large to carry
  to the GPU test machine, so these run only where vLLM is installed.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from real.algos import AlgoConfig
from real.engines.base import make_batch
from real.engines.torch_engine import TorchInference, TorchRollout, TorchTrainer
from real.model import TinyModelSpec
from real.worker import digest

CUDA = torch.cuda.is_available()
NO_CUDA = "needs a CUDA GPU (torch.cuda.is_available() is False)"
NO_VLLM = ("vLLM not installed: its wheel is too large to carry to the GPU test machine; "
           "these tests run only where vLLM is installed (pip install -e '.[gpu]')")
NO_MEGATRON = "megatron-core not installed (pip install megatron-core, or -e '.[gpu]')"

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason=NO_CUDA)]
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason=NO_VLLM)
needs_megatron = pytest.mark.skipif(importlib.util.find_spec("megatron") is None,
                                    reason=NO_MEGATRON)

SPEC = TinyModelSpec()
PROMPTS = [[1, 72, 105, 33], [1, 50, 51, 52, 53, 54], [1, 80], [1, 99, 98, 97]]


def _batch_and_extras(rollout, seed: int = 0):
    responses = rollout.generate(PROMPTS, max_new_tokens=8, temperature=1.0, seed=seed)
    batch = make_batch(PROMPTS, responses)
    g = torch.Generator().manual_seed(seed)
    B, T = batch.input_ids.shape
    extras = {"advantages": torch.randn(B, T, generator=g) * batch.response_mask,
              "returns": torch.randn(B, T, generator=g) * batch.response_mask}
    return batch, extras


# --- torch on CUDA ------------------------------------------------------------------------------

def test_torch_engines_on_cuda_generate_train_and_sync():
    rollout = TorchRollout(SPEC, seed=0, device="cuda")
    a = rollout.generate(PROMPTS, max_new_tokens=8, temperature=1.0, seed=5)
    assert a == rollout.generate(PROMPTS, max_new_tokens=8, temperature=1.0, seed=5)
    assert all(1 <= len(r) <= 8 and all(0 <= t < SPEC.vocab for t in r) for r in a)
    batch, extras = _batch_and_extras(rollout)
    ref = TorchInference("reference", SPEC, seed=0, device="cuda")
    extras["ref_logp"] = ref.log_probs(batch).cpu()
    trainer = TorchTrainer("actor", SPEC, seed=0, device="cuda")
    before = digest(trainer.state_dict())
    assert before == digest(rollout.state_dict())  # same seed, same weights
    stats = trainer.forward_backward(batch, extras)
    trainer.step()
    assert torch.isfinite(torch.tensor(stats["loss"]))
    after = trainer.state_dict()
    assert digest(after) != before
    rollout.update_weights(after)
    assert digest(rollout.state_dict()) == digest(after)
    # CUDA and CPU agree on the loss of the same weights and batch
    cpu = TorchTrainer("actor", SPEC, seed=0, device="cpu")
    cpu_stats = cpu.forward_backward(batch, extras)
    assert cpu_stats["loss"] == pytest.approx(stats["loss"], rel=1e-3, abs=1e-4)


def test_torch_critic_on_cuda():
    rollout = TorchRollout(SPEC, seed=0, device="cuda")
    batch, extras = _batch_and_extras(rollout, seed=1)
    critic = TorchTrainer("critic", SPEC, seed=1, device="cuda")
    stats = critic.forward_backward(batch, extras)
    critic.step()
    inference = TorchInference("critic", SPEC, seed=1, device="cuda")
    inference.load_state(critic.state_dict())
    assert inference.values(batch).shape == batch.input_ids.shape and stats["loss"] >= 0


# --- megatron-core on CUDA ----------------------------------------------------------------------

@needs_megatron
@pytest.mark.parametrize("role", ["actor", "critic"])
def test_megatron_trainer_on_cuda_matches_torch_and_exports(role):
    from real.engines.megatron_engine import MegatronTrainer

    cfg = AlgoConfig(kl_coef=0.0)
    rollout = TorchRollout(SPEC, seed=0, device="cuda")
    batch, extras = _batch_and_extras(rollout, seed=2)
    meg = MegatronTrainer(role, SPEC, seed=3, device="cuda", cfg=cfg)
    ref = TorchTrainer(role, SPEC, seed=3, device="cuda", cfg=cfg)
    assert digest(meg.state_dict()) == digest(ref.state_dict())
    for _ in range(2):
        s_m, s_t = meg.train_step([(batch, extras)], [1.0]), ref.forward_backward(batch, extras)
        assert s_m["loss"] == pytest.approx(s_t["loss"], rel=1e-3, abs=1e-4)
        assert float(meg.last_grad_norm) ** 2 == pytest.approx(ref.grad_sq_norm(), rel=1e-2)
        ref.step()
    if role == "actor":
        rollout.update_weights(meg.state_dict())
        assert digest(rollout.state_dict()) == digest(meg.state_dict())
        out = rollout.generate(PROMPTS, max_new_tokens=4, temperature=0.0, seed=0)
        assert all(1 <= len(r) <= 4 for r in out)


# --- vLLM ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def vllm_rollout():
    from real.engines.vllm_engine import VLLMRollout

    engine = VLLMRollout(SPEC, seed=0, device="cuda", gpu_memory_utilization=0.2, dtype="float32")
    yield engine
    engine.close()


@needs_vllm
def test_vllm_generates_reproducibly(vllm_rollout):
    a = vllm_rollout.generate(PROMPTS * 2, max_new_tokens=8, temperature=1.0, seed=11)
    assert a == vllm_rollout.generate(PROMPTS * 2, max_new_tokens=8, temperature=1.0, seed=11)
    assert all(1 <= len(r) <= 8 and all(0 <= t < SPEC.vocab for t in r) for r in a)
    # the repeated prompts of a group sample with different seeds
    assert a[: len(PROMPTS)] != a[len(PROMPTS):]


@needs_vllm
def test_vllm_weights_start_as_torch_and_update(vllm_rollout):
    torch_rollout = TorchRollout(SPEC, seed=0, device="cuda")
    start = vllm_rollout.state_dict()
    assert sorted(start) == sorted(torch_rollout.state_dict())
    assert digest(start) == digest(torch_rollout.state_dict())  # float32: exact
    greedy = vllm_rollout.generate(PROMPTS, max_new_tokens=1, temperature=0.0, seed=0)
    expected = torch_rollout.generate(PROMPTS, max_new_tokens=1, temperature=0.0, seed=0)
    assert sum(g == e for g, e in zip(greedy, expected, strict=True)) >= len(PROMPTS) - 1
    trainer = TorchTrainer("actor", SPEC, seed=0, device="cuda")
    batch, extras = _batch_and_extras(torch_rollout, seed=4)
    trainer.forward_backward(batch, {**extras, "ref_logp": torch.zeros_like(extras["returns"])})
    trainer.step()
    new = trainer.state_dict()
    vllm_rollout.update_weights(new)
    assert digest(vllm_rollout.state_dict()) == digest(new)
    torch_rollout.update_weights(new)
    greedy = vllm_rollout.generate(PROMPTS, max_new_tokens=1, temperature=0.0, seed=0)
    expected = torch_rollout.generate(PROMPTS, max_new_tokens=1, temperature=0.0, seed=0)
    assert sum(g == e for g, e in zip(greedy, expected, strict=True)) >= len(PROMPTS) - 1


# --- the smoke script ---------------------------------------------------------------------------

def test_gpu_smoke_runs(tmp_path):
    import json

    from real import gpu_smoke

    code = gpu_smoke.main(["--out", str(tmp_path), "--iterations", "2"])
    assert code == 0
    result = json.loads((tmp_path / "compare.json").read_text())
    assert result["tasks"]["actor_generation"]["measured_s"] > 0
    assert (tmp_path / "trace.json").exists()
