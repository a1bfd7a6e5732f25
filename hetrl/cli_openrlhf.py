"""``hetrl export --to openrlhf``: a plan as an OpenRLHF launch script (thin over
:mod:`hetrl.export.openrlhf`)."""

from __future__ import annotations

import argparse
import os

from hetrl.cli import emit, load_plan_for, stamped


def export_openrlhf(args: argparse.Namespace) -> int:
    """Write the launch script, optionally the closest plan; print both estimates."""
    from hetrl import __version__
    from hetrl.cli_cost import load_params
    from hetrl.cli_views import close_enough, seconds_text
    from hetrl.cost.model import CostModel
    from hetrl.errors import SpecError
    from hetrl.export import openrlhf as orl
    from hetrl.io import load_cluster, load_workload, save_plan, write_text_atomic

    given: dict[str, str] = {}
    for role, path in args.model_path or ():
        if role in given:
            raise SpecError("--model-path", role, "given twice")
        given[role] = path
    workload, cluster = load_workload(args.workload), load_cluster(args.cluster)
    plan = load_plan_for(args, workload, cluster)
    orl.check_experts_and_fp8(plan, workload)
    params = load_params(args.params, cluster)
    paths = orl.model_paths(workload, given)
    layout = orl.openrlhf_layout(plan, workload, cluster)
    orl.check_workload(workload, layout, cluster)
    closest = orl.closest_plan(layout, workload, cluster)
    # both priced with the per-step costs of the framework that will run them
    model = CostModel(workload.with_(framework="openrlhf"), cluster, params)
    ours, theirs = model.estimate(plan), model.estimate(closest)
    ratio = theirs.iteration_s / ours.iteration_s if ours.iteration_s > 0 else float("nan")
    flags = orl.flags(layout, workload, cluster, paths)
    diffs = orl.differences(plan, layout, closest, workload, cluster)
    close_enough(ours, theirs, ratio, args.max_slowdown, diffs)
    header = [f"OpenRLHF {orl.OPENRLHF_VERSION} launch script written by hetrl {__version__} "
              "export --to openrlhf",
              f"workload {workload.name}, cluster {cluster.name}, plan {args.plan}",
              "Add your data and logging flags as arguments (later flags win), e.g.",
              f"  ./{os.path.basename(args.out)} --data.prompt_dataset DATA "
              "--data.input_key input --ckpt.save_hf",
              "Run it where `ray` reaches the cluster (or through `ray job submit -- ...`).",
              "", "Estimates (hetrl's cost model, `hetrl estimate`, with OpenRLHF's per-step "
              "costs: framework openrlhf):",
              f"  the hetrl plan:            {seconds_text(ours)}",
              f"  the closest OpenRLHF plan: {seconds_text(theirs)}; {ratio:.2f}x the hetrl plan's",
              "", "Placement groups (models sharing GPUs) and the devices hetrl assumed (Ray packs "
              "each group onto GPUs it chooses):"]
    header += [f"  {'+'.join(g.models)}: {len(g.devices)} GPUs, devices {orl.ranges(g.devices)}"
               for g in layout.groups]
    header += ["", "What OpenRLHF cannot express, and how the exported plan differs:"]
    header += [f"  - {d}" for d in diffs] or ["  (nothing: the plan is an OpenRLHF plan)"]
    write_text_atomic(args.out, orl.render(flags, header), "--out", executable=True)
    if args.closest_plan:
        save_plan(stamped(closest, args, workload, cluster), args.closest_plan,
                  "--closest-plan")
    data = {"to": "openrlhf", "openrlhf_version": orl.OPENRLHF_VERSION, "out": str(args.out),
            "argv": orl.argv(flags),
            "placement_groups": [{"models": list(g.models), "devices": list(g.devices)}
                                 for g in layout.groups],
            "differences": diffs,
            "iteration_s": {"plan": ours.iteration_s, "closest_openrlhf_plan": theirs.iteration_s},
            "feasible": {"plan": ours.feasible, "closest_openrlhf_plan": theirs.feasible},
            "ratio": ratio, "closest_plan": args.closest_plan}
    text = [f"wrote {args.out}: OpenRLHF {orl.OPENRLHF_VERSION} train_ppo_ray, {len(flags)} "
            "flags, placement groups "
            + ", ".join(f"{'+'.join(g.models)} {len(g.devices)}" for g in layout.groups),
            f"  hetrl plan:            {seconds_text(ours)}",
            f"  closest OpenRLHF plan: {seconds_text(theirs)}; {ratio:.2f}x the hetrl plan's"]
    text += [f"  differs: {d}" for d in diffs]
    emit(args, data, "\n".join(text))
    return 0
