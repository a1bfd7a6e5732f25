"""One tiny RL run on one CUDA GPU, in this process (no Ray), timed against the cost model.

    python -m real.gpu_smoke --out DIR [--workload tiny-grpo-sync] [--iterations 3]

The device's tasks run through :class:`real.worker.DeviceWorker` (used directly, not as a Ray
actor) with the torch engines on ``cuda``, no emulated network or slowdown; the driver steps are
:class:`real.runner.RealRun`'s (prompts, rewards, advantages), so an iteration is the one
``hetrl run`` performs on a one-device co-located plan. The cluster is one GPU of the catalog
type matching ``torch.cuda.get_device_name()`` (H200, H100, A100-80GB, ...) or ``--cluster``.

Writes ``DIR/trace.json`` (hetrl Trace, source ``real``, meta with ``workload_spec``,
``cluster_spec`` and ``plan``: ``hetrl calibrate --traces DIR/trace.json`` reads it),
``DIR/trace.chrome.json`` and ``DIR/compare.json``, and prints the comparison as JSON: per task
the measured seconds (``Trace.task_seconds``: mean over iterations after the first, which
carries CUDA start-up) and the ``CostModel`` estimate. With megatron-core importable (and not
``--no-megatron``) it also runs MegatronTrainer steps on the last batch: their time, their loss
next to TorchTrainer's for the same weights, and a weight export into a TorchRollout.

Exit status: 0 done; 1 a check failed (a weight digest differed); 2 bad input or no CUDA (one
line on stderr). Small: seconds of GPU work after start-up on an H200.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

INFERENCE_TASKS = ("reward_inference", "reference_inference", "critic_inference",
                   "actor_inference")
TRAINING_TASKS = ("actor_training", "critic_training")
ROLE_KEYS = {"actor_training": ("ref_logp", "advantages"),
             "critic_training": ("returns", "old_values")}


class SmokeError(Exception):
    """Bad input or a missing prerequisite: printed as one line, exit 2."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m real.gpu_smoke",
                                description="One tiny RL run on one CUDA GPU with the torch "
                                "engines (and a megatron-core step if installed): writes a "
                                "hetrl trace and prints measured vs estimated seconds per task.")
    p.add_argument("--out", required=True, help="output directory (created)")
    p.add_argument("--workload", default="tiny-grpo-sync",
                   help="workload preset or file (default tiny-grpo-sync)")
    p.add_argument("--cluster", default=None,
                   help="one-device cluster preset or file (default: the catalog type of the "
                   "detected GPU)")
    p.add_argument("--iterations", type=int, default=3,
                   help="iterations, the first a warm-up (default 3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-megatron", action="store_true", help="skip the megatron-core step")
    return p.parse_args(argv)


# --- environment --------------------------------------------------------------------------------

def require_cuda() -> Any:
    """torch with a CUDA device, or SmokeError."""
    try:
        import torch
    except ImportError as exc:
        raise SmokeError(f"torch is not importable ({exc})") from None
    if not torch.cuda.is_available():
        raise SmokeError("no CUDA device is available here (torch.cuda.is_available() is False); "
                         "run it on a GPU machine")
    return torch


def catalog_gpu(device_name: str, memory_gb: float) -> str:
    """The catalog GPU type of a CUDA device name ("NVIDIA H200" -> "H200"): the types whose
    name before any "-" occurs in ``device_name``, the one with the closest memory."""
    from hetrl.spec.hardware import gpu_catalog

    upper = device_name.upper().replace(" ", "")
    matches = [g for name, g in gpu_catalog().items() if name.split("-")[0].upper() in upper]
    if not matches:
        raise SmokeError(f"GPU {device_name!r} is not in hetrl's catalog; profile it (hetrl "
                         "profile --device cuda --devices 1 --out c.yaml) and pass --cluster c.yaml")
    return min(matches, key=lambda g: (abs(g.memory_gb - memory_gb), -len(g.name))).name


def load_specs(args: argparse.Namespace, torch: Any) -> tuple[Any, Any]:
    from hetrl.errors import HetrlError
    from hetrl.io import load_cluster, load_workload
    from hetrl.spec.cluster import homogeneous

    try:
        workload = load_workload(args.workload)
        if args.cluster:
            cluster = load_cluster(args.cluster)
        else:
            props = torch.cuda.get_device_properties(0)
            gpu = catalog_gpu(props.name, props.total_memory / 1e9)
            cluster = homogeneous(gpu, nodes=1, gpus_per_node=1, name=f"1x{gpu}-local")
    except HetrlError as exc:
        raise SmokeError(str(exc)) from None
    if cluster.num_devices != 1:
        raise SmokeError(f"--cluster {args.cluster}: has {cluster.num_devices} devices; the smoke "
                         "run uses one")
    return workload, cluster


# --- the run ------------------------------------------------------------------------------------

def run_torch(workload: Any, cluster: Any, iterations: int, seed: int,
              device: str = "cuda") -> tuple[Any, Any, dict]:
    """``iterations`` of the workload on cluster device 0, run on torch ``device`` (cuda; the
    tests use cpu); returns (trace, the RealRun whose helpers it used, last batch + extras)."""
    import torch

    from hetrl.plan import colocated_plan
    from hetrl.trace import Trace, task_spans
    from real.engines.base import make_batch
    from real.profile import device_sync
    from real.runner import RealRun, RunConfig
    from real.worker import DeviceWorker
    from real.worker_spec import worker_specs

    plan = colocated_plan(workload, cluster)
    config = RunConfig(iterations=iterations, seed=seed, device=device.split(":")[0],
                       emulate_network=False,
                       emulate_speed=False)
    run = RealRun(workload, cluster, plan, config)
    t0 = time.time()
    spec = worker_specs(workload, cluster, run.tasklets, run.algo, config, t0)[0]
    worker = DeviceWorker(replace(spec, torch_device=device))
    worker.setup()
    spans: list[Any] = []
    iters: list[tuple[float, float]] = []
    last: dict[str, Any] = {}
    start = time.time() - t0
    for it in range(iterations):
        prompts, probs = run._prompts(it)
        responses = worker.generate(it, prompts, run.algo.max_new_tokens, run.algo.temperature,
                                    seed * 1_000_003 + it * 1009)
        batch = make_batch(prompts, responses)
        inf = {t: worker.infer(t, it, batch, {}) for t in INFERENCE_TASKS
               if t in workload.task_names}
        extras, _ = run._advantages(batch, probs, inf, responses)
        mbs = workload.micro_batch_size
        rows = list(range(batch.size))
        for task in TRAINING_TASKS:
            if task not in workload.task_names:
                continue
            micro = [(batch.select(rows[i:i + mbs]), {k: extras[k][rows[i:i + mbs]]
                                                      for k in ROLE_KEYS[task]})
                     for i in range(0, len(rows), mbs)]
            total = float(batch.response_mask.sum()) or 1.0
            worker.train(task, it, micro, [mb.num_response_tokens / total for mb, _ in micro],
                         {}, None, (0,))
        for src, dst, name in (("actor_training", "actor_generation", "weight_sync"),
                               ("critic_training", "critic_inference", "critic_sync"),
                               ("actor_training", "actor_inference", "actor_logprob_sync")):
            if src in workload.task_names and dst in workload.task_names:
                state = worker.export_weights(src)
                held, sent = worker.load_weights(dst, it, name, [0], state)
                if held != sent:
                    raise RuntimeError(f"{name} of iteration {it}: the engine's weights (digest "
                                       f"{held[:12]}) differ from the trainer's ({sent[:12]})")
        device_sync(device)()
        end = time.time() - t0
        drained = worker.drain_spans()
        spans += task_spans(drained) + sorted(drained, key=lambda s: s.start_s)
        iters.append((start, end))
        start = end
        last = {"batch": batch, "extras": extras}
    meta = {**run._meta(), "weights_verified": iterations, "in_process": True,
            "torch_device": device, "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(0) if device.startswith("cuda") else None}
    trace = Trace("real", workload.name, cluster.name, tuple(spans), tuple(iters), meta)
    return trace, run, last


def compare(trace: Any, workload: Any, cluster: Any, plan: Any) -> dict[str, Any]:
    """Measured vs estimated seconds per task and per iteration."""
    from hetrl.cost.model import CostModel

    est = CostModel(workload, cluster).estimate(plan)
    measured = trace.task_seconds()
    tasks = {}
    for task, m in measured.items():
        e = est.tasks.get(task)
        tasks[task] = {"measured_s": m, "estimated_s": e,
                       "measured_over_estimated": (m / e) if e else None}
    its = trace.iteration_seconds()
    its = its[1:] if len(its) > 1 else its
    it_m = sum(its) / len(its)
    return {"tasks": tasks, "iteration": {"measured_s": it_m, "estimated_s": est.iteration_s,
                                          "measured_over_estimated": it_m / est.iteration_s}}


def megatron_step(run: Any, last: dict[str, Any], seed: int, device: str = "cuda") -> dict[str, Any]:
    """MegatronTrainer vs TorchTrainer (same initial weights) on the last batch, three steps
    each, on ``device``."""
    from real.engines.megatron_engine import MegatronTrainer
    from real.engines.torch_engine import TorchRollout, TorchTrainer
    from real.profile import device_sync
    from real.worker import digest, spec_from_shape

    spec = spec_from_shape(run.workload.model("actor"))
    batch, extras = last["batch"], {k: last["extras"][k] for k in ROLE_KEYS["actor_training"]}
    built = time.perf_counter()
    meg = MegatronTrainer("actor", spec, seed, device, run.algo)
    build_s = time.perf_counter() - built
    ref = TorchTrainer("actor", spec, seed, device, run.algo)
    same_start = digest(meg.state_dict()) == digest(ref.state_dict())
    losses, seconds = [], []
    for _ in range(3):
        t = time.perf_counter()
        stats = meg.train_step([(batch, extras)], [1.0])
        device_sync(device)()
        seconds.append(time.perf_counter() - t)
        losses.append(stats["loss"])
    torch_losses = []
    for _ in range(3):
        torch_losses.append(ref.forward_backward(batch, extras)["loss"])
        ref.step()
    rollout = TorchRollout(spec, seed + 1, device)
    rollout.update_weights(meg.state_dict())
    return {"build_s": build_s, "step_s": seconds, "loss": losses, "torch_loss": torch_losses,
            "same_initial_weights": same_start,
            "max_abs_loss_diff": max(abs(a - b) for a, b in zip(losses, torch_losses, strict=True)),
            "exported_to_torch_rollout": digest(rollout.state_dict()) == digest(meg.state_dict())}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.iterations < 1:
            raise SmokeError(f"--iterations {args.iterations}: must be >= 1")
        torch = require_cuda()
        workload, cluster = load_specs(args, torch)
    except SmokeError as exc:
        print(f"gpu_smoke: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    trace, run, last = run_torch(workload, cluster, args.iterations, args.seed)
    result: dict[str, Any] = {"gpu": torch.cuda.get_device_name(0), "cluster": cluster.name,
                              "workload": workload.name, "iterations": args.iterations,
                              **compare(trace, workload, cluster, run.plan)}
    if args.no_megatron:
        result["megatron"] = "skipped (--no-megatron)"
    else:
        try:
            import megatron.core  # noqa: F401
        except ImportError as exc:
            result["megatron"] = f"skipped: megatron-core is not importable ({exc})"
        else:
            result["megatron"] = megatron_step(run, last, args.seed)
    result["wall_s"] = time.time() - started
    trace = replace(trace, meta={**trace.meta, "megatron": result["megatron"]})
    (out / "trace.json").write_text(json.dumps(trace.to_dict(), indent=1))
    (out / "trace.chrome.json").write_text(json.dumps(trace.to_chrome()))
    (out / "compare.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    meg = result["megatron"]
    if isinstance(meg, dict) and not (meg["same_initial_weights"] and meg["exported_to_torch_rollout"]):
        print("gpu_smoke: megatron weights did not match (see compare.json)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except RuntimeError as exc:
        print(f"gpu_smoke: {exc}", file=sys.stderr)
        sys.exit(1)
