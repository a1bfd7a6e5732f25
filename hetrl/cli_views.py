"""``hetrl show`` (a plan as a picture) and ``hetrl export`` (a plan as another system's
config): thin over :mod:`hetrl.views` and :mod:`hetrl.export`."""

from __future__ import annotations

import argparse
import math

from hetrl.cli import (
    allow_mismatch_option,
    command,
    emit,
    load_plan_for,
    output_path,
    positive_float_or_inf,
    stamped,
)
from hetrl.errors import OptionError


def _wcp(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", "-w", required=True, help="workload preset name or YAML/JSON file")
    p.add_argument("--cluster", "-c", required=True, help="cluster preset name or YAML/JSON file")
    p.add_argument("--plan", "-p", required=True, help="plan JSON/YAML file")
    allow_mismatch_option(p)


def _show_args(p: argparse.ArgumentParser) -> None:
    _wcp(p)
    p.add_argument("--out", "-o", required=True, type=output_path("--out"),
                   help="picture to write (.png or .svg)")
    p.add_argument("--format", choices=("png", "svg"), default=None,
                   help="picture format (default: from the --out suffix, else png)")
    p.add_argument("--params", help="cost-model parameters YAML (the flows' link efficiencies)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")


@command("show", "draw a plan: regions, nodes and GPUs coloured by the tasks on them, each "
         "task's GPUs by type and region, (dp, pp, tp) and data shares, the cross-region flows of one iteration with their bytes",
         _show_args)
def cmd_show(args: argparse.Namespace) -> int:
    from hetrl.cli_cost import load_params
    from hetrl.cost.flows import human_bytes, iteration_flows, region_flows
    from hetrl.io import load_cluster, load_workload
    from hetrl.views.plan_picture import draw_plan, picture_format, save_figure

    fmt = picture_format(args.out, args.format)
    workload, cluster = load_workload(args.workload), load_cluster(args.cluster)
    plan = load_plan_for(args, workload, cluster)  # a bad plan: exit 2 here, before drawing
    params = load_params(args.params, cluster)
    save_figure(draw_plan(plan, workload, cluster, params), args.out, fmt)
    between = region_flows(iteration_flows(plan, workload, cluster, params), cluster)
    data = {"out": str(args.out), "format": fmt,
            "cross_region_bytes": [{"from": a, "to": b, **kinds}
                                   for (a, b), kinds in sorted(between.items())]}
    total = sum(sum(k.values()) for k in between.values())
    where = _where_each_task_runs(plan, workload, cluster)
    data["tasks_where"] = where
    emit(args, data, "\n".join(
        [f"wrote {args.out} ({fmt}): {len(plan.groups)} task group(s) on "
         f"{len(plan.device_ids)} GPUs, {human_bytes(total)} across regions per iteration"]
        + _where_lines(plan, where)))
    return 0


def _where_each_task_runs(plan, workload, cluster) -> dict:
    """Per task of the workload (in its order): its GPUs by type and region and its layout."""
    from hetrl.cost.details import where_task_runs

    placed = {p.task: p for p in plan.placements}
    return {t: where_task_runs(placed[t], cluster) for t in workload.task_names if t in placed}


def _where_lines(plan, where: dict) -> list[str]:
    """Per task group its tasks, each with its GPUs by type and region and its dp/pp/tp."""
    from hetrl.cost.details import where_text

    out = []
    for gi, g in enumerate(plan.groups):
        out.append(f"  group {gi}, {len(g.devices)} GPUs:")
        out += [f"    {t:<21} {where[t]['gpus']} GPUs: {where_text(where[t])}; dp "
                f"{where[t]['dp']} pp {where[t]['pp']} tp {where[t]['tp']}"
                for t in g.tasks if t in where]
    return out


def _export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--to", required=True, choices=("verl", "openrlhf"),
                   help="the system to export to (verl: trainer config overrides; openrlhf: a "
                   "train_ppo_ray launch script)")
    _wcp(p)
    p.add_argument("--out", "-o", required=True, type=output_path("--out"),
                   help="overrides YAML to write")
    p.add_argument("--closest-plan", type=output_path("--closest-plan"),
                   help="also write the closest verl plan as a hetrl plan (JSON/YAML)")
    p.add_argument("--params", help="cost-model parameters YAML (for the two estimates)")
    p.add_argument("--launcher", type=output_path("--launcher"), metavar="PATH",
                   help="verl only: also write a Python entry point (PATH, and its data beside "
                   "it, PATH with .json) that starts verl's trainer with the overrides and each "
                   "resource pool pinned to the plan's nodes (Ray node resources; the export "
                   "prints each node's `ray start` line)")
    p.add_argument("--model-path", action="append", type=_role_path, default=[],
                   metavar="ROLE=PATH", help="where the framework loads ROLE's model (actor, "
                   "critic, reward; openrlhf: also a rule reward's reward_func file): a Hugging "
                   "Face id or a directory; repeatable (default: the built-in model's Hugging "
                   "Face id)")
    p.add_argument("--max-slowdown", type=positive_float_or_inf("--max-slowdown"), default=1.5,
                   help="refuse (exit 2) when the closest plan the framework runs is more than "
                   "this many times the plan's iteration time, or does not fit where the plan "
                   "does (default 1.5; inf: export it whatever it is)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")


def _role_path(value: str) -> tuple[str, str]:
    """``--model-path ROLE=PATH`` as (role, path)."""
    role, sep, path = value.partition("=")
    if not sep or not role or not path:
        raise OptionError("--model-path", value, "must be ROLE=PATH (e.g. actor=/models/my-7b)")
    return role, path


def close_enough(ours, theirs, ratio: float, most: float, diffs: list[str]) -> None:
    """Refuse (SpecError, exit 2) a closest plan that does not fit where the plan does, or is
    more than ``most`` times slower."""
    from hetrl.errors import SpecError

    if math.isinf(most):  # --max-slowdown inf: export whatever the closest plan is
        return
    why = "; ".join(diffs[:3]) + ("; ..." if len(diffs) > 3 else "")
    if ours.feasible and not theirs.feasible:
        raise SpecError("--max-slowdown", most, "the closest plan the framework runs does not "
                        f"fit in memory, where the plan does ({why})")
    if ratio > most:
        raise SpecError("--max-slowdown", most, f"the closest plan the framework runs is "
                        f"{ratio:.2f}x the plan's iteration time ({why})")


def seconds_text(est) -> str:
    """An estimate's iteration time as the export's text prints it."""
    if est.feasible:
        return f"{est.iteration_s:.2f} s per iteration"
    return f"{est.iteration_s:.2f} s per iteration ignoring memory (it does not fit)"


@command("export", "export a plan to another system's config (verl: trainer overrides, the "
         "closest verl plan, both estimated); exit 2 where verl cannot come close (a pool it "
         "cannot form, a model without a path, a closest plan over --max-slowdown)",
         _export_args)
def cmd_export(args: argparse.Namespace) -> int:
    from hetrl import __version__
    from hetrl.cli_cost import load_params
    from hetrl.cost.model import CostModel
    from hetrl.export import safe, verl, verl_launcher
    from hetrl.io import load_cluster, load_workload, save_plan, write_text_atomic

    if args.to == "openrlhf":
        if args.launcher:
            raise OptionError("--launcher", args.launcher, "is for --to verl only (the OpenRLHF "
                              "export is a launch script already)")
        from hetrl.cli_openrlhf import export_openrlhf

        return export_openrlhf(args)
    workload, cluster = load_workload(args.workload), load_cluster(args.cluster)
    plan = load_plan_for(args, workload, cluster)
    safe.check_inputs(workload, cluster, args.plan)
    paths = verl.model_paths(workload, dict(args.model_path))
    params = load_params(args.params, cluster)
    verl.check_workload(workload)
    layout = verl.verl_layout(plan, workload, cluster)
    closest = verl.closest_plan(layout, workload, cluster)
    # both priced with the per-step costs of the framework that will run them
    model = CostModel(workload.with_(framework="verl"), cluster, params)
    ours, theirs = model.estimate(plan), model.estimate(closest)
    ratio = theirs.iteration_s / ours.iteration_s if ours.iteration_s > 0 else float("nan")
    flat = verl.overrides(layout, workload, paths)
    pools = verl.resource_pools(layout, workload)
    diffs = verl.differences(plan, layout, closest, workload, cluster)
    close_enough(ours, theirs, ratio, args.max_slowdown, diffs)
    header = [f"verl {verl.VERL_VERSION} trainer overrides written by hetrl {__version__} "
              f"export --to verl",
              f"workload {workload.name}, cluster {cluster.name}, plan {args.plan}",
              f"config: verl/trainer/config/{verl.CONFIG_NAMES[layout.strategy]}.yaml; add your "
              "data files (data.train_files, data.val_files) and reward function",
              "", "Estimates (hetrl's cost model, `hetrl estimate`, with verl's per-step costs: "
              "framework verl):",
              f"  the hetrl plan:        {seconds_text(ours)}",
              f"  the closest verl plan: {seconds_text(theirs)}; {ratio:.2f}x the hetrl plan's",
              "", "What verl cannot express, and how the exported plan differs:"]
    header += [f"  - {d}" for d in diffs] or ["  (nothing: the plan is a verl plan)"]
    header += ["", "The command line:"] + verl.command_line(flat, layout.strategy).splitlines()
    launcher = None
    if args.launcher:
        verl_launcher.check_paths(args.launcher, args.out, args.closest_plan)
        launcher = verl_launcher.launcher_data(layout, cluster, flat, pools)
    write_text_atomic(args.out, verl.render(flat, pools, header), "--out")
    if launcher is not None:
        code, data_text = verl_launcher.launcher_files(launcher)
        write_text_atomic(verl_launcher.data_path(args.launcher), data_text, "--launcher")
        write_text_atomic(args.launcher, code, "--launcher", executable=True)
    if args.closest_plan:
        save_plan(stamped(closest, args, workload, cluster), args.closest_plan,
                  "--closest-plan")
    data = {"to": "verl", "verl_version": verl.VERL_VERSION, "out": str(args.out),
            "config_name": verl.CONFIG_NAMES[layout.strategy], "overrides": flat,
            verl.CUSTOM_SECTION: pools, "differences": diffs,
            "iteration_s": {"plan": ours.iteration_s, "closest_verl_plan": theirs.iteration_s},
            "feasible": {"plan": ours.feasible, "closest_verl_plan": theirs.feasible},
            "ratio": ratio, "closest_plan": args.closest_plan,
            "launcher": None if launcher is None else {
                "path": str(args.launcher), "data": str(verl_launcher.data_path(args.launcher)),
                "nodes": launcher["nodes"]}}
    text = [f"wrote {args.out}: {len(flat)} verl {verl.VERL_VERSION} overrides "
            f"({verl.CONFIG_NAMES[layout.strategy]}), pools "
            + ", ".join(f"{p.name} {len(p.nodes)}x{p.gpus_per_node}" for p in layout.pools),
            f"  hetrl plan:        {seconds_text(ours)}",
            f"  closest verl plan: {seconds_text(theirs)}; {ratio:.2f}x the hetrl plan's"]
    text += [f"  differs: {d}" for d in diffs]
    if launcher is not None:
        text += [f"wrote {args.launcher} (and {verl_launcher.data_path(args.launcher)}): run it "
                 "on the head node once Ray runs on each node with its pool pins:"]
        text += [f"  {line}" for line in verl_launcher.ray_start_lines(launcher)]
    emit(args, data, "\n".join(text))
    return 0
