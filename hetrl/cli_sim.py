"""``hetrl simulate``: replay iterations of a plan in the discrete-event simulator."""

from __future__ import annotations

import argparse
import json

from hetrl.cli import command, emit, nonnegative_int, output_path, positive_int
from hetrl.errors import OptionError
from hetrl.limits import MAX_ITERATIONS, MAX_SIMULATED_SEQUENCES


def _sim_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", "-w", required=True, help="workload preset name or YAML/JSON file")
    p.add_argument("--cluster", "-c", required=True, help="cluster preset name or YAML/JSON file")
    p.add_argument("--plan", "-p", required=True, help="plan JSON/YAML file")
    p.add_argument("--iterations", "-n", type=positive_int("--iterations", MAX_ITERATIONS), default=3,
                   help="iterations to simulate (default 3)")
    p.add_argument("--seed", type=nonnegative_int("--seed"), default=0,
                   help="seed of the sampled sequence lengths (default 0)")
    p.add_argument("--faults", help="fault scenario YAML (device lost, link degraded, straggler)")
    p.add_argument("--trace", type=output_path("--trace"),
                   help="write the trace as Chrome trace JSON (open in Perfetto)")
    p.add_argument("--trace-raw", type=output_path("--trace-raw"),
                   help="write the trace in hetrl's own schema (JSON)")
    p.add_argument("--params", help="cost-model parameters YAML")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")


@command("simulate", "replay iterations of a plan in the discrete-event simulator", _sim_args)
def cmd_simulate(args: argparse.Namespace) -> int:
    from hetrl.cli_cost import load_params
    from hetrl.io import load_cluster, load_plan, load_workload, read_mapping, write_text_atomic
    from sim import simulate
    from sim.faults import FaultScenario

    workload, cluster = load_workload(args.workload), load_cluster(args.cluster)
    plan = load_plan(args.plan, workload, cluster)
    if args.iterations * workload.samples > MAX_SIMULATED_SEQUENCES:
        raise OptionError("--iterations", args.iterations,
                          f"times {workload.samples:,} sequences per iteration is more than "
                          f"{MAX_SIMULATED_SEQUENCES:,} sequences, the limit of one simulation")
    faults = None
    if args.faults:
        nodes: dict[str, list[int]] = {}
        for d in cluster.devices:
            nodes.setdefault(d.node, []).append(d.id)
        faults = FaultScenario.from_dict(read_mapping(args.faults, "faults"), cluster.num_devices,
                                         cluster.regions, nodes)
    result = simulate(plan, workload, cluster, args.iterations, args.seed, load_params(args.params, cluster),
                      faults)
    if args.trace:
        write_text_atomic(args.trace, json.dumps(result.trace.to_chrome()))
    if args.trace_raw:
        write_text_atomic(args.trace_raw, json.dumps(result.trace.to_dict()))
    m = result.metrics
    lines = [f"{workload.name} on {cluster.name}: {m['iteration_s']:.2f} s per iteration "
             f"(steady state; {m['completed_iterations']}/{m['requested_iterations']} done)",
             "  iterations: " + ", ".join(f"{x:.2f}" for x in m["iterations"])]
    lines += [f"  {t:<21}{s:>10.2f} s" for t, s in m["tasks"].items()]
    f = result.faults
    if f.lost_devices or f.stalled:
        lines.append(f"  faults: lost devices {f.lost_devices}, lost work {f.lost_work_s:.1f} s, "
                     f"stalled {f.stalled}, re-plans {len(f.replans)}")
    emit(args, {k: v for k, v in result.to_dict().items()}, "\n".join(lines))
    return 0
