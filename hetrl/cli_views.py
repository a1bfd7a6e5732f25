"""``hetrl show`` (a plan as a picture) and ``hetrl export`` (a plan as another system's
config): thin over :mod:`hetrl.views` and :mod:`hetrl.export`."""

from __future__ import annotations

import argparse

from hetrl.cli import command, emit, output_path


def _wcp(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", "-w", required=True, help="workload preset name or YAML/JSON file")
    p.add_argument("--cluster", "-c", required=True, help="cluster preset name or YAML/JSON file")
    p.add_argument("--plan", "-p", required=True, help="plan JSON/YAML file")


def _show_args(p: argparse.ArgumentParser) -> None:
    _wcp(p)
    p.add_argument("--out", "-o", required=True, type=output_path("--out"),
                   help="picture to write (.png or .svg)")
    p.add_argument("--format", choices=("png", "svg"), default=None,
                   help="picture format (default: from the --out suffix, else png)")
    p.add_argument("--params", help="cost-model parameters YAML (the flows' link efficiencies)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")


@command("show", "draw a plan: regions, nodes and GPUs coloured by task group, each task's "
         "(dp, pp, tp) and data shares, the cross-region flows of one iteration with their bytes",
         _show_args)
def cmd_show(args: argparse.Namespace) -> int:
    from hetrl.cli_cost import load_params
    from hetrl.io import load_cluster, load_plan, load_workload
    from hetrl.views.flows import human_bytes, iteration_flows, region_flows
    from hetrl.views.plan_picture import draw_plan, picture_format, save_figure

    fmt = picture_format(args.out, args.format)
    workload, cluster = load_workload(args.workload), load_cluster(args.cluster)
    plan = load_plan(args.plan, workload, cluster)  # a bad plan: exit 2 here, before drawing
    params = load_params(args.params, cluster)
    save_figure(draw_plan(plan, workload, cluster, params), args.out, fmt)
    between = region_flows(iteration_flows(plan, workload, cluster, params), cluster)
    data = {"out": str(args.out), "format": fmt,
            "cross_region_bytes": [{"from": a, "to": b, **kinds}
                                   for (a, b), kinds in sorted(between.items())]}
    total = sum(sum(k.values()) for k in between.values())
    emit(args, data, f"wrote {args.out} ({fmt}): {len(plan.groups)} task group(s) on "
                     f"{len(plan.device_ids)} GPUs, {human_bytes(total)} across regions per "
                     "iteration")
    return 0
