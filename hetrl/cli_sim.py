"""``hetrl simulate``: replay iterations of a plan in the discrete-event simulator."""

from __future__ import annotations

import argparse

from hetrl.cli import (
    allow_mismatch_option,
    command,
    emit,
    load_plan_for,
    nonnegative_int,
    output_path,
    positive_int,
    trace_options,
    write_traces,
)
from hetrl.errors import OptionError
from hetrl.limits import MAX_ITERATIONS, MAX_SIMULATED_SEQUENCES

#: Exit code of ``hetrl simulate`` when the run stalled (a device lost and no re-plan): the
#: simulation answered, and the answer is "stalled" (2 is bad input, 3 a plan that does not fit
#: for ``hetrl estimate``).
EXIT_STALLED = 4


def _sim_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", "-w", required=True, help="workload preset name or YAML/JSON file")
    p.add_argument("--cluster", "-c", required=True, help="cluster preset name or YAML/JSON file")
    p.add_argument("--plan", "-p", required=True, help="plan JSON/YAML file")
    allow_mismatch_option(p)
    p.add_argument("--iterations", "-n", type=positive_int("--iterations", MAX_ITERATIONS), default=3,
                   help="iterations to simulate (default 3)")
    p.add_argument("--seed", type=nonnegative_int("--seed"), default=0,
                   help="seed of the sampled sequence lengths (default 0)")
    p.add_argument("--faults", help="fault scenario YAML (device lost, link degraded, straggler)")
    trace_options(p, "chrome")
    p.add_argument("--gantt", type=output_path("--gantt"),
                   help="draw the run as a Gantt chart (.png, or .svg): one row per task group")
    p.add_argument("--per-gpu", action="store_true",
                   help="with --gantt: one row per GPU, tasklets on their tasks")
    p.add_argument("--params", help="cost-model parameters YAML")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")


@command("simulate", "replay iterations of a plan in the discrete-event simulator (a plan that "
         "does not fit is refused: exit 2)", _sim_args)
def cmd_simulate(args: argparse.Namespace) -> int:
    from hetrl.cli_cost import load_params
    from hetrl.io import load_cluster, load_workload, read_mapping
    from hetrl.search.feasibility import require_plan_fits
    from sim import simulate
    from sim.faults import FaultScenario

    if args.per_gpu and not args.gantt:
        raise OptionError("--per-gpu", True, "goes with --gantt")
    if args.gantt:  # a suffix that is no picture format: exit 2 before the work
        from hetrl.views.plan_picture import picture_format

        picture_format(args.gantt, None, "--gantt")
    workload, cluster = load_workload(args.workload), load_cluster(args.cluster)
    if args.iterations * workload.samples > MAX_SIMULATED_SEQUENCES:
        raise OptionError("--iterations", args.iterations,
                          f"times {workload.samples:,} sequences per iteration is more than "
                          f"{MAX_SIMULATED_SEQUENCES:,} sequences, the limit of one simulation")
    plan = load_plan_for(args, workload, cluster)
    params = load_params(args.params, cluster)
    require_plan_fits(plan, workload, cluster, params)
    faults = None
    if args.faults:
        nodes: dict[str, list[int]] = {}
        for d in cluster.devices:
            nodes.setdefault(d.node, []).append(d.id)
        faults = FaultScenario.from_dict(read_mapping(args.faults, "faults"), cluster.num_devices,
                                         cluster.regions, nodes)
    result = simulate(plan, workload, cluster, args.iterations, args.seed, params, faults,
                      progress=None if args.json else _progress(args.iterations))
    write_traces(args, result.trace, "chrome")
    if args.gantt:
        from hetrl.views.gantt import write_gantt

        write_gantt(result.trace, args.gantt, plan, cluster, args.per_gpu)
    emit(args, result.to_dict(), format_result(result, workload, cluster))
    return EXIT_STALLED if result.faults.stalled else 0


def _progress(iterations: int):
    """A progress printer for long simulations: a line on stderr every 2 s of wall-clock time
    (nothing for a simulation that ends sooner). Iterations are counted from 1."""
    import sys
    import time

    last = [time.perf_counter()]

    def say(now_s: float, done: int) -> None:
        t = time.perf_counter()
        if t - last[0] >= 2.0:
            last[0] = t
            print(f"simulate: {done}/{iterations} iterations done, simulated time {now_s:,.1f} s",
                  file=sys.stderr, flush=True)
    return say


def _where(cluster, devices: list[int]) -> str:
    """Devices with their nodes and regions, in words."""
    nodes: dict[tuple[str, str], list[int]] = {}
    for d in devices:
        dev = cluster.devices[d]
        nodes.setdefault((dev.node, dev.region), []).append(d)
    return ", ".join(f"device{'s' * (len(ds) > 1)} {', '.join(map(str, ds))} (node {n}, "
                     f"region {r})" for (n, r), ds in nodes.items())


def _phase(name: str, p: dict) -> str:
    if not p["iterations"]:
        return f"{name}: no iteration"
    return (f"{name}: {p['iterations']} iteration(s), {p['iteration_s']:.2f} s each "
            f"({p['throughput_samples_per_s']:.2f} samples/s)")


def format_result(result, workload, cluster) -> str:
    """The text of ``hetrl simulate``: a stall first (where and when), then the steady-state
    mean, the iterations, the tasks, the faults and the phases around the first fault.
    Iterations are counted from 1 here (the JSON's indexes from 0)."""
    m, f = result.metrics, result.faults
    done, asked = m["completed_iterations"], m["requested_iterations"]
    lines = []
    if f.stalled:
        it = f.aborted_iterations[-1] + 1 if f.aborted_iterations else done + 1
        lines.append(f"STALLED: {workload.name} on {cluster.name}: {_where(cluster, f.lost_devices)} "
                     f"lost at {f.stalled_at_s:.2f} s (simulated) during iteration {it}, and the "
                     f"faults file has no replan; {done}/{asked} iterations done")
    if m["iteration_s"] == m["iteration_s"]:  # (nan: too few iterations for a steady state)
        lines.append(f"{workload.name} on {cluster.name}: {m['iteration_s']:.2f} s per iteration "
                     f"(steady state; {done}/{asked} done)")
    elif not f.stalled:
        lines.append(f"{workload.name} on {cluster.name}: {done}/{asked} iterations done")
    if done:
        lines.append("  iterations: " + ", ".join(f"{x:.2f}" for x in m["iterations"]))
        present = {*workload.task_names, "weight_sync"}  # (not GRPO's critic, a rule's reward)
        lines += [f"  {t:<21}{s:>10.2f} s" for t, s in m["tasks"].items() if t in present]
    else:
        lines.append("  no iteration completed: no per-task seconds")
    if f.lost_devices or f.stalled:
        lines.append(f"  faults: lost devices {f.lost_devices}, lost work {f.lost_work_s:.1f} s, "
                     f"stalled {f.stalled}, re-plans {len(f.replans)}")
    ph = m.get("phases") or {}
    if ph:
        parts = [_phase("before", ph["before_fault"]), _phase("during", ph["during_fault"])]
        if ph["replan_s"] is not None:
            parts.append(f"re-plan and restart {ph['replan_s']:.1f} s")
        parts.append(_phase("after", ph["after_fault"]) if not f.stalled else "after: stalled")
        lines.append(f"  phases around the first fault (at {ph['fault_at_s']:.2f} s): "
                     + "; ".join(parts))
    return "\n".join(lines)
