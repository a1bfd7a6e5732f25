"""The ranks of a Megatron (dp, pp, tp) training step on gloo, for tests: one process per rank
(``torch.multiprocessing.spawn``), each hosting an actor and a critic trainer of the same grid
(as one device's worker hosts both in a run), one step on one batch, results pickled to a
folder; and the same step by TorchTrainer in this process, for comparison."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch

from real.algos import AlgoConfig
from real.engines.base import make_batch
from real.model import TinyModelSpec
from real.ray_env import free_port

SPEC = TinyModelSpec()  # 4 layers, 4 heads in 2 query groups: tp = 2 splits them
#: the same with every MLP made 4 experts of width 32, top-2 (tp = 2 splits the experts too)
MOE_SPEC = TinyModelSpec(experts=4, top_k=2, expert_ffn=32, name="tiny-qwen3-moe")
SPECS = {"dense": SPEC, "moe": MOE_SPEC}
CFG = AlgoConfig(lr=1e-3, critic_lr=1e-3, kl_coef=0.05)
ROLES = ("actor", "critic")
KEYS = {"actor": ("ref_logp", "advantages"), "critic": ("returns",)}
MICRO = 2  # sequences per micro-batch


def batch(prompt_lens: tuple[int, ...] = (5, 9, 3, 4, 7, 6),
          response_lens: tuple[int, ...] = (6, 2, 8, 5, 3, 7)) -> tuple[Any, dict[str, torch.Tensor]]:
    """Sequences of the given prompt and response lengths (random tokens) with random training
    inputs (seed 0)."""
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 250, (n,), generator=g).tolist() for n in prompt_lens]
    responses = [torch.randint(3, 250, (n,), generator=g).tolist() for n in response_lens]
    b = make_batch(prompts, responses)
    B, T = b.input_ids.shape
    extras = {"advantages": torch.randn(B, T, generator=g) * b.response_mask,
              "ref_logp": -torch.rand(B, T, generator=g) * 5 * b.response_mask,
              "returns": torch.randn(B, T, generator=g) * b.response_mask}
    return b, extras


def shares(dp: int) -> list[list[int]]:
    """Sequence indices per replica: uneven when dp = 2 (4 and 2 sequences)."""
    return [[0, 1, 2, 3], [4, 5]] if dp == 2 else [list(range(6))]


def micro_batches(role: str, idx: list[int]) -> tuple[list[Any], list[float]]:
    """A replica's micro-batches and their shares of the whole batch's response tokens."""
    b, extras = batch()
    total = float(b.response_mask.sum())
    micro = [(b.select(c), {k: extras[k][c] for k in KEYS[role]})
             for c in (idx[i:i + MICRO] for i in range(0, len(idx), MICRO))]
    return micro, [m.num_response_tokens / total for m, _ in micro]


def grid(dp: int, pp: int, tp: int, boundaries: tuple[int, ...], task: str,
         reverse: bool = False, ep: int = 1, moe: bool = False) -> Any:
    """The grid over ranks 0..dp*pp*tp-1 in replica, stage, tp order; ``reverse``: in the
    opposite order (the last replica's last stage's last tp rank on rank 0), so that a group's
    ranks descend where Megatron's group positions ascend."""
    from real.engines.megatron_parallel import MegatronGrid

    n = dp * pp * tp

    def device(i: int) -> int:
        return n - 1 - i if reverse else i

    devs = tuple(tuple(tuple(device(r * pp * tp + s * tp + t) for t in range(tp))
                       for s in range(pp)) for r in range(dp))
    return MegatronGrid(task, devs, boundaries, ep, moe)


def rank_main(rank: int, world: int, layout: tuple[int, int, int], boundaries: tuple[int, ...],
              port: int, out: str, reverse: bool, model: str = "dense", ep: int = 1) -> None:
    """One rank: join the world, create every group of both tasks, build both trainers (ranks
    beyond the grid only create the groups, as generation workers do), one step each. With
    expert parallelism a replica with fewer micro-batches than its group's busiest repeats its
    last one at scale 0 (as the real backend's dispatcher does)."""
    import torch.distributed as dist

    from real.engines.megatron_engine import MegatronTrainer
    from real.engines.megatron_parallel import create_groups

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    spec = SPECS[model]
    grids = {role: grid(*layout, boundaries, f"{role}_training", reverse, ep, model == "moe")
             for role in ROLES}
    specs = {k: v for g in grids.values() for k, v in g.groups().items()}
    groups = create_groups(specs, rank)
    result: dict[str, Any] = {}
    if rank < layout[0] * layout[1] * layout[2]:
        engines = {role: MegatronTrainer(role, spec, seed=7, device="cpu", cfg=CFG, grid=g,
                                         device_id=rank, groups=groups)
                   for role, g in grids.items()}
        most = max(len(micro_batches("actor", idx)[0]) for idx in shares(layout[0]))
        for role, eng in engines.items():
            micro, scales = micro_batches(role, shares(layout[0])[eng.replica])
            if ep > 1:
                extra = most - len(micro)
                micro, scales = micro + [micro[-1]] * extra, scales + [0.0] * extra
            stats = eng.train_step(micro, scales)
            result[role] = {"stats": stats, "weights": eng.state_dict(), "replica": eng.replica,
                            "grad_norm": float(eng.last_grad_norm)}
    with open(Path(out) / f"rank{rank}.pkl", "wb") as f:
        pickle.dump(result, f)
    dist.destroy_process_group()


def run_ranks(layout: tuple[int, int, int], boundaries: tuple[int, ...], out: Path,
              extra_ranks: int = 0, reverse: bool = False, model: str = "dense",
              ep: int = 1) -> list[dict[str, Any]]:
    """Spawn the grid's ranks (plus ``extra_ranks`` bystanders) and return their results."""
    import torch.multiprocessing as mp

    port = free_port()
    world = layout[0] * layout[1] * layout[2] + extra_ranks
    mp.spawn(rank_main, args=(world, layout, boundaries, port, str(out), reverse, model, ep),
             nprocs=world)
    results = []
    for r in range(world):
        with open(out / f"rank{r}.pkl", "rb") as f:
            results.append(pickle.load(f))
    return results


def torch_step(role: str, dp: int, model: str = "dense") -> dict[str, Any]:
    """The same step on TorchTrainer: every replica's micro-batches, losses scaled by their
    share of the whole batch's response tokens, one clipped Adam step."""
    from real.engines.torch_engine import TorchTrainer

    ref = TorchTrainer(role, SPECS[model], seed=7, device="cpu", cfg=CFG)
    stats: dict[str, float] = {}
    for idx in shares(dp):
        micro, scales = micro_batches(role, idx)
        for (b, e), scale in zip(micro, scales, strict=True):
            for k, v in ref.forward_backward(b, e, scale=scale).items():
                stats[k] = stats.get(k, 0.0) + v * scale
    grads = {n: p.grad.detach().clone() for n, p in ref.module.named_parameters()}
    norm = ref.grad_sq_norm() ** 0.5
    ref.step()
    return {"stats": stats, "weights": ref.state_dict(), "grads": grads, "grad_norm": norm}


#: x the largest |gradient|: below it an element's gradient is a near-cancelling sum.
SMALL_GRAD = 1e-4


def assert_adam_step_close(after: dict[str, torch.Tensor], ref: dict[str, Any], lr: float) -> None:
    """``after`` (HF-named weights after one Adam step) against :func:`torch_step`'s ``ref``:
    within 1e-5 wherever the gradient is at least ``SMALL_GRAD`` of the largest; elsewhere
    within 2 ``lr`` (Adam's first step, lr x g / (|g| + eps), turns any g well above eps into
    +-lr, so a near-cancelling gradient whose float32 rounding depends on the summation order
    may step the other way), for at most 1e-4 of the elements."""
    assert after.keys() == ref["weights"].keys()
    gmax = max(g.abs().max() for g in ref["grads"].values())
    loose = total = 0
    for k, want in ref["weights"].items():
        diff = (after[k] - want).abs()
        steady = ref["grads"][k].abs() >= SMALL_GRAD * gmax
        assert not steady.any() or diff[steady].max() <= 1e-5, k
        assert diff.max() <= 2 * lr * (1 + 1e-3), k
        loose += int((diff > 1e-5).sum())
        total += diff.numel()
    assert loose <= 1e-4 * total, (loose, total)
