"""MegatronTrainer alone (a world of one) against TorchTrainer on CPU: same weights, outputs,
losses and gradient norm; checkpoint state round-trips. Layouts over several processes:
test_megatron_parallel.py.

Runs where megatron-core is importable: the ``test`` extra pins it (megatron-core 0.16.1, the
version the engine is written against); without it these skip. The GPU variant is in test_gpu_engines.py.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core", reason="megatron-core not installed (pip install -e '.[gpu]')")

from hetrl.errors import HetrlError  # noqa: E402
from real.algos import AlgoConfig  # noqa: E402
from real.engines.megatron_engine import MegatronTrainer  # noqa: E402
from real.engines.torch_engine import TorchRollout, TorchTrainer  # noqa: E402
from real.worker import digest  # noqa: E402
from tests.real.megatron_ranks import assert_adam_step_close, batch  # noqa: E402


def _batch():
    return batch((5, 9, 3), (6, 2, 8))


@pytest.mark.parametrize("model", ["small", "small_moe"])
@pytest.mark.parametrize("role", ["actor", "critic"])
def test_megatron_matches_torch_trainer(role, model, request, one_thread):
    """Dense, and a mixture of experts (megatron-core's MoELayer: router, all-to-all token
    dispatcher, one MLP per expert, against transformers' Qwen3-MoE block)."""
    small = request.getfixturevalue(model)
    cfg = AlgoConfig(lr=1e-3, critic_lr=1e-3, kl_coef=0.05)
    meg = MegatronTrainer(role, small, seed=7, device="cpu", cfg=cfg)
    ref = TorchTrainer(role, small, seed=7, device="cpu", cfg=cfg)
    assert digest(meg.state_dict()) == digest(ref.state_dict())  # exact conversion
    batch, extras = _batch()
    with torch.no_grad():
        out_m, out_t = meg.forward(batch), ref.module(batch.input_ids, batch.position_ids)
    assert out_m.shape == out_t.shape
    torch.testing.assert_close(out_m, out_t, atol=1e-4, rtol=1e-4)
    micro = [(batch.select([0, 1]), {k: v[[0, 1]] for k, v in extras.items()}),
             (batch.select([2]), {k: v[[2]] for k, v in extras.items()})]
    scales = [m.num_response_tokens / batch.num_response_tokens for m, _ in micro]
    stats_m = meg.train_step(micro, scales)
    stats_t: dict[str, float] = {}
    for (b, e), scale in zip(micro, scales, strict=True):
        for k, v in ref.forward_backward(b, e, scale=scale).items():
            stats_t[k] = stats_t.get(k, 0.0) + v * scale
    assert stats_m.keys() == stats_t.keys()
    for k in stats_t:
        assert stats_m[k] == pytest.approx(stats_t[k], rel=1e-4, abs=1e-5), k
    # the schedule's per-token loss over both micro-batches = the torch path's scaled sum
    assert float(meg.last_grad_norm) == pytest.approx(ref.grad_sq_norm() ** 0.5, rel=1e-4)
    grads = {n: p.grad.detach().clone() for n, p in ref.module.named_parameters()}
    ref.step()
    assert_adam_step_close(meg.state_dict(), {"weights": ref.state_dict(), "grads": grads}, 1e-3)


def test_megatron_weights_load_into_the_torch_rollout(small, one_thread):
    meg = MegatronTrainer("actor", small, seed=1, device="cpu")
    batch, extras = _batch()
    meg.train_step([(batch, extras)], [1.0])
    rollout = TorchRollout(small, seed=99, device="cpu")
    rollout.update_weights(meg.state_dict())  # strict: every HF name present
    assert digest(rollout.state_dict()) == digest(meg.state_dict())
    # the worker's checkpoint path: this rank's weights and optimizer shard round-trip
    saved = meg.save_state()
    before = digest(meg.state_dict())
    meg.train_step([(batch, extras)], [1.0])
    assert digest(meg.state_dict()) != before
    meg.load_saved(saved)
    assert digest(meg.state_dict()) == before
    again = MegatronTrainer("actor", small, seed=1, device="cpu")
    again.load_saved(saved)
    s1 = meg.train_step([(batch, extras)], [1.0])
    s2 = again.train_step([(batch, extras)], [1.0])
    assert s1 == s2 and digest(meg.state_dict()) == digest(again.state_dict())


def test_megatron_pipeline_needs_a_grid(small):
    with pytest.raises(HetrlError, match="grid"):
        MegatronTrainer("actor", small, seed=0, device="cpu", stage=0, stages=[0, 1, 2])
