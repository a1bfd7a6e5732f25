"""The ranks of an expert-parallel MoE layer on gloo, for tests: one process per rank
(``torch.multiprocessing.spawn``), each routing its own tokens through transformers'
Qwen3-MoE block whose experts :func:`real.moe.shard_experts` split over the ranks, results
pickled to a folder."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path
from typing import Any

import torch

from real.ray_env import free_port

HIDDEN, FFN, EXPERTS, TOP_K = 16, 24, 4, 2


def balanced_choice(tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, experts) sending token i to experts i mod E and i + 1 mod E (a balanced
    routing: with E = 4 over 2 ranks half of the choices leave each rank, the uniform
    expectation)."""
    experts = torch.tensor([[i % EXPERTS, (i + 1) % EXPERTS] for i in range(tokens)])
    return torch.tensor([[2 / 3, 1 / 3]]).expand(tokens, 2).contiguous(), experts


def moe_block(seed: int):
    """transformers' Qwen3-MoE block of the test's shape, from ``seed``."""
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    config = Qwen3MoeConfig(hidden_size=HIDDEN, moe_intermediate_size=FFN, num_experts=EXPERTS,
                            num_experts_per_tok=TOP_K, norm_topk_prob=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        block = Qwen3MoeSparseMoeBlock(config)
        for p in block.parameters():  # the block alone is not initialised by a model's post_init
            torch.nn.init.normal_(p, std=HIDDEN ** -0.5)
    return block


def rank_main(rank: int, world: int, port: int, out: str, tokens: int, balanced: bool) -> None:
    import torch.distributed as dist

    from real.moe import shard_experts

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    whole = moe_block(seed=3)
    block = copy.deepcopy(whole)
    sharded = shard_experts(block, None)["experts"]
    x = torch.randn(tokens, HIDDEN, generator=torch.Generator().manual_seed(100 + rank),
                    requires_grad=True)
    if balanced:
        weights, chosen = balanced_choice(tokens)
    else:
        _, weights, chosen = block.gate(x.detach())
    y = sharded(x, chosen, weights)
    forward_bytes = sharded.bytes_sent
    y.square().sum().backward()  # the gradients go back through the same all-to-alls
    gate_up, down = sharded.gathered()
    result: dict[str, Any] = {
        "y": y.detach(), "reference": whole.experts(x.detach(), chosen, weights).detach(),
        "forward_bytes": forward_bytes, "x_grad_finite": bool(torch.isfinite(x.grad).all()),
        "expert_grad": float(sharded.gate_up_proj.grad.abs().sum()),
        "gathered_equal": bool(torch.equal(gate_up, whole.experts.gate_up_proj)
                               and torch.equal(down, whole.experts.down_proj))}
    dist.barrier()
    with open(Path(out) / f"rank{rank}.pkl", "wb") as f:
        pickle.dump(result, f)
    dist.destroy_process_group()


def run_ranks(world: int, tokens: int, out: Path, balanced: bool = True) -> list[dict[str, Any]]:
    """Spawn ``world`` ranks (expert parallelism ``world``) and return their results."""
    import torch.multiprocessing as mp

    mp.spawn(rank_main, args=(world, free_port(), str(out), tokens, balanced), nprocs=world)
    results = []
    for r in range(world):
        with open(out / f"rank{r}.pkl", "rb") as f:
            results.append(pickle.load(f))
    return results
