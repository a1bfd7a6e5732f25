"""Achieved efficiency of the cost model's kernel kinds on the local GPU, next to the defaults.

    python -m real.gpu_kernels --out DIR [--model Qwen3-8B] [--layers N] [--device cuda]

A real-size model (a ``hetrl`` model preset, random weights, bf16, SDPA attention) runs in
transformers on one device; each figure is the shortest of timed repetitions
(:func:`real.profile.best_seconds`), set against the catalog peak of the GPU type
(:func:`real.gpu_smoke.catalog_gpu`, or ``--gpu-type``) and the default efficiency factor
(:data:`hetrl.cost.params.KERNEL_KINDS`; for the matmul kinds at the model's hidden size,
``CostParams.flops_efficiency``):

- ``matmul``: an n x n bf16 matmul (``real.profile.measure_matmul_tflops``) / ``bf16_tflops``;
- ``hbm``: copy bandwidth, bytes read + written (``real.profile.measure_copy_gbps``) /
  ``hbm_gbps``, next to the ``hbm`` factor;
- ``train_flops``: forward + backward with a loss on every token, ``batch`` x ``seq`` tokens.
  FLOPs as the cost model counts them (:class:`hetrl.cost.flops.StageShape` of the whole model,
  tp 1): 3 x (matmul FLOPs per token x tokens + causal attention, per sequence the
  attention-score FLOPs per context token x seq^2 / 2);
- ``infer_flops``: a forward pass with logits at every token (reference / reward inference),
  the same FLOPs x 1;
- ``decode_hbm``: one decode step of ``decode_batch`` sequences at context ``context`` with the
  KV cache of a prefill: bytes = weights + batch x context x KV bytes per token (as
  ``hetrl.cost.tasks`` charges a saturated step) over ``hbm_gbps``; ``--profile-decode`` adds
  torch.profiler's table of three such steps (``DIR/decode_profile.txt``).

transformers runs eagerly (no CUDA graphs, no fused or paged kernels; its cache appends with a
copy), so the model rows are what this stack reaches -- a floor under vLLM and Megatron, not
their figure. Writes ``DIR/kernels.json`` (atomically) and prints it. Exit status 2 on bad input
or with ``--device cuda`` and no CUDA device.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any


class KernelsError(Exception):
    """Bad input or a missing prerequisite: printed as one line, exit 2."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m real.gpu_kernels",
                                description="Measure achieved matmul, HBM, training, inference "
                                "and decode efficiency of a real-size model on the local GPU "
                                "and compare them with the cost model's default efficiency "
                                "factors; writes DIR/kernels.json.")
    p.add_argument("--out", required=True, help="output directory (created)")
    p.add_argument("--model", default="Qwen3-8B", help="hetrl model preset (default Qwen3-8B)")
    p.add_argument("--layers", type=int, default=None,
                   help="decoder layers to build (default: the model's own)")
    p.add_argument("--batch", type=int, default=4, help="training sequences (default 4)")
    p.add_argument("--seq", type=int, default=1024, help="tokens per sequence (default 1024)")
    p.add_argument("--infer-batch", type=int, default=8, help="inference sequences (default 8)")
    p.add_argument("--decode-batch", type=int, default=64, help="decode sequences (default 64)")
    p.add_argument("--context", type=int, default=1024, help="decode context tokens (default 1024)")
    p.add_argument("--budget", type=float, default=2.0,
                   help="seconds of timed repetitions per row (default 2)")
    p.add_argument("--profile-decode", action="store_true",
                   help="also profile three decode steps (torch.profiler) into "
                   "DIR/decode_profile.txt")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                   help="torch device (cpu: for tests, with --gpu-type)")
    p.add_argument("--gpu-type", default=None,
                   help="catalog GPU type for the peaks (default: the detected CUDA device's)")
    return p.parse_args(argv)


def _check(args: argparse.Namespace) -> None:
    for name in ("batch", "seq", "infer_batch", "decode_batch", "context"):
        value = getattr(args, name)
        if value < 1:
            raise KernelsError(f"--{name.replace('_', '-')} {value}: must be >= 1")
    if args.layers is not None and args.layers < 1:
        raise KernelsError(f"--layers {args.layers}: must be >= 1")
    if not 0 < args.budget <= 600:
        raise KernelsError(f"--budget {args.budget}: must be in (0, 600] seconds")


def resolve(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """(torch, the ModelShape to build, the catalog GPUType), or KernelsError."""
    from dataclasses import replace

    from hetrl.errors import HetrlError
    from hetrl.spec.hardware import gpu_catalog
    from hetrl.spec.model import model_preset

    _check(args)
    try:
        shape = model_preset(args.model, field="--model")
    except HetrlError as exc:
        raise KernelsError(str(exc)) from None
    if args.layers is not None:
        shape = replace(shape, layers=args.layers)
    if args.device == "cuda":
        from real.gpu_smoke import SmokeError, catalog_gpu, require_cuda

        try:
            torch = require_cuda()
            props = torch.cuda.get_device_properties(0)
            name = args.gpu_type or catalog_gpu(props.name, props.total_memory / 1e9)
        except SmokeError as exc:
            raise KernelsError(str(exc)) from None
    else:
        import torch

        if args.gpu_type is None:
            raise KernelsError("--device cpu needs --gpu-type (the catalog type whose peaks "
                               "to compare with)")
        name = args.gpu_type
    catalog = gpu_catalog()
    if name not in catalog:
        raise KernelsError(f"--gpu-type {name!r}: not in the catalog ({sorted(catalog)})")
    return torch, shape, catalog[name]


def _row(seconds: float, work: float, unit: str, peak: float, default: float) -> dict[str, Any]:
    """One measured row: ``work`` FLOPs or bytes done in ``seconds``; ``peak`` in the same unit
    per second; the cost model's time for it is work / (peak x default)."""
    model_s = work / (peak * default)
    return {"measured_s": seconds, unit: work, "achieved_of_peak": work / seconds / peak,
            "default_efficiency": default, "cost_model_s": model_s,
            "measured_over_cost_model": seconds / model_s}


def measure(args: argparse.Namespace, torch: Any, shape: Any, gpu: Any) -> dict[str, Any]:
    """Every row; a row that fails records its error instead of stopping the others."""
    from transformers import DynamicCache

    from hetrl.cost.flops import StageShape
    from hetrl.cost.params import DEFAULT_PARAMS, KERNEL_KINDS
    from real.model import CACHE_KWARG, TinyModelSpec, build_causal_lm
    from real.profile import best_seconds, device_sync, measure_copy_gbps, measure_matmul_tflops

    dev = args.device
    sync = device_sync(dev)
    peak_flops = gpu.bf16_tflops * 1e12
    peak_Bps = gpu.hbm_gbps * 1e9
    stage = StageShape(shape, shape.layers, 1, True, True, True, 2)
    rows: dict[str, Any] = {}
    profiles: dict[str, str] = {}

    def attempt(name: str, fn: Any) -> None:
        try:
            rows[name] = fn()
        except Exception as exc:  # noqa: BLE001 -- reported in the row, the others still run
            rows[name] = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"gpu_kernels: {name}: {json.dumps(rows[name])}", file=sys.stderr, flush=True)

    def matmul() -> dict[str, Any]:
        n = 8192 if dev == "cuda" else 256
        tflops, dtype = measure_matmul_tflops(dev, n, args.budget)
        return {"n": n, "dtype": dtype, "tflops": tflops,
                "achieved_of_peak": tflops / gpu.bf16_tflops}

    def copy() -> dict[str, Any]:
        nbytes = 2 * 2**30 if dev == "cuda" else 32 * 2**20
        gbps = measure_copy_gbps(dev, nbytes, args.budget)
        return {"bytes": nbytes, "gbps": gbps, "achieved_of_peak": gbps / gpu.hbm_gbps,
                "default_efficiency": KERNEL_KINDS["hbm"]}

    attempt("matmul", matmul)
    attempt("hbm", copy)
    spec = TinyModelSpec(vocab=shape.vocab, hidden=shape.hidden, layers=shape.layers,
                         heads=shape.heads, kv_heads=shape.kv_heads, head_dim=shape.head_dim,
                         ffn=shape.ffn, max_positions=max(args.seq, args.context + 128))
    built = time.perf_counter()
    with torch.device(dev):
        torch.set_default_dtype(torch.bfloat16)
        try:
            model = build_causal_lm(spec, seed=0)
        finally:
            torch.set_default_dtype(torch.float32)
    sync()
    build_s = time.perf_counter() - built
    gen = torch.Generator(device="cpu").manual_seed(0)

    def tokens(b: int, s: int) -> Any:
        return torch.randint(0, shape.vocab, (b, s), generator=gen).to(dev)

    def flops(b: int, s: int, mult: float) -> float:
        return mult * (stage.matmul_flops_per_token * b * s
                       + stage.attn_flops_per_token_ctx * b * s * s / 2)

    def train() -> dict[str, Any]:
        ids = tokens(args.batch, args.seq)
        model.train()

        def step() -> None:
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            model.zero_grad(set_to_none=True)

        s = best_seconds(step, args.budget, sync)
        return {"batch": args.batch, "seq": args.seq,
                **_row(s, flops(args.batch, args.seq, 3.0), "flops", peak_flops,
                       DEFAULT_PARAMS.flops_efficiency(gpu.name, "train_flops", shape.hidden))}

    def infer() -> dict[str, Any]:
        ids = tokens(args.infer_batch, args.seq)
        model.eval()

        def forward() -> None:
            with torch.no_grad():
                model(input_ids=ids, use_cache=False)

        s = best_seconds(forward, args.budget, sync)
        return {"batch": args.infer_batch, "seq": args.seq,
                **_row(s, flops(args.infer_batch, args.seq, 1.0), "flops", peak_flops,
                       DEFAULT_PARAMS.flops_efficiency(gpu.name, "infer_flops", shape.hidden))}

    def decode() -> dict[str, Any]:
        model.eval()
        b, c = args.decode_batch, args.context
        cache = {CACHE_KWARG: DynamicCache(config=model.config)}
        with torch.no_grad():
            model(input_ids=tokens(b, c), use_cache=True, logits_to_keep=1, **cache)
        nxt = tokens(b, 1)

        def step() -> None:
            with torch.no_grad():
                model(input_ids=nxt, use_cache=True, **cache)

        s = best_seconds(step, args.budget, sync, max_reps=64)
        if args.profile_decode:
            profiles["decode"] = _profile(dev, step, sync)
        bytes_ = stage.weight_bytes - shape.vocab * shape.hidden * 2 \
            + b * c * stage.kv_bytes_per_token  # the input embedding is gathered, not streamed
        step_flops = b * (stage.matmul_flops_per_token + stage.attn_flops_per_token_ctx * c)
        return {"batch": b, "context": c,
                "achieved_flops_of_peak": step_flops / s / peak_flops,
                **_row(s, bytes_, "bytes", peak_Bps, KERNEL_KINDS["decode_hbm"])}

    attempt("train_flops", train)
    if dev == "cuda":
        torch.cuda.empty_cache()
    attempt("infer_flops", infer)
    attempt("decode_hbm", decode)
    return {"model": shape.name, "layers": shape.layers, "params": shape.params,
            "attention": model.config._attn_implementation, "build_s": build_s, "rows": rows,
            "profiles": profiles}


def _profile(dev: str, step: Any, sync: Any, reps: int = 3) -> str:
    """torch.profiler's table of ``reps`` calls of ``step`` (``sync`` waits for the device),
    by device time on CUDA (host time on CPU): where a step's time goes, host or device."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(reps):
            step()
        sync()
    key = "device_time_total" if dev == "cuda" else "cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=14, max_name_column_width=60)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        torch, shape, gpu = resolve(args)
    except KernelsError as exc:
        print(f"gpu_kernels: {exc}", file=sys.stderr)
        return 2
    started = time.time()
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
        "gpu_type": gpu.name, "bf16_tflops": gpu.bf16_tflops, "hbm_gbps": gpu.hbm_gbps,
        "torch": torch.__version__, **measure(args, torch, shape, gpu)}
    result["wall_s"] = time.time() - started
    from hetrl.io import write_text_atomic

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, table in result.pop("profiles").items():
        write_text_atomic(out / f"{name}_profile.txt", table + "\n")
    text = json.dumps(result, indent=1)
    write_text_atomic(out / "kernels.json", text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
