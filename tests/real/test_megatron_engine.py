"""MegatronTrainer against TorchTrainer on CPU: same weights, outputs, losses and gradients.

Runs where megatron-core is importable: the ``test`` extra pins it (megatron-core 0.16.1, the
version the engine is written against); without it these skip. The GPU variant is in test_gpu_engines.py.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core", reason="megatron-core not installed (pip install -e '.[gpu]')")

from hetrl.errors import HetrlError  # noqa: E402
from real.algos import AlgoConfig  # noqa: E402
from real.engines.base import make_batch  # noqa: E402
from real.engines.megatron_convert import megatron_to_hf  # noqa: E402
from real.engines.megatron_engine import MegatronTrainer  # noqa: E402
from real.engines.torch_engine import TorchRollout, TorchTrainer  # noqa: E402
from real.worker import digest  # noqa: E402


def _batch():
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 250, (n,), generator=g).tolist() for n in (5, 9, 3)]
    responses = [torch.randint(3, 250, (n,), generator=g).tolist() for n in (6, 2, 8)]
    batch = make_batch(prompts, responses)
    B, T = batch.input_ids.shape
    extras = {"advantages": torch.randn(B, T, generator=g) * batch.response_mask,
              "ref_logp": -torch.rand(B, T, generator=g) * 5 * batch.response_mask,
              "returns": torch.randn(B, T, generator=g) * batch.response_mask}
    return batch, extras


def _grads_hf(trainer: MegatronTrainer) -> dict[str, torch.Tensor]:
    grads = {n: p.grad.detach().clone() for n, p in trainer.module.named_parameters()}
    return megatron_to_hf(grads, trainer.spec, value_model=trainer.role == "critic")


@pytest.mark.parametrize("role", ["actor", "critic"])
def test_megatron_matches_torch_trainer(role, small, one_thread):
    cfg = AlgoConfig(lr=1e-3, critic_lr=1e-3, kl_coef=0.05)
    meg = MegatronTrainer(role, small, seed=7, device="cpu", cfg=cfg)
    ref = TorchTrainer(role, small, seed=7, device="cpu", cfg=cfg)
    assert digest(meg.state_dict()) == digest(ref.state_dict())  # exact conversion
    batch, extras = _batch()
    with torch.no_grad():
        out_m, out_t = meg.forward(batch), ref.module(batch.input_ids, batch.position_ids)
    assert out_m.shape == out_t.shape
    torch.testing.assert_close(out_m, out_t, atol=1e-4, rtol=1e-4)
    stats_m = meg.forward_backward(batch, extras, scale=0.5)
    stats_t = ref.forward_backward(batch, extras, scale=0.5)
    assert stats_m.keys() == stats_t.keys()
    for k in stats_t:
        assert stats_m[k] == pytest.approx(stats_t[k], rel=1e-4, abs=1e-5), k
    grads_t = {n: p.grad for n, p in ref.module.named_parameters()}
    grads_m = _grads_hf(meg)
    assert grads_m.keys() == grads_t.keys()
    for n in grads_t:
        torch.testing.assert_close(grads_m[n], grads_t[n], atol=1e-5, rtol=1e-3, msg=n)
    assert meg.grad_sq_norm() == pytest.approx(ref.grad_sq_norm(), rel=1e-4)
    meg.step()
    ref.step()
    after_m, after_t = meg.state_dict(), ref.state_dict()
    for n in after_t:
        torch.testing.assert_close(after_m[n], after_t[n], atol=2e-3, rtol=0, msg=n)


def test_megatron_weights_load_into_the_torch_rollout(small, one_thread):
    meg = MegatronTrainer("actor", small, seed=1, device="cpu")
    batch, extras = _batch()
    meg.forward_backward(batch, extras)
    meg.step()
    rollout = TorchRollout(small, seed=99, device="cpu")
    rollout.update_weights(meg.state_dict())  # strict: every HF name present
    assert digest(rollout.state_dict()) == digest(meg.state_dict())
    # checkpoint path of the worker: module / optimizer state dicts round-trip
    saved = {k: v.clone() if isinstance(v, torch.Tensor) else v
             for k, v in meg.module.state_dict().items()}
    meg.module.load_state_dict(saved)
    meg.optimizer.load_state_dict(meg.optimizer.state_dict())


def test_megatron_pipeline_is_refused(small):
    with pytest.raises(HetrlError, match="pipeline"):
        MegatronTrainer("actor", small, seed=0, device="cpu", stage=0, stages=[0, 1, 2])
