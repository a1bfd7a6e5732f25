"""Steps (a) and (c) of :mod:`real.gpu_check`, and the entry point each step runs in (its own
process: ``python -m real.gpu_check_steps --step NAME --device D --out DIR --deadline T``,
which writes ``DIR/NAME.json``).

(a) ``vllm``: :class:`~real.engines.vllm_engine.VLLMRollout` (float32) samples twice with one
seed (equal), then takes a :class:`~real.engines.torch_engine.TorchTrainer` step's weights
(``update_weights``: the loaded checkpoint's digest must equal the trainer's) and decodes
greedily next to a :class:`~real.engines.torch_engine.TorchRollout` holding the same weights
(first tokens equal for all but at most one prompt, as tests/real/test_gpu_engines.py asks on
CUDA; the full-length matches are recorded).

(c) ``ppo``: two iterations (the first a warm-up) of a PPO job whose four models have real-size
layers -- Qwen3-8B's hidden, FFN and attention sizes, ``layers`` of them, the byte tokenizer's
259-token vocabulary -- through :func:`real.gpu_smoke.run_torch` (the torch engines, weights
built in bfloat16, as the cost model's ``bf16`` precision assumes), against the cost model's
estimate of the same workload on one device of the local GPU's catalog type (eager generation:
``gen_cuda_graphs`` false, no sleep mode). Per task measured vs estimated seconds and their
ratio, and the iteration's.

A step returns {"status": "passed"|"failed"|"skipped", "reason": ..., ...}.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any

PROMPTS = [[1, 72, 105, 33], [1, 50, 51, 52, 53, 54], [1, 80], [1, 99, 98, 97]]


def _timed(fn: Any, sync: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    sync()
    return out, time.perf_counter() - start


def vllm_step(device: str, quick: bool, seed: int, out: Path, deadline: float) -> dict[str, Any]:
    """Step (a); see the module docstring."""
    if importlib.util.find_spec("vllm") is None:
        return {"status": "skipped", "reason": "vLLM not installed"}
    import torch

    from real.algos import AlgoConfig
    from real.engines.base import make_batch
    from real.engines.torch_engine import TorchRollout, TorchTrainer
    from real.engines.vllm_engine import VLLMRollout
    from real.model import TinyModelSpec
    from real.profile import device_sync
    from real.worker import digest

    # head_dim 32 or 128: sizes vLLM's CPU and CUDA attention backends support
    spec = (TinyModelSpec(hidden=64, layers=2, heads=2, kv_heads=1, head_dim=32, ffn=128,
                          name="tiny-qwen3-hd32") if quick or device == "cpu" else
            TinyModelSpec(hidden=1024, layers=4, heads=8, kv_heads=4, head_dim=128, ffn=3072,
                          name="qwen3-h1024"))
    sync = device_sync(device)
    n_new = 8 if quick else 32
    engine, start_s = _timed(lambda: VLLMRollout(spec, seed, device, gpu_memory_utilization=0.2,
                                                 dtype="float32"), sync)
    try:
        prompts = PROMPTS * (2 if quick else 16)
        a, gen_s = _timed(lambda: engine.generate(prompts, n_new, 1.0, seed + 11), sync)
        b = engine.generate(prompts, n_new, 1.0, seed + 11)
        trainer = TorchTrainer("actor", spec, seed, device, AlgoConfig(lr=1e-2))
        batch = make_batch(prompts, a)
        g = torch.Generator().manual_seed(seed)
        adv = torch.randn(batch.input_ids.shape, generator=g) * batch.response_mask
        trainer.forward_backward(batch, {"advantages": adv, "ref_logp": torch.zeros_like(adv)})
        trainer.step()
        new = trainer.state_dict()
        _, update_s = _timed(lambda: engine.update_weights(new), sync)
        loaded = digest(engine.state_dict()) == digest(new)
        ref = TorchRollout(spec, seed, device)
        ref.update_weights(new)
        greedy = engine.generate(PROMPTS, n_new, 0.0, 0)
        expected = ref.generate(PROMPTS, n_new, 0.0, 0)
    finally:
        engine.close()
    first = sum(g[:1] == e[:1] for g, e in zip(greedy, expected, strict=True))
    full = sum(g == e for g, e in zip(greedy, expected, strict=True))
    tokens = sum(len(r) for r in a)
    checks = {"seeded_sampling_reproducible": a == b,
              "group_repeats_differ": a[: len(PROMPTS)] != a[len(PROMPTS): 2 * len(PROMPTS)],
              "updated_weights_loaded": loaded,
              "greedy_first_tokens_match": first >= len(PROMPTS) - 1}
    ok = all(checks.values())
    return {"status": "passed" if ok else "failed",
            "reason": None if ok else "failed: " + ", ".join(k for k, v in checks.items() if not v),
            "model": spec.name, "dtype": "float32", "engine_start_s": start_s,
            "generate_s": gen_s, "sequences": len(prompts), "tokens": tokens,
            "tokens_per_s": tokens / gen_s, "update_weights_s": update_s,
            "greedy_first_token_matches": first, "greedy_full_matches": full,
            "prompts": len(PROMPTS), "max_new_tokens": n_new, "checks": checks}


def ppo_workload(quick: bool, layers: int) -> Any:
    """The PPO job of step (c): ``layers`` Qwen3-8B-sized layers (quick: one 64-wide layer),
    the byte tokenizer's vocabulary."""
    from hetrl.spec.lengths import LengthDist
    from hetrl.spec.model import ModelShape, model_preset
    from hetrl.spec.presets import tiny_workload

    base = tiny_workload("ppo", "sync")
    if quick:
        shape = ModelShape("toy-h64", 1, 64, 128, 4, 2, 16, 259)
        sizes = {"batch_prompts": 2, "responses_per_prompt": 2, "micro_batch_size": 2,
                 "inference_micro_batch_size": 4,
                 "response_length": LengthDist(mean=4, max=4, min=4, kind="fixed")}
    else:
        q = model_preset("Qwen3-8B")
        shape = ModelShape(f"Qwen3-8B-{layers}L-byte", layers, q.hidden, q.ffn, q.heads,
                           q.kv_heads, q.head_dim, 259)
        sizes = {"batch_prompts": 32, "responses_per_prompt": 4, "micro_batch_size": 16,
                 "inference_micro_batch_size": 32,
                 "response_length": LengthDist(mean=64, max=64, min=64, kind="fixed")}
    return replace(base, name=f"gpu-check-ppo-{shape.name}",
                   models=tuple((r, shape) for r, _ in base.models), gen_cuda_graphs=False,
                   gen_sleep_level=0, **sizes)


@contextlib.contextmanager
def default_dtype(dtype: Any) -> Any:
    """torch's default float dtype set to ``dtype`` within the block (the engines' weights are
    built with it)."""
    import torch

    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def ppo_step(device: str, quick: bool, seed: int, out: Path, deadline: float,
             layers: int = 4, gpu_type: str | None = None) -> dict[str, Any]:
    """Step (c); see the module docstring. ``gpu_type``: the catalog type for the estimate
    (default: the CUDA device's; H200 on CPU)."""
    import torch

    from hetrl.spec.cluster import homogeneous
    from real import gpu_smoke, worker

    workload = ppo_workload(quick, layers)
    if gpu_type is None:
        if device == "cuda":
            props = torch.cuda.get_device_properties(0)
            gpu_type = gpu_smoke.catalog_gpu(props.name, props.total_memory / 1e9)
        else:
            gpu_type = "H200"
    cluster = homogeneous(gpu_type, nodes=1, gpus_per_node=1, name=f"1x{gpu_type}-local")
    setup = worker.DeviceWorker.setup

    def bf16_setup(self: Any, *args: Any, **kwargs: Any) -> Any:
        with default_dtype(torch.bfloat16):
            return setup(self, *args, **kwargs)

    worker.DeviceWorker.setup = bf16_setup  # this process runs only this step
    try:
        (trace, run, last), wall = _timed(
            lambda: gpu_smoke.run_torch(workload, cluster, 2, seed, device), lambda: None)
    finally:
        worker.DeviceWorker.setup = setup
    result = gpu_smoke.compare(trace, workload, cluster, run.plan)
    (out / "ppo-trace.json").write_text(json.dumps(trace.to_dict(), indent=1))
    mask = last["batch"].response_mask
    shape = workload.model("actor")
    ratios = [t["measured_over_estimated"] for t in result["tasks"].values()
              if t["measured_over_estimated"] is not None]
    checks = {"weights_verified": trace.meta.get("weights_verified") == 2,
              "every_task_measured": bool(ratios) and all(r > 0 for r in ratios)}
    ok = all(checks.values())
    return {"status": "passed" if ok else "failed",
            "reason": None if ok else "failed: " + ", ".join(k for k, v in checks.items() if not v),
            "model": shape.name, "layers": shape.layers, "hidden": shape.hidden,
            "params_per_model": shape.params, "dtype": "bfloat16", "cluster": cluster.name,
            "workload": workload.to_dict(), "sequences": int(mask.shape[0]),
            "mean_response_tokens": float(mask.sum()) / mask.shape[0],
            "estimated_response_tokens": workload.response_length.mean,
            "run_s": wall, **result, "checks": checks}


STEPS = {"vllm": vllm_step, "ppo": ppo_step}


def main(argv: list[str] | None = None) -> int:
    from real.gpu_check_tp import megatron_tp_step

    steps = {**STEPS, "megatron_tp2": megatron_tp_step}
    p = argparse.ArgumentParser(prog="python -m real.gpu_check_steps",
                                description="One step of real.gpu_check, in its own process.")
    p.add_argument("--step", required=True, choices=sorted(steps))
    p.add_argument("--device", required=True, choices=("cuda", "cpu"))
    p.add_argument("--out", required=True)
    p.add_argument("--deadline", type=float, required=True, help="epoch seconds to finish by")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--layers", type=int, default=4)
    args = p.parse_args(argv)
    out = Path(args.out)
    kwargs = {"layers": args.layers} if args.step == "ppo" else {}
    try:
        res = steps[args.step](args.device, args.quick, args.seed, out, args.deadline, **kwargs)
    except Exception as exc:  # noqa: BLE001 -- the step's record says what failed
        traceback.print_exc()
        first = str(exc).splitlines()[0] if str(exc) else ""
        res = {"status": "failed", "reason": f"{type(exc).__name__}: {first}"[:500]}
    (out / f"{args.step}.json").write_text(json.dumps(res, indent=1, default=float) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
