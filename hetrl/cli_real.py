"""``hetrl profile`` and ``hetrl calibrate``: measure local devices, fit the cost model to traces.

torch and Ray are imported inside the commands only, so ``hetrl --help`` stays fast.
"""

from __future__ import annotations

import argparse

from hetrl.cli import _json_flag, command, emit, output_path, positive_float, positive_int


def _profile_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--devices", "-n", type=int, required=True,
                   help="devices of the local node (1..64); CPU RAM is split between them")
    p.add_argument("--gpu-name", default="cpu-local",
                   help="name of the GPU type written to the cluster file (default: cpu-local)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="what to measure: the CPU (float32 matmul, one thread) or CUDA device 0 "
                        "(bf16 matmul)")
    p.add_argument("--seconds", type=positive_float("--seconds"), default=6.0,
                   help="time budget of the timed loops, seconds (default 6)")
    p.add_argument("--quick", action="store_true",
                   help="small sizes and a 0.5 s budget: rough figures in a few seconds")
    p.add_argument("--name", default=None, help="cluster name (default: profiled-<hostname>)")
    p.add_argument("--out", "-o", required=True, type=output_path("--out"),
                   help="cluster YAML file to write")
    _json_flag(p)


@command("profile", "measure the local devices (matmul, memory copy, Ray link) into a cluster "
         "YAML", _profile_args)
def cmd_profile(args: argparse.Namespace) -> int:
    import yaml

    from hetrl.io import write_text_atomic
    from hetrl.spec.cluster import ClusterSpec
    from real.profile import cluster_dict, profile_devices

    seconds = 0.5 if args.quick else args.seconds
    result = profile_devices(args.devices, args.gpu_name, args.device, seconds, quick=args.quick)
    data = cluster_dict(result, args.devices, args.name or f"profiled-{result.hostname}",
                        args.gpu_name)
    ClusterSpec.from_dict(data)  # what we write must load
    write_text_atomic(args.out, "# Written by `hetrl profile`; see docs/real.md.\n"
                      + yaml.safe_dump(data, sort_keys=False), "--out")
    out = {"matmul_tflops": result.matmul_tflops, "hbm_gbps": result.hbm_gbps,
           "link_latency_s": result.link_latency_s, "link_gbps": result.link_gbps,
           "memory_gb": result.memory_gb, "device": result.device, "dtype": result.dtype,
           "out": str(args.out)}
    text = "\n".join([
        f"{args.devices} x {args.gpu_name} ({result.device}) on {result.hostname}:",
        f"  matmul        {result.matmul_tflops:10.4g} TFLOPS ({result.dtype})",
        f"  memory copy   {result.hbm_gbps:10.4g} GB/s (read + write)",
        f"  link latency  {result.link_latency_s * 1e6:10.4g} us one way (Ray actors)",
        f"  link          {result.link_gbps:10.4g} GB/s one way (Ray actors)",
        f"  memory        {result.memory_gb:10.4g} GB per device",
        f"  wrote {args.out}"])
    emit(args, out, text)
    return 0


def _calibrate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--traces", "-t", nargs="*", default=[],
                   help="trace files in hetrl's Trace JSON schema, each with its specs in meta "
                        "(workload_spec, cluster_spec, plan); at least one is required")
    p.add_argument("--out", "-o", required=True, type=output_path("--out"),
                   help="parameters YAML to write (read back by `hetrl estimate --params`)")
    p.add_argument("--params", help="starting parameters YAML (default: the built-in defaults)")
    p.add_argument("--sweeps", type=positive_int("--sweeps"), default=8,
                   help="least-squares steps per fitted parameter at most (default 8)")
    _json_flag(p)


@command("calibrate", "fit the cost model's efficiency factors and decode overhead to measured "
         "traces", _calibrate_args)
def cmd_calibrate(args: argparse.Namespace) -> int:
    from hetrl.calibrate import fit_params, format_result, load_runs, result_json
    from hetrl.cli_cost import load_params
    from hetrl.io import dump

    runs = load_runs(args.traces)
    result = fit_params(runs, load_params(args.params), max_sweeps=args.sweeps)
    dump(result.params.to_dict(), args.out, "--out")
    emit(args, result_json(result, str(args.out)), format_result(result, str(args.out)))
    return 0
