"""The ranks of an expert-parallel MoE layer on gloo, for tests: one process per rank
(``torch.multiprocessing.spawn``), each routing its own tokens through
:class:`real.moe.ExpertParallelMLP`, results pickled to a folder."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch

from real.ray_env import free_port

HIDDEN, FFN, EXPERTS, TOP_K = 16, 24, 4, 2


def balanced_logits(tokens: int) -> torch.Tensor:
    """Router logits sending token i to experts i mod E and i + 1 mod E (a balanced routing:
    with E = 4 over 2 ranks half of the choices leave each rank, the uniform expectation)."""
    logits = torch.full((tokens, EXPERTS), -10.0)
    for i in range(tokens):
        logits[i, i % EXPERTS] = 2.0
        logits[i, (i + 1) % EXPERTS] = 1.0
    return logits


def rank_main(rank: int, world: int, port: int, out: str, tokens: int, balanced: bool) -> None:
    import torch.distributed as dist

    from real.moe import ExpertParallelMLP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    layer = ExpertParallelMLP(HIDDEN, FFN, EXPERTS, TOP_K, seed=3)
    x = torch.randn(tokens, HIDDEN, generator=torch.Generator().manual_seed(100 + rank),
                    requires_grad=True)
    logits = balanced_logits(tokens) if balanced else None
    y = layer(x, logits)
    forward_bytes = layer.bytes_sent
    y.square().sum().backward()  # the gradients go back through the same all-to-alls
    result: dict[str, Any] = {
        "y": y.detach(), "reference": layer.reference(x.detach(), logits),
        "forward_bytes": forward_bytes, "x_grad_finite": bool(torch.isfinite(x.grad).all()),
        "expert_grad": float(layer.gate.grad.abs().sum())}
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
