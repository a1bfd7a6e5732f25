"""The ``hetrl`` command: a thin layer over the library. Bad input: one line, exit code 2."""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

from hetrl.errors import HetrlError, OptionError

Handler = Callable[[argparse.Namespace], int]
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Handler]] = {}


def command(name: str, help_text: str, configure: Callable[[argparse.ArgumentParser], None]):
    """Register a subcommand (one registry; duplicate names are an error)."""
    def deco(fn: Handler) -> Handler:
        if name in COMMANDS:
            raise RuntimeError(f"duplicate command {name!r}")
        COMMANDS[name] = (help_text, configure, fn)
        return fn
    return deco


def emit(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(json_safe(data), indent=2, allow_nan=False) if args.json else text)


def json_safe(data: Any) -> Any:
    """``data`` with every non-finite float (an infeasible best, an unbounded rate) as None: JSON
    has no Infinity or NaN (RFC 8259), and strict parsers reject them."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: json_safe(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [json_safe(v) for v in data]
    return data


# --- argument types: checked while parsing, before any work; a bad value is one line, exit 2 --

def _number_type(option: str, convert: Callable[[str], Any], ok: Callable[[Any], bool],
                 limit: str) -> Callable[[str], Any]:
    def parse(value: str) -> Any:
        try:
            number = convert(value)
        except ValueError:
            raise OptionError(option, value, limit) from None
        if not ok(number):
            raise OptionError(option, value, limit)
        return number
    return parse


def nonnegative_int(option: str) -> Callable[[str], int]:
    """The argparse type of an integer option >= 0 (seeds)."""
    return _number_type(option, int, lambda n: n >= 0, "must be an integer >= 0")


def positive_int(option: str, most: int | None = None) -> Callable[[str], int]:
    """The argparse type of an integer option >= 1 (sizes, counts, budgets), at most ``most``
    (hetrl.limits)."""
    if most is None:
        return _number_type(option, int, lambda n: n >= 1, "must be an integer >= 1")
    return _number_type(option, int, lambda n: 1 <= n <= most,
                        f"must be an integer >= 1 and <= {most:,}")


def positive_float(option: str, most: float | None = None) -> Callable[[str], float]:
    """The argparse type of a number option, finite and > 0 (seconds, rates), at most ``most``."""
    if most is None:
        return _number_type(option, float, lambda x: math.isfinite(x) and x > 0,
                            "must be a finite number > 0")
    return _number_type(option, float, lambda x: math.isfinite(x) and 0 < x <= most,
                        f"must be a finite number > 0 and <= {most:g}")


def positive_float_or_inf(option: str) -> Callable[[str], float]:
    """The argparse type of a limit option: a number > 0, or inf for no limit."""
    return _number_type(option, float, lambda x: x > 0, "must be a number > 0 (inf: no limit)")


def output_path(option: str) -> Callable[[str], str]:
    """The argparse type of an output file option: a path a file can be written to."""
    from hetrl.io import check_output_path

    return _checked_output(option, check_output_path)


#: What each trace option writes. ``--trace`` keeps, in each command, the format it always had
#: there (``hetrl simulate``: Chrome; ``hetrl run``: raw); the other two spell one format each.
TRACE_FORMATS = {"chrome": "Chrome trace JSON (open it in Perfetto)",
                 "raw": "hetrl's Trace schema, JSON (the input of hetrl calibrate)"}


def trace_options(p: argparse.ArgumentParser, trace_format: str) -> None:
    """``--trace FILE`` (in the command's own ``trace_format``), ``--chrome-trace FILE`` and
    ``--trace-raw FILE``; each path is checked while parsing, before any work."""
    same = "--chrome-trace" if trace_format == "chrome" else "--trace-raw"
    p.add_argument("--trace", type=output_path("--trace"), metavar="FILE",
                   help=f"write the trace as {TRACE_FORMATS[trace_format]}, as {same} does")
    p.add_argument("--chrome-trace", type=output_path("--chrome-trace"), metavar="FILE",
                   help=f"write the trace as {TRACE_FORMATS['chrome']}")
    p.add_argument("--trace-raw", type=output_path("--trace-raw"), metavar="FILE",
                   help=f"write the trace as {TRACE_FORMATS['raw']}")


def write_traces(args: argparse.Namespace, trace: Any, trace_format: str) -> None:
    """Write the files :func:`trace_options` asked for, each atomically."""
    from hetrl.io import write_text_atomic

    for option, path, fmt in (("--trace", args.trace, trace_format),
                              ("--chrome-trace", args.chrome_trace, "chrome"),
                              ("--trace-raw", args.trace_raw, "raw")):
        if path:
            data = trace.to_chrome() if fmt == "chrome" else trace.to_dict()
            write_text_atomic(path, json.dumps(data), option)


def output_dir(option: str) -> Callable[[str], str]:
    """The argparse type of an output directory option: a folder files can be written in
    (existing, or creatable), not a file."""
    from hetrl.io import check_output_dir

    return _checked_output(option, check_output_dir)


def _checked_output(option: str, check: Callable[[str, str], Any]) -> Callable[[str], str]:
    """An argparse type that runs ``check(value, option)`` and turns its SpecError into the
    option's error."""
    def parse(value: str) -> str:
        from hetrl.errors import SpecError

        try:
            check(value, option)
        except SpecError as exc:
            raise OptionError(option, value, exc.problem) from None
        return value
    return parse


def allow_mismatch_option(p: argparse.ArgumentParser) -> None:
    """``--allow-mismatch``: use a plan made for another workload or cluster."""
    p.add_argument("--allow-mismatch", action="store_true",
                   help="use the plan even if it was made for another workload or cluster (its "
                        "made_for fingerprints differ from -w/-c's): a warning, not exit 2")


def load_plan_for(args: argparse.Namespace, workload: Any, cluster: Any) -> Any:
    """``args.plan`` checked to be made for ``workload`` and ``cluster`` (named as ``-w`` and
    ``-c`` give them; exit 2 on a mismatch unless ``--allow-mismatch``) and validated against
    them; the check's warning is one line on stderr."""
    from hetrl.io import load_plan, spec_name

    return load_plan(args.plan, workload, cluster, workload_name=spec_name(args.workload),
                     cluster_name=spec_name(args.cluster),
                     allow_mismatch=getattr(args, "allow_mismatch", False),
                     warn=lambda note: print(f"hetrl {args.command}: warning: {note}",
                                             file=sys.stderr))


def stamped(plan: Any, args: argparse.Namespace, workload: Any, cluster: Any) -> Any:
    """``plan`` recording the fingerprints of ``workload`` and ``cluster`` under the names
    ``-w`` and ``-c`` give them (written with every plan hetrl writes)."""
    from dataclasses import replace

    from hetrl.fingerprint import made_for
    from hetrl.io import spec_name

    return replace(plan, made_for=made_for(workload, cluster, spec_name(args.workload),
                                           spec_name(args.cluster)))


def _json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")


def _wcp(p: argparse.ArgumentParser, plan: bool = True) -> None:
    p.add_argument("--workload", "-w", required=True, help="workload preset name or YAML/JSON file")
    p.add_argument("--cluster", "-c", required=True, help="cluster preset name or YAML/JSON file")
    if plan:
        p.add_argument("--plan", "-p", required=True, help="plan JSON/YAML file")
        allow_mismatch_option(p)
    _json_flag(p)


# --- presets ------------------------------------------------------------------------------------

@command("presets", "list built-in workloads, clusters, GPU types and models", _json_flag)
def cmd_presets(args: argparse.Namespace) -> int:
    from hetrl.spec.hardware import gpu_catalog
    from hetrl.spec.model import model_presets
    from hetrl.spec.presets import CLUSTER_PRESETS, WORKLOAD_PRESETS

    data = {
        "workloads": list(WORKLOAD_PRESETS),
        "clusters": list(CLUSTER_PRESETS),
        "gpus": list(gpu_catalog()),
        "models": list(model_presets()),
    }
    lines = ["workloads:"] + [f"  {n:<22} {d}" for n, (d, _) in WORKLOAD_PRESETS.items()]
    lines += ["clusters:"] + [f"  {n:<34} {d}" for n, (d, _) in CLUSTER_PRESETS.items()]
    lines += ["gpus:"] + [
        f"  {g.name:<10} {g.bf16_tflops:>6g} TFLOPS  {g.memory_gb:>4g} GB  {g.hbm_gbps:>5g} GB/s  "
        f"{g.intra_link}" + (f"  FP8 {g.fp8_tflops:g} TFLOPS" if g.has_fp8 else "")
        for g in gpu_catalog().values()]
    lines += ["models:"] + [
        f"  {m.name:<15} {m.params / 1e9:6.2f} B params"
        + (f" ({m.active_params / 1e9:.2f} B active: {m.moe.experts} experts, top-{m.moe.top_k})"
           if m.moe is not None else "") for m in model_presets().values()]
    emit(args, data, "\n".join(lines))
    return 0


# --- describe -----------------------------------------------------------------------------------

def _describe_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", help="cluster or workload: a preset name or a YAML/JSON file")
    _json_flag(p)


@command("describe", "summarise a cluster or a workload", _describe_args)
def cmd_describe(args: argparse.Namespace) -> int:
    from pathlib import Path

    from hetrl.describe import describe_cluster, describe_workload, format_cluster, format_workload
    from hetrl.errors import SpecError, did_you_mean
    from hetrl.io import load_cluster, load_workload, read_mapping
    from hetrl.spec.presets import CLUSTER_PRESETS, WORKLOAD_PRESETS, preset_name

    target = args.target
    if target in CLUSTER_PRESETS:
        is_cluster = True
    elif target in WORKLOAD_PRESETS:
        is_cluster = False
    elif not Path(target).exists() and preset_name(target, CLUSTER_PRESETS):
        is_cluster = True  # a preset name typed in another case
    elif not Path(target).exists() and preset_name(target, WORKLOAD_PRESETS):
        is_cluster = False
    elif Path(target).exists():
        data = read_mapping(target, "describe")
        is_cluster = "nodes" in data
        if not is_cluster and "algorithm" not in data:
            raise SpecError("describe", target, "neither a cluster (it has no 'nodes') nor a "
                            f"workload (no 'algorithm'); its keys: {sorted(data)}")
    else:
        raise SpecError("describe", target, "neither a preset nor a file; see `hetrl presets` "
                        "for the names"
                        f"{did_you_mean(target, [*CLUSTER_PRESETS, *WORKLOAD_PRESETS])}")
    if is_cluster:
        info = describe_cluster(load_cluster(target))
        emit(args, info, format_cluster(info))
    else:
        info = describe_workload(load_workload(target))
        emit(args, info, format_workload(info))
    return 0


# --- validate -----------------------------------------------------------------------------------

@command("validate", "check that a plan fits a workload and a cluster", _wcp)
def cmd_validate(args: argparse.Namespace) -> int:
    from hetrl.io import load_cluster, load_workload

    workload, cluster = load_workload(args.workload), load_cluster(args.cluster)
    plan = load_plan_for(args, workload, cluster)
    emit(args, {"valid": True, "tasks": [p.task for p in plan.placements],
                "devices": len(plan.device_ids),
                **({"sync_relay": True} if plan.sync_relay else {})},
         f"plan is valid: {len(plan.placements)} tasks on {len(plan.device_ids)} devices"
         + (", weight sync relayed (one copy per remote region)" if plan.sync_relay else ""))
    return 0


# --- entry point --------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hetrl",
        description="Plan, estimate, search and simulate RL post-training on heterogeneous GPUs.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (help_text, configure, _) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        configure(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    _load_command_modules()
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except HetrlError as exc:  # an option's value (see the argument types above)
        given = list(sys.argv[1:] if argv is None else argv)
        name = next((a for a in given if a in COMMANDS), None)
        print(f"hetrl {name}: error: {exc}" if name else f"hetrl: error: {exc}", file=sys.stderr)
        return 2
    try:
        return COMMANDS[args.command][2](args)
    except HetrlError as exc:
        print(f"hetrl {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"hetrl {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into a reader that closed early (e.g. `head`)
        sys.stderr.close()
        return 0


def console_main() -> int:
    """The ``hetrl`` console script: :func:`main`, then every object is frozen out of the
    interpreter's final garbage collection, which would otherwise rescan a search's memos just
    before the process ends (1.1 s after a 20 s paper64 search; 0.06 s frozen)."""
    code = main()
    gc.freeze()
    return code


def _load_command_modules() -> None:
    """Commands defined in other modules register themselves on import."""
    import importlib

    for module in ("hetrl.cli_cost", "hetrl.cli_search", "hetrl.cli_sim", "hetrl.cli_run",
                   "hetrl.cli_real", "hetrl.cli_views"):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise


if __name__ == "__main__":
    # Under `python -m hetrl.cli` this module is `__main__`, but command modules register on
    # `hetrl.cli`: run that module's main so that every command is there.
    from hetrl.cli import console_main as _console_main

    sys.exit(_console_main())
