"""The GPU path's checks in one timed run, for a lent GPU machine.

    python -m real.gpu_check --out DIR [--budget-s 420] [--device cuda] [--quick]
    python experiments/gpu_check.py --out DIR          (the same)

Runs, in order, each step in its own process (a step's CUDA memory, its vLLM engine processes
and its torch.distributed world end with it):

(a) ``vllm``: vLLM's seeded generation, a trainer weight update, greedy equality with the torch
    rollout after it (:func:`real.gpu_check_steps.vllm_step`); skipped without vLLM;
(b) ``megatron_tp2``: one Megatron step at tp = 2 against tp = 1 on the same weights
    (:mod:`real.gpu_check_tp`: two GPUs over NCCL, or both ranks on one GPU over gloo, else on
    CPU tensors); skipped without megatron-core;
(c) ``ppo``: one timed PPO iteration (after a warm-up) with Qwen3-8B-sized layers against the
    cost model's estimate per task (:func:`real.gpu_check_steps.ppo_step`).

Budget: the whole run takes at most ``--budget-s`` seconds of wall clock (plus a few for the
last kill). A step may use what is left minus the shares (:data:`SHARES`) of the steps after it,
so a step that overruns is killed with its process group and the later steps still get theirs;
one whose time would be under :data:`MIN_STEP_S` is skipped. ``--device cpu --quick`` runs the
same steps at toy sizes on CPU (tests/real/test_gpu_check.py).

Writes ``DIR/summary.json`` (every step's record: status passed / failed / skipped, reason,
wall seconds, its numbers), ``DIR/<step>.json`` and ``DIR/<step>.log`` (its output), and prints
a one-screen summary. Exit status: 0 every step that ran passed; 1 a step failed or timed out;
2 bad input or ``--device cuda`` without CUDA (one line on stderr).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STEPS = ("vllm", "megatron_tp2", "ppo")
#: Share of the budget each step is guaranteed against the steps before it.
SHARES = {"vllm": 0.40, "megatron_tp2": 0.25, "ppo": 0.35}
#: A step given less than this many seconds is skipped instead of started.
MIN_STEP_S = 3.0
DEFAULT_BUDGET_S = 420.0


class CheckError(Exception):
    """Bad input or no CUDA: one line, exit 2."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m real.gpu_check",
                                description="vLLM generation and weight update, a Megatron tp 2 "
                                "step, and a timed real-size PPO iteration against the cost "
                                "model, within a wall-clock budget; writes DIR/summary.json.")
    p.add_argument("--out", required=True, help="output directory (created)")
    p.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                   help=f"wall-clock seconds for all steps (default {DEFAULT_BUDGET_S:.0f})")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                   help="cuda (default) or cpu (with --quick: the CI mode)")
    p.add_argument("--quick", action="store_true", help="toy sizes (seconds on CPU)")
    p.add_argument("--layers", type=int, default=4,
                   help="decoder layers of the PPO step's Qwen3-8B-sized models (default 4)")
    p.add_argument("--steps", default=",".join(STEPS),
                   help=f"comma-separated subset of {','.join(STEPS)} (default all)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def check_args(args: argparse.Namespace) -> list[str]:
    """The steps to run, or CheckError."""
    if not 0 < args.budget_s <= 3600:
        raise CheckError(f"--budget-s {args.budget_s:g}: must be in (0, 3600] seconds")
    if not 1 <= args.layers <= 36:
        raise CheckError(f"--layers {args.layers}: must be in [1, 36] (Qwen3-8B has 36)")
    steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    unknown = [s for s in steps if s not in STEPS]
    if unknown or not steps:
        raise CheckError(f"--steps {args.steps!r}: unknown {unknown}; choose from {list(STEPS)}")
    if args.device == "cuda":
        try:
            import torch
        except ImportError as exc:
            raise CheckError(f"torch is not importable ({exc})") from None
        if not torch.cuda.is_available():
            raise CheckError("no CUDA device is available here (torch.cuda.is_available() is "
                             "False); run it on a GPU machine, or use --device cpu --quick")
    return [s for s in STEPS if s in steps]


def step_timeout(step: str, steps: list[str], deadline: float, budget_s: float) -> float:
    """Seconds ``step`` may run: the time left minus the shares of the steps after it."""
    later = steps[steps.index(step) + 1:]
    return deadline - time.time() - sum(SHARES[s] for s in later) * budget_s


def run_step(step: str, args: argparse.Namespace, out: Path, timeout_s: float) -> dict[str, Any]:
    """One step in its own process group, killed after ``timeout_s``; its record."""
    record = out / f"{step}.json"
    record.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "real.gpu_check_steps", "--step", step, "--device", args.device,
           "--out", str(out), "--deadline", f"{time.time() + timeout_s:.3f}",
           "--seed", str(args.seed), "--layers", str(args.layers)] + (
        ["--quick"] if args.quick else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))}
    start = time.time()
    with open(out / f"{step}.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            return {"status": "failed", "reason": f"timed out after {timeout_s:.0f} s (its share "
                    "of --budget-s); killed", "wall_s": time.time() - start,
                    "timeout_s": timeout_s}
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, 9)  # what the step left behind (vLLM's engine process)
    wall = time.time() - start
    if not record.exists():
        tail = (out / f"{step}.log").read_text().strip().splitlines()[-1:] or ["no output"]
        return {"status": "failed", "reason": f"exited with status {proc.returncode} without a "
                f"record: {tail[0][:300]}", "wall_s": wall, "timeout_s": timeout_s}
    return {**json.loads(record.read_text()), "wall_s": wall, "timeout_s": timeout_s}


def environment(device: str) -> dict[str, Any]:
    """Versions and the device, for the summary."""
    import platform

    import torch

    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "device": device}
    if device == "cuda":
        env["gpu"] = torch.cuda.get_device_name(0)
        env["gpus"] = torch.cuda.device_count()
        env["cuda"] = torch.version.cuda
    for name in ("transformers", "megatron.core", "vllm"):
        try:
            from importlib.metadata import version

            env[name] = version({"megatron.core": "megatron-core"}.get(name, name))
        except Exception:  # noqa: BLE001 -- not installed
            env[name] = None
    return env


def one_line(step: str, rec: dict[str, Any]) -> str:
    """A step's line of the summary."""
    head = f"{step:<13} {rec['status']:<8} {rec.get('wall_s', 0.0):6.1f} s"
    if rec["status"] != "passed":
        return f"{head}  {rec.get('reason')}"
    if step == "vllm":
        return (f"{head}  start {rec['engine_start_s']:.1f} s, {rec['tokens_per_s']:.0f} tok/s, "
                f"update {rec['update_weights_s']:.2f} s, greedy first tokens "
                f"{rec['greedy_first_token_matches']}/{rec['prompts']}")
    if step == "megatron_tp2":
        return (f"{head}  {rec['mode']}: loss rel diff {max(rec['loss_rel_diff'].values()):.1e}, "
                f"grad norm {rec['grad_norm_rel_diff']:.1e}, step {rec['tp2']['step_s']:.2f} s "
                f"(tp 1 {rec['tp1']['step_s']:.2f} s)")
    it = rec["iteration"]
    lines = [f"{head}  {rec['model']}: iteration {it['measured_s']:.2f} s measured, "
             f"{it['estimated_s']:.2f} s estimated (x{it['measured_over_estimated']:.2f})"]
    for task, t in rec["tasks"].items():
        ratio = t["measured_over_estimated"]
        est = "      --" if t["estimated_s"] is None else f"{t['estimated_s']:8.3f}"
        lines.append(f"{'':>15}{task:<22} {t['measured_s']:8.3f} s vs {est} s"
                     + (f"  x{ratio:.2f}" if ratio else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        steps = check_args(args)
    except CheckError as exc:
        print(f"gpu_check: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    deadline = started + args.budget_s
    summary: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                               "budget_s": args.budget_s, "quick": args.quick,
                               "environment": environment(args.device), "steps": {}}
    for step in steps:
        timeout = step_timeout(step, steps, deadline, args.budget_s)
        if timeout < MIN_STEP_S:
            rec = {"status": "skipped", "reason": f"budget: {max(timeout, 0):.1f} s left for it, "
                   f"under {MIN_STEP_S:g} s", "wall_s": 0.0}
        else:
            rec = run_step(step, args, out, timeout)
        summary["steps"][step] = rec
        print(one_line(step, rec), flush=True)
    summary["wall_s"] = time.time() - started
    failed = [s for s, r in summary["steps"].items() if r["status"] == "failed"]
    summary["passed"] = not failed
    from hetrl.io import write_text_atomic

    write_text_atomic(out / "summary.json", json.dumps(summary, indent=1, default=float) + "\n")
    print(f"gpu_check: {'FAILED ' + ', '.join(failed) if failed else 'ok'} in "
          f"{summary['wall_s']:.0f} s of {args.budget_s:.0f}; {out / 'summary.json'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
