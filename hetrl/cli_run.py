"""``hetrl run``: execute a plan for real on Ray (torch on CPU or CUDA) and report its timing."""

from __future__ import annotations

import argparse
import sys

from hetrl.cli import (
    allow_mismatch_option,
    command,
    emit,
    load_plan_for,
    nonnegative_int,
    output_dir,
    output_path,
    positive_float,
    positive_int,
    trace_options,
    write_traces,
)
from hetrl.limits import MAX_ITERATIONS


def _run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", "-w", required=True,
                   help="workload preset or YAML/JSON (CPU: a tiny model, e.g. tiny-grpo-sync)")
    p.add_argument("--cluster", "-c", required=True,
                   help="cluster preset or YAML/JSON: its GPU types become emulated Ray resources "
                        "and its topology the emulated network")
    p.add_argument("--plan", "-p", required=True, help="plan JSON/YAML file")
    allow_mismatch_option(p)
    p.add_argument("--iterations", "-n", type=positive_int("--iterations", MAX_ITERATIONS), default=2,
                   help="RL iterations to run (default 2)")
    p.add_argument("--seed", type=nonnegative_int("--seed"), default=0,
                   help="seed of data, sampling and model init (default 0)")
    p.add_argument("--reward", default="math", help="rule reward: math (answer checker) or "
                   "target-byte (trivially learnable); default math")
    p.add_argument("--lr", type=positive_float("--lr"), default=1e-3,
                   help="learning rate of actor and critic (default 1e-3)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="torch device (default cpu)")
    p.add_argument("--engines", metavar="KIND=ENGINE,...", default="",
                   help="engine per task kind, e.g. generation=vllm,training=megatron (vllm needs "
                        "--device cuda; megatron runs any dp/pp/tp training layout, on GPUs or on "
                        "CPU over gloo; default torch for every kind)")
    p.add_argument("--no-network-emulation", action="store_true",
                   help="do not delay transfers by the cluster's latency and bandwidth")
    p.add_argument("--no-speed-emulation", action="store_true",
                   help="do not stretch slower GPU types' compute by their peak ratio")
    p.add_argument("--checkpoint-dir", type=output_dir("--checkpoint-dir"),
                   help="write a checkpoint after every iteration here (a directory, created)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the checkpoint in --checkpoint-dir")
    p.add_argument("--kill-at", metavar="TASK:ITERATION:DEVICE",
                   help="fault injection: that device's worker dies at the start of that task "
                        "in that iteration (counted from 1, as the progress line counts)")
    trace_options(p, "raw")
    p.add_argument("--gantt", type=output_path("--gantt"),
                   help="draw the run as a Gantt chart (.png, or .svg): one row per task group")
    p.add_argument("--per-gpu", action="store_true",
                   help="with --gantt: one row per GPU, tasklets on their tasks")
    p.add_argument("--params", help="cost-model parameters YAML for the estimate it is compared to")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")


def _engines(value: str) -> tuple[tuple[str, str], ...]:
    from hetrl.errors import SpecError

    out = []
    for item in filter(None, (x.strip() for x in value.split(","))):
        kind, sep, name = item.partition("=")
        if not sep or not kind or not name:
            raise SpecError("--engines", value, "must be KIND=ENGINE pairs, e.g. generation=vllm")
        out.append((kind, name))
    return tuple(out)


def _kill_at(value: str | None, iterations: int) -> tuple[str, int, int] | None:
    """``--kill-at TASK:ITERATION:DEVICE`` as ``RunConfig.kill_at``: ITERATION counts from 1
    (as the progress line and the messages do); the library's index counts from 0."""
    from hetrl.errors import SpecError

    if value is None:
        return None
    parts = value.split(":")
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        raise SpecError("--kill-at", value, "must be TASK:ITERATION:DEVICE, e.g. actor_training:1:2")
    if not 1 <= int(parts[1]) <= iterations:
        raise SpecError("--kill-at", value, f"ITERATION must be in 1..{iterations} (--iterations; "
                        "counted from 1)")
    return parts[0], int(parts[1]) - 1, int(parts[2])


@command("run", "execute a plan for real on Ray and print per-iteration and per-task seconds",
         _run_args)
def cmd_run(args: argparse.Namespace) -> int:
    from hetrl.cli_cost import load_params
    from hetrl.io import load_cluster, load_workload
    from hetrl.search.feasibility import require_plan_fits
    from real.report import run_report

    if args.per_gpu and not args.gantt:
        from hetrl.errors import OptionError

        raise OptionError("--per-gpu", True, "goes with --gantt")
    if args.gantt:  # a suffix that is no picture format: exit 2 before the work
        from hetrl.views.plan_picture import picture_format

        picture_format(args.gantt, None, "--gantt")
    workload, cluster = load_workload(args.workload), load_cluster(args.cluster)
    plan = load_plan_for(args, workload, cluster)
    params = load_params(args.params, cluster)
    require_plan_fits(plan, workload, cluster, params)
    try:
        from real.runner import RunConfig, run_plan
    except ModuleNotFoundError as exc:
        from hetrl.errors import HetrlError

        raise HetrlError(f"the real backend needs {exc.name}: pip install -e '.[real]'") from None
    config = RunConfig(iterations=args.iterations, seed=args.seed, reward=args.reward, lr=args.lr,
                       device=args.device, emulate_network=not args.no_network_emulation,
                       emulate_speed=not args.no_speed_emulation,
                       checkpoint_dir=args.checkpoint_dir, resume=args.resume,
                       kill_at=_kill_at(args.kill_at, args.iterations), engines=_engines(args.engines),
                       progress=None if args.json else lambda m: print(m, file=sys.stderr, flush=True))
    result = run_plan(workload, cluster, plan, config)
    write_traces(args, result.trace, "raw")
    if args.gantt:
        from hetrl.views.gantt import write_gantt

        write_gantt(result.trace, args.gantt, plan, cluster, args.per_gpu)
    report = run_report(result, workload, cluster, plan, params)
    report["trace"] = args.trace or args.trace_raw  # the raw trace's file
    error = report["estimate_error"]
    lines = [f"{workload.name} on {cluster.name}: {len(report['iterations'])} iteration(s), "
             f"{report['iteration_s']:.3f} s per iteration measured, "
             f"{report['estimate']['iteration_s']:.3f} s estimated"
             + (f" (error {error:+.1%})" if error is not None else "")]
    for row in report["iterations"]:
        lines.append(f"  iteration {row['iteration']}: {row['seconds']:.3f} s, "
                     f"mean reward {row['mean_reward']:.3f}")
    lines.append(f"  {'task':<22}{'measured s':>12}{'estimate s':>12}")
    for task, s in report["tasks"].items():
        lines.append(f"  {task:<22}{s:>12.3f}{report['estimate']['tasks'].get(task, 0.0):>12.3f}")
    lines.append(f"  weight syncs verified: {report['weights_verified']}")
    emit(args, report, "\n".join(lines))
    return 0
