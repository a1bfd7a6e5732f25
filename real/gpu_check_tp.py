"""Step (b) of :mod:`real.gpu_check`: one Megatron training step at tp = 2 against tp = 1 on
the same weights and batch.

Two rank processes (``python -m real.gpu_check_tp --rank R ...``) join one torch.distributed
world; both build the actor's :class:`~real.engines.megatron_engine.MegatronTrainer` on a tp = 2
grid over ranks (0, 1) and step once; rank 0 then builds a tp = 1 trainer (its own one-rank
grid in the same world, as one worker hosts several tasks) from the same seed, steps on the same
micro-batches and compares: same initial weights (digest), loss statistics, gradient norm
before clipping, weights after the step.

Where the ranks run (:func:`attempts`, tried in order until one completes):

* ``cuda-nccl``: two or more GPUs, rank r on ``cuda:r``, NCCL for CUDA tensors and gloo for
  CPU ones (:data:`real.engines.megatron_parallel.GPU_BACKEND`, as in a run);
* ``cuda-gloo``: one GPU, both ranks on ``cuda:0`` (NCCL refuses two ranks on one device), every
  collective over gloo, which stages CUDA tensors through host memory; whether gloo carries all
  of Megatron's collectives on CUDA tensors (the distributed optimizer's reduce-scatter among
  them) is what this attempt finds out: if one fails, the next attempt runs;
* ``cpu-gloo``: both ranks on CPU tensors over gloo (megatron-core under ``cpu_shims``, as the
  CPU tests run it).

A rank that fails writes ``rank{R}.err`` (one line) and exits 1; rank 0 writes ``result.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

#: Relative tolerance of the loss statistics and the gradient norm, tp 2 vs tp 1 (float32; the
#: CPU tests measure 2e-7 and 3e-7; CUDA kernels sum in other orders).
TOLERANCE = {"cpu": 1e-4, "cuda": 1e-3}
MICRO = 2  # sequences per micro-batch


def attempts(device: str, gpus: int) -> list[str]:
    """The ways to run the two ranks on this machine, best first."""
    if device == "cpu":
        return ["cpu-gloo"]
    return (["cuda-nccl"] if gpus >= 2 else ["cuda-gloo"]) + ["cpu-gloo"]


def model_spec(quick: bool) -> Any:
    """The model: the tiny default (4 heads in 2 query groups) in quick mode, else one with
    hidden 512 (8 heads, 4 query groups, 4 layers)."""
    from real.model import TinyModelSpec

    if quick:
        return TinyModelSpec()
    return TinyModelSpec(hidden=512, layers=4, heads=8, kv_heads=4, head_dim=64, ffn=1536,
                         name="qwen3-h512")


def batch(spec: Any, seed: int, n: int = 6) -> tuple[list[Any], list[float]]:
    """``n`` random sequences (prompts 3-10 tokens, responses 2-8) with random advantages and
    reference log-probs, as micro-batches of :data:`MICRO` and their response-token shares."""
    import torch

    from real.engines.base import make_batch

    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(3, 11, (n,), generator=g).tolist(), torch.randint(2, 9, (n,), generator=g).tolist()
    prompts = [torch.randint(3, spec.vocab, (k,), generator=g).tolist() for k in lens[0]]
    responses = [torch.randint(3, spec.vocab, (k,), generator=g).tolist() for k in lens[1]]
    b = make_batch(prompts, responses)
    shape = b.input_ids.shape
    extras = {"advantages": torch.randn(shape, generator=g) * b.response_mask,
              "ref_logp": -torch.rand(shape, generator=g) * 5 * b.response_mask}
    total = float(b.response_mask.sum())
    micro = [(b.select(list(range(i, min(i + MICRO, n)))),
              {k: v[i:i + MICRO] for k, v in extras.items()}) for i in range(0, n, MICRO)]
    return micro, [m.num_response_tokens / total for m, _ in micro]


def _step(trainer: Any, micro: list[Any], scales: list[float], device: str) -> tuple[dict, float]:
    from real.profile import device_sync

    start = time.perf_counter()
    stats = trainer.train_step(micro, scales)
    device_sync(device)()
    return stats, time.perf_counter() - start


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def rank_main(rank: int, mode: str, port: int, out: Path, quick: bool, seed: int) -> dict[str, Any]:
    """One rank's part (see the module docstring); rank 0's comparison, rank 1's {}."""
    import torch
    import torch.distributed as dist

    from real.algos import AlgoConfig
    from real.engines.megatron_engine import MegatronTrainer
    from real.engines.megatron_parallel import GPU_BACKEND, MegatronGrid, create_groups
    from real.worker import digest

    device = {"cuda-nccl": f"cuda:{rank}", "cuda-gloo": "cuda:0", "cpu-gloo": "cpu"}[mode]
    kind = device.split(":")[0]
    torch.set_num_threads(1 if kind == "cpu" else torch.get_num_threads())
    if kind == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(GPU_BACKEND if mode == "cuda-nccl" else "gloo",
                            init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    spec = model_spec(quick)
    tp2 = MegatronGrid("actor_training", (((0, 1),),), (0, spec.layers))
    tp1 = MegatronGrid("reference_training", (((0,),),), (0, spec.layers))
    groups = create_groups({**tp2.groups(), **tp1.groups()}, rank)
    cfg = AlgoConfig(lr=1e-3, kl_coef=0.05)
    micro, scales = batch(spec, seed)
    two = MegatronTrainer("actor", spec, seed, device, cfg, grid=tp2, device_id=rank, groups=groups)
    start2 = digest(two.state_dict())
    stats2, step2_s = _step(two, micro, scales, device)
    res = {}
    if rank == 0:
        one = MegatronTrainer("actor", spec, seed, device, cfg, grid=tp1, device_id=0,
                              groups=groups)
        res = _against_tp1(mode, device, spec, cfg, micro, scales, two, one, start2, stats2,
                           step2_s)
    # both ranks leave together, the group destroyed: a rank that exits while the other still
    # holds the process group can abort in gloo's teardown ("terminate called without an
    # active exception", exit status -6; seen once in a CI run on 2 cores)
    dist.barrier()
    dist.destroy_process_group()
    return res


def _against_tp1(mode: str, device: str, spec: Any, cfg: Any, micro: list[Any],
                 scales: list[float], two: Any, one: Any, start2: str, stats2: dict,
                 step2_s: float) -> dict[str, Any]:
    """Rank 0's comparison: the tp = 1 trainer ``one`` stepped on the same micro-batches,
    against the tp = 2 trainer ``two`` (its start digest, loss statistics and step seconds)."""
    from real.worker import digest

    kind = device.split(":")[0]
    same_start = start2 == digest(one.state_dict())
    stats1, step1_s = _step(one, micro, scales, device)
    tol = TOLERANCE[kind]
    w2, w1 = two.state_dict(), one.state_dict()
    diffs = [float((w2[k] - w1[k]).abs().max()) for k in w1]
    loss_rel = {k: _rel(stats2[k], v) for k, v in stats1.items()}
    norm_rel = _rel(two.last_grad_norm, one.last_grad_norm)
    checks = {"same_initial_weights": same_start,
              "loss_within_tolerance": stats2.keys() == stats1.keys() and all(
                  r <= tol for r in loss_rel.values()),
              "grad_norm_within_tolerance": norm_rel <= tol,
              "weights_after_step_within_2lr": max(diffs) <= 2 * cfg.lr * (1 + 1e-3)}
    return {"mode": mode, "device": device, "model": spec.name, "params": sum(
        t.numel() for t in w1.values()), "sequences": sum(m.size for m, _ in micro),
        "tolerance_rel": tol, "tp2": {"stats": stats2, "grad_norm": two.last_grad_norm,
                                      "step_s": step2_s},
        "tp1": {"stats": stats1, "grad_norm": one.last_grad_norm, "step_s": step1_s},
        "loss_rel_diff": loss_rel, "grad_norm_rel_diff": norm_rel,
        "weights_max_abs_diff": max(diffs),
        "weights_elements_over_1e-5": sum(int(((w2[k] - w1[k]).abs() > 1e-5).sum()) for k in w1),
        "checks": checks}


def run_attempt(mode: str, out: Path, quick: bool, seed: int, timeout_s: float) -> dict[str, Any]:
    """Both ranks of one attempt as subprocesses (killed after ``timeout_s``); rank 0's result,
    or {"error": one line}."""
    from real.ray_env import free_port

    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    cmd = [sys.executable, "-m", "real.gpu_check_tp", "--mode", mode, "--port", str(port),
           "--out", str(out), "--seed", str(seed)] + (["--quick"] if quick else [])
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    procs = []
    for r in range(2):
        log = open(out / f"rank{r}.log", "w")  # noqa: SIM115 -- closed below
        # in the step's process group: killing the step kills its ranks
        procs.append((subprocess.Popen(cmd + ["--rank", str(r)], stdout=log, stderr=log,
                                       env=env), log))
    deadline = time.time() + timeout_s
    error = None
    try:
        for p, _ in procs:
            left = deadline - time.time()
            try:
                p.wait(timeout=max(left, 0.1))
            except subprocess.TimeoutExpired:
                error = f"{mode}: timed out after {timeout_s:.0f} s"
                break
            if p.returncode != 0:
                break  # the other rank may wait forever in a collective
    finally:
        for p, log in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            log.close()
    errs = [f"rank {r}: {(out / f'rank{r}.err').read_text().strip()}" for r in range(2)
            if (out / f"rank{r}.err").exists()]
    if errs:
        return {"error": f"{mode}: " + "; ".join(errs)}
    if error or any(p.returncode != 0 for p, _ in procs):
        return {"error": error or f"{mode}: a rank exited with status "
                f"{[p.returncode for p, _ in procs]} (see {out}/rank*.log)"}
    return json.loads((out / "result.json").read_text())


def megatron_tp_step(device: str, quick: bool, seed: int, out: Path,
                     deadline: float) -> dict[str, Any]:
    """Step (b): the first of :func:`attempts` that completes, each attempt but the last given
    half the time left; the failed attempts' errors are kept in ``failed_attempts``."""
    import importlib.util

    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec(
            "megatron.core") is None:
        return {"status": "skipped", "reason": "megatron-core not installed"}
    import torch

    gpus = torch.cuda.device_count() if device == "cuda" else 0
    tried: list[str] = []
    modes = attempts(device, gpus)
    for i, mode in enumerate(modes):
        left = deadline - time.time()
        share = left if i == len(modes) - 1 else left / 2
        res = run_attempt(mode, out / mode, quick, seed, share)
        if "error" not in res:
            ok = all(res["checks"].values())
            return {"status": "passed" if ok else "failed",
                    "reason": None if ok else "tp 2 differs from tp 1: " + ", ".join(
                        k for k, v in res["checks"].items() if not v),
                    "gpus": gpus, "failed_attempts": tried, **res}
        tried.append(res["error"])
    return {"status": "failed", "reason": "no way to run tp 2 worked: " + " | ".join(tried),
            "gpus": gpus, "failed_attempts": tried}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m real.gpu_check_tp",
                                description="One rank of gpu_check's Megatron tp 2 step.")
    p.add_argument("--rank", type=int, required=True, choices=(0, 1))
    p.add_argument("--mode", required=True, choices=("cuda-nccl", "cuda-gloo", "cpu-gloo"))
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    out = Path(args.out)
    try:
        res = rank_main(args.rank, args.mode, args.port, out, args.quick, args.seed)
    except Exception as exc:  # noqa: BLE001 -- one line for the step's record
        (out / f"rank{args.rank}.err").write_text(
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:500] + "\n")
        traceback.print_exc()
        return 1
    if args.rank == 0:
        (out / "result.json").write_text(json.dumps(res, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
