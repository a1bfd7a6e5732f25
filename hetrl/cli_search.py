"""``hetrl plan`` and ``hetrl schedulers``: search a plan from the command line."""

from __future__ import annotations

import argparse

from hetrl.cli import (
    _json_flag,
    command,
    emit,
    nonnegative_int,
    output_path,
    positive_float,
    positive_int,
    stamped,
)
from hetrl.limits import MAX_BUDGET_EVALS, MAX_BUDGET_S


def _plan_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", "-w", required=True, help="workload preset name or YAML/JSON file")
    p.add_argument("--cluster", "-c", required=True, help="cluster preset name or YAML/JSON file")
    p.add_argument("--scheduler", "-s", default="hetrl",
                   help="scheduler name (see `hetrl schedulers`; default hetrl)")
    p.add_argument("--budget-s", type=positive_float("--budget-s", MAX_BUDGET_S), default=None,
                   help="wall-clock budget, seconds (--budget-s and/or --budget-evals is required)")
    p.add_argument("--budget-evals", type=positive_int("--budget-evals", MAX_BUDGET_EVALS), default=None,
                   help="cost-model evaluations budget (deterministic with --seed)")
    p.add_argument("--seed", type=nonnegative_int("--seed"), default=0,
                   help="random seed (default 0)")
    p.add_argument("--workers", type=positive_int("--workers"), default=1,
                   help="processes (ILP: solver workers; default 1)")
    p.add_argument("--no-load-balance", action="store_true",
                   help="disable the data- and layer-level load balancer (ablation; schedulers "
                        "with a load balancer: hetrl, hetrl-simple, ilp, deap, random)")
    p.add_argument("--no-warm-start", action="store_true",
                   help="SHA-EA without its warm start from the baselines' structures "
                        "(ablation; hetrl and hetrl-simple)")
    p.add_argument("--objective", choices=("time", "cost"), default="time",
                   help="minimise seconds per iteration (time, the default) or dollars per 1k "
                        "samples (cost: GPU-hours at on-demand prices plus egress; "
                        "docs/money.md); hetrl, hetrl-simple and ilp")
    p.add_argument("--max-dollars-per-hour", type=positive_float("--max-dollars-per-hour"),
                   default=None, help="limit: the plan's dollars per hour (GPUs and egress)")
    p.add_argument("--deadline-s", type=positive_float("--deadline-s"), default=None,
                   help="limit: the plan's seconds per iteration")
    p.add_argument("--charge-used-only", action="store_true",
                   help="charge only the GPUs a plan uses (default: every GPU of the cluster, "
                        "idle ones too): fewer GPUs then cost less")
    p.add_argument("--params", help="cost-model parameters YAML")
    p.add_argument("--launch-with", choices=("verl", "openrlhf"), default=None,
                   help="search only the plans this framework can launch (its pools, one layout "
                   "per model, its co-location and async rules, its per-node uniformity), priced "
                   "with its per-step costs: `hetrl export --to` it exits 0 with a closest-plan "
                   "ratio of 1.00. Without it, the best plan is also priced as verl would "
                   "launch it (`launchable`)")
    p.add_argument("--out", "-o", required=True, type=output_path("--out"),
                   help="write the plan here (.json or .yaml)")
    p.add_argument("--progress", action="store_true", help="show a progress bar on stderr")
    _json_flag(p)


_FLAGS = {"load_balance": ("--no-load-balance", "it has no load balancer"),
          "warm_start": ("--no-warm-start", "it has no warm start")}


def _check_flags(name: str, options: dict) -> None:
    """An ablation flag given to a scheduler without that option: one line naming both."""
    import dataclasses

    from hetrl.errors import OptionError
    from hetrl.search import SCHEDULERS, load_all

    load_all()
    cls = SCHEDULERS.get(name)
    if cls is None or cls.Options is None:
        return  # an unknown scheduler is reported by get_scheduler
    fields = {f.name for f in dataclasses.fields(cls.Options)}
    for key in options:
        if key not in fields:
            flag, why = _FLAGS[key]
            takes = sorted(n for n, c in SCHEDULERS.items() if c.Options is not None
                           and key in {f.name for f in dataclasses.fields(c.Options)})
            raise OptionError(flag, name, f"{why}; schedulers that take {flag}: {', '.join(takes)}")


def _compared(extra: dict) -> str:
    """The other objectives' searches a plan was compared with, in words ("" for none)."""
    compared = extra.get("objectives_compared") or {}
    found = extra.get("found_by")
    parts = [f"{v['evaluations']} more by the {k} objective's search"
             + (", whose plan it is" if found and found.startswith(k) else "")
             for k, v in compared.items()]
    return f" (and {' and '.join(parts)}, compared)" if parts else ""


@command("plan", "search an execution plan with a scheduler", _plan_args)
def cmd_plan(args: argparse.Namespace) -> int:
    from hetrl.cli_cost import load_params
    from hetrl.io import load_cluster, load_workload, save_plan
    from hetrl.search import Budget, get_scheduler

    workload, cluster = load_workload(args.workload), load_cluster(args.cluster)
    budget = Budget(seconds=args.budget_s, evaluations=args.budget_evals, seed=args.seed,
                    workers=args.workers, progress=args.progress)
    options = {}
    if args.no_load_balance:
        options["load_balance"] = False
    if args.no_warm_start:
        options["warm_start"] = False
    _check_flags(args.scheduler, options)
    from hetrl.cli_cost import detail_lines, money_line
    from hetrl.cost.details import tasks_detail
    from hetrl.cost.model import CostModel
    from hetrl.cost.money import money
    from hetrl.search.objective import Objective

    objective = Objective(args.objective, args.max_dollars_per_hour, args.deadline_s,
                          args.charge_used_only)
    params = load_params(args.params, cluster)
    scheduler = get_scheduler(args.scheduler, params, objective, **options)
    launch = None
    searched = workload
    if args.launch_with:
        from hetrl.export.launchable import check_workload, projection, with_own_placement

        check_workload(args.launch_with, workload)
        # priced with the per-step costs of the framework that will run the plan
        searched = workload.with_(framework=args.launch_with)
        launch = projection(args.launch_with, searched, cluster)
    result = scheduler.search(searched, cluster, budget, compare_objectives=True, launch=launch)
    if launch is not None and objective.is_plain_time:
        result = with_own_placement(result, args.launch_with, searched, cluster, params,
                                    budget, launch)
    save_plan(stamped(result.plan, args, workload, cluster), args.out, "--out")
    est = result.estimate
    m = money(CostModel(searched, cluster, params), result.plan, est.iteration_s,
              args.charge_used_only)
    launchable = None
    if not args.launch_with:
        from hetrl.export.launchable import best_verl_launch

        launchable = best_verl_launch(result.plan, workload, cluster, params, est, args.seed)
    text = (f"{result.scheduler}: {est.iteration_s:.2f} s per iteration "
            f"({est.throughput_samples_per_s:.2f} samples/s) after {result.evaluations} "
            f"evaluations{_compared(result.extra)} in {result.elapsed_s:.1f} s; plan written to "
            f"{args.out}\n"
            + money_line(m) + "\n"
            + "\n".join(f"  group {len(g.devices):>3} GPUs: {', '.join(g.tasks)}"
                        for g in result.plan.groups))
    # where each task runs, and its rates (as `hetrl estimate` prints them)
    detail = tasks_detail(est, result.plan, workload, cluster)
    text += "\n  where each task runs, and its rates:\n" + "\n".join(
        f"    {line}" for line in detail_lines(detail))
    if args.launch_with:
        text += (f"\n  launchable with {args.launch_with} as it is (priced with its per-step "
                 f"costs): `hetrl export --to {args.launch_with}` runs this plan")
        own = result.extra.get("own_plans_compared") or {}
        if own:
            found = result.extra.get("found_by", "")
            text += (f"\n  {args.launch_with}'s own placement, compared: "
                     + ", ".join(f"{k} {v['iteration_s']:.2f} s" for k, v in own.items())
                     + ("; the plan is its" if "own placement" in found else ""))
    else:
        text += "\n" + launchable_line(launchable)
    if result.convergence is not None:  # (the last line: whether the search converged)
        text += "\n" + result.convergence.line()
    emit(args, {**result.to_dict(), **m.to_dict(), **objective.to_dict(), "out": args.out,
                "tasks_detail": detail, "launch_with": args.launch_with,
                **({"launchable": launchable} if launchable is not None else {})}, text)
    return 0


def launchable_line(rec: dict) -> str:
    """The line ``hetrl plan`` prints for ``hetrl.export.launchable.best_verl_launch``."""
    if rec.get("workload_launchable") is False:  # (no plan of it: no search to suggest)
        return f"  verl runs no plan of this workload ({rec['why_not']})"
    if rec["why_not"] is not None:
        this = f"verl cannot launch this plan ({rec['why_not']})"
    elif not rec["feasible"]:
        this = "verl would launch it as a plan that does not fit in memory"
    else:
        this = (f"verl would launch it at {rec['iteration_s']:.2f} s per iteration "
                f"({rec['gap']:.2f}x, its per-step costs)")
    best = rec.get("best_launchable_s")
    if best is not None and rec.get("best_launchable_from") != "this plan":
        this += (f"; the best verl-launchable plan known here, {rec['best_launchable_from']}: "
                 f"{best:.2f} s ({rec['best_launchable_gap']:.2f}x)")
    return f"  {this}; `--launch-with verl` searches the plans verl can launch"


@command("schedulers", "list the schedulers", _json_flag)
def cmd_schedulers(args: argparse.Namespace) -> int:
    from hetrl.search import SCHEDULERS, load_all

    load_all()
    data = {name: cls.description for name, cls in sorted(SCHEDULERS.items())}
    emit(args, data, "\n".join(f"{n:<13} {d}" for n, d in data.items()))
    return 0
