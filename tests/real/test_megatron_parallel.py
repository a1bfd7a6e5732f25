"""Megatron trainers over (dp, pp, tp) grids on gloo against TorchTrainer on the whole batch.

Each layout runs as one process per rank (``tests/real/megatron_ranks.py``), each rank hosting
an actor and a critic trainer (two tasks' groups in one world, as a device worker hosts them),
one optimizer step on six sequences in micro-batches of two (dp = 2: uneven shares, 4 and 2
sequences). Checked against TorchTrainer's step on the same micro-batches:

* the loss statistics within 1e-4 (relative, or absolute near 0);
* the gradient norm before clipping within 1e-4 relative, on every rank: Adam's first step is
  blind to a uniform gradient scale, the norm is not;
* the weights after the step within 1e-5 (``assert_adam_step_close``), except that an element
  whose gradient is under 1e-4 of the largest may differ by up to 2 lr, for at most 1e-4 of
  the elements: its gradient is a near-cancelling sum whose float32 rounding depends on the
  summation order (tensor-parallel partial sums, another micro-batch grouping), and Adam's
  first step, lr x g / (|g| + eps), turns any g well above eps into +-lr. (Measured: at most
  2 of 181k-363k elements beyond 1e-5, by at most 1.08e-5; the others within 1.2e-7.)
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core", reason="megatron-core not installed (pip install -e '.[test]')")

from tests.real.megatron_ranks import (  # noqa: E402
    CFG,
    ROLES,
    SPEC,
    assert_adam_step_close,
    run_ranks,
    torch_step,
)

#: (dp, pp, tp), layer boundaries, bystander ranks (workers of other tasks in the world),
#: whether the grid's devices run in reverse rank order, and for a mixture-of-experts model
#: (tiny-qwen3-moe) its expert parallelism.
LAYOUTS = {
    "tp2": ((1, 1, 2), (0, 4), 0, False),
    "pp2": ((1, 2, 1), (0, 3, 4), 1, False),  # uneven stages: 3 + 1 layers
    "dp2": ((2, 1, 1), (0, 4), 1, False),
    "tp2xpp2": ((1, 2, 2), (0, 2, 4), 0, False),
    "dp2xtp2": ((2, 1, 2), (0, 4), 0, False),
    "dp2xpp2": ((2, 2, 1), (0, 2, 4), 0, False),
    "pp3": ((1, 3, 1), (0, 2, 3, 4), 0, False),  # a middle stage: neither embedding nor head
    "tp2xpp2-reversed": ((1, 2, 2), (0, 1, 4), 0, True),  # stage 0 on ranks 3, 2
    # megatron-core's MoELayer: experts split over 2 replicas (uneven shares: replica 1 pads
    # one micro-batch), and over the stages too (tp = 1: megatron-core trains MoE with tp > 1
    # only under sequence parallelism, which the engine does not run)
    "moe-dp2xep2": ((2, 1, 1), (0, 4), 1, False, 2),
    "moe-dp2xep2xpp2": ((2, 2, 1), (0, 2, 4), 0, False, 2),
}


def _merged_replicas(results: list[dict], role: str, dp: int) -> list[dict]:
    """Per replica, its stages' weight slices merged into one HF state dict."""
    out: list[dict[str, torch.Tensor]] = [{} for _ in range(dp)]
    for res in results:
        if res:
            out[res[role]["replica"]].update(res[role]["weights"])
    return out


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_megatron_layout_matches_the_torch_trainer(name, tmp_path):
    layout, boundaries, extra, reverse, *ep = LAYOUTS[name]
    model = "moe" if ep else "dense"
    results = run_ranks(layout, boundaries, tmp_path, extra_ranks=extra, reverse=reverse,
                        model=model, ep=ep[0] if ep else 1)
    grid_ranks = layout[0] * layout[1] * layout[2]
    assert all(not r for r in results[grid_ranks:])  # bystanders only made the groups
    for role in ROLES:
        ref = torch_step(role, layout[0], model)
        stats: dict[str, float] = {}
        for res in results[:grid_ranks]:
            for k, v in res[role]["stats"].items():
                stats[k] = stats.get(k, 0.0) + v
        assert stats.keys() == ref["stats"].keys(), role
        for k, v in ref["stats"].items():
            assert stats[k] == pytest.approx(v, rel=1e-4, abs=1e-4), (role, k)
        for res in results[:grid_ranks]:
            assert res[role]["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-4), role
        lr = CFG.lr if role == "actor" else CFG.critic_lr
        for replica in _merged_replicas(results, role, layout[0]):
            assert_adam_step_close(replica, ref, lr)


def test_grid_groups_and_uneven_stages():
    from hetrl.errors import SpecError
    from real.engines.megatron_parallel import MegatronGrid

    g = MegatronGrid("t", (((4, 5), (6, 7)), ((0, 1), (2, 3))), (0, 3, 4))
    groups = g.groups()
    assert groups["t/megatron/tp/0"] == (4, 5) and groups["t/megatron/tp/3"] == (2, 3)
    assert groups["t/megatron/pp/1"] == (5, 7)
    assert groups["t/megatron/dp/0"] == (4, 0)
    assert groups["t/megatron/mp/1"] == (0, 1, 2, 3)
    assert g.coords(7) == (0, 1, 1) and g.layer_split() == (3, 1)
    assert MegatronGrid("t", (((0,), (1,), (2,)),), (0, 1, 3, 4)).layer_split() == (1, 1)
    with pytest.raises(SpecError, match="layers_per_stage"):
        MegatronGrid("t", (((0,), (1,), (2,), (3,)),), (0, 1, 2, 4, 5)).layer_split()
    with pytest.raises(SpecError, match="repeat"):
        MegatronGrid("t", (((0,), (0,)),), (0, 2, 4))


def test_shard_and_unshard_round_trip():
    from real.engines.megatron_convert import hf_to_megatron
    from real.engines.megatron_parallel import padded_vocab, shard, unshard
    from real.model import build_causal_lm

    full = hf_to_megatron(build_causal_lm(SPEC, 3).state_dict(), SPEC)
    for tp in (1, 2):
        rows = padded_vocab(SPEC.vocab, tp)
        for name, t in full.items():
            parts = [shard(name, t, tp, r, rows) for r in range(tp)]
            assert torch.equal(unshard(name, parts, SPEC.vocab), t), (tp, name)
    gate, up = full["decoder.layers.0.mlp.linear_fc1.weight"].chunk(2)
    part = shard("decoder.layers.0.mlp.linear_fc1.weight",
                 full["decoder.layers.0.mlp.linear_fc1.weight"], 2, 1, 260)
    assert torch.equal(part, torch.cat([gate.chunk(2)[1], up.chunk(2)[1]]))  # SwiGLU halves
