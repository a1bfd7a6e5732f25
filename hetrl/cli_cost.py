"""``hetrl estimate`` and ``hetrl bound``: the cost model from the command line."""

from __future__ import annotations

import argparse

from hetrl.cli import (
    _json_flag,
    allow_mismatch_option,
    command,
    emit,
    load_plan_for,
    output_path,
    positive_int,
    stamped,
)
from hetrl.errors import HetrlError
from hetrl.spec.tasks import WEIGHT_SYNC


def _estimate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", "-w", required=True, help="workload preset name or YAML/JSON file")
    p.add_argument("--cluster", "-c", required=True, help="cluster preset name or YAML/JSON file")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--plan", "-p", help="plan JSON/YAML file")
    allow_mismatch_option(p)
    src.add_argument("--colocate", action="store_true",
                     help="build a plan: every task on every device with one layout (--tp/--pp/--dp)")
    p.add_argument("--tp", type=positive_int("--tp"), default=1,
                   help="tensor-parallel size for --colocate (default 1)")
    p.add_argument("--pp", type=positive_int("--pp"), default=1,
                   help="pipeline-parallel size for --colocate (default 1)")
    p.add_argument("--dp", type=positive_int("--dp"), default=None,
                   help="data-parallel size for --colocate (default: devices / (tp*pp))")
    p.add_argument("--ep", type=positive_int("--ep"), default=1,
                   help="expert-parallel size for --colocate, for the tasks whose model has "
                        "experts (default 1; it divides dp and the experts)")
    p.add_argument("--params", help="cost-model parameters YAML (e.g. from `hetrl calibrate`)")
    p.add_argument("--save-plan", type=output_path("--save-plan"),
                   help="with --colocate: also write the built plan to this file")
    p.add_argument("--charge-used-only", action="store_true",
                   help="charge only the GPUs the plan uses (default: every GPU of the cluster, "
                        "idle ones too; docs/money.md)")
    _json_flag(p)


def load_params(path: str | None, cluster=None):
    """Cost-model parameters from a YAML file (the defaults without one). With ``cluster``, a
    ``per_gpu`` entry must name one of its GPU types or a built-in one: a typo would otherwise
    be ignored without a word."""
    from hetrl.cost.params import DEFAULT_PARAMS, CostParams
    from hetrl.errors import SpecError, did_you_mean
    from hetrl.io import read_mapping
    from hetrl.spec.hardware import gpu_catalog

    if path is None:
        return DEFAULT_PARAMS
    params = CostParams.from_dict(read_mapping(path, "params"))
    if cluster is not None:
        ours = sorted({d.gpu.name for d in cluster.devices})
        known = set(gpu_catalog()) | set(ours)
        for gpu, _, value in params.per_gpu:
            if gpu not in known:
                raise SpecError(f"{path}: params.per_gpu.{gpu}", value,
                                f"unknown GPU type; the cluster has {ours}, "
                                f"built in: {sorted(gpu_catalog())}"
                                f"{did_you_mean(gpu, sorted(known))}")
    return params


#: Exit code of ``hetrl estimate`` for a plan that does not fit: answered, and the answer is
#: "infeasible" (2 is bad input; docs/cost-model.md, "Infeasible plans").
EXIT_INFEASIBLE = 3


def estimate_record(est, money=None, band=None) -> dict:
    """``est.to_dict()`` as ``hetrl estimate --json`` prints it: for a plan that does not fit,
    ``iteration_s`` and the throughputs are null, and the times computed with memory ignored
    move to ``iteration_s_ignoring_memory`` and ``throughput_*_ignoring_memory``. With
    ``money`` (:class:`hetrl.cost.money.Money`) its dollars and bytes too, for every plan (an
    infeasible one's at the time computed with memory ignored). ``iteration_s_band``: [low,
    high] seconds of ``band`` (:class:`hetrl.cost.band.Band`) and ``band_source`` the rows it
    comes from; both null without a band or for a plan that does not fit."""
    data = est.to_dict()
    if money is not None:
        data.update(money.to_dict())
    if not est.feasible:
        for key in ("iteration_s", "throughput_samples_per_s", "throughput_tokens_per_s"):
            data[f"{key}_ignoring_memory"] = data[key]
            data[key] = None
    ok = band is not None and est.feasible
    data["iteration_s_band"] = [band.low_s, band.high_s] if ok else None
    data["band_source"] = band.source() if ok else None
    return data


def _seconds(x: float) -> str:
    """A band end: three significant digits below 100 s, whole seconds above."""
    return f"{x:.3g}" if x < 100 else f"{x:,.0f}"


def band_text(band) -> str:
    """``280-431 s, 80% band from 9 published co-located steps``."""
    return f"{_seconds(band.low_s)}-{_seconds(band.high_s)} s, {band.description}"


def money_line(m) -> str:
    """One line of dollars for the text output of ``estimate`` and ``plan``."""
    kinds = list(dict.fromkeys(n["instance"] or f"{n['gpus']} x {n['gpu']}"
                               for n in m.instances))
    nodes = f"{len(m.instances)} instance{'s' if len(m.instances) != 1 else ''}"
    if kinds:
        nodes += f" ({', '.join(kinds[:3])}{', ...' if len(kinds) > 3 else ''})"
    who = f"{m.gpus_charged} GPUs charged in {nodes}" + (
        " (nodes the plan uses, whole)" if m.charge_used_only else " (idle ones too)")
    bytes_ = f"{m.cross_region_bytes / 1e9:,.1f} GB cross-region"
    if m.internet_bytes:
        bytes_ += f", {m.internet_bytes / 1e9:,.1f} GB to edge nodes"
    if m.dollars_per_iteration is None:
        return (f"  dollars: no price for {', '.join(m.unpriced_where or m.unpriced)} (the "
                "price table has none there, and no other region's is borrowed; give "
                f"prices.gpu_hour in the cluster file); {who}; {bytes_}")
    return (f"  dollars: ${m.dollars_per_iteration:,.2f} per iteration (${m.dollars_per_1k_samples:,.2f}"
            f" per 1k samples, ${m.dollars_per_hour:,.0f}/h): {m.gpu_hours_per_iteration:.2f} "
            f"GPU-hours, egress ${m.egress_dollars:,.2f}; {who}; {bytes_}")


def detail_lines(detail: dict) -> list[str]:
    """One line per task of ``tasks_detail``: its GPUs by type and region, its layout, its
    tokens/s per GPU and its MFU (training, inference) or HBM-bandwidth use (generation)."""
    from hetrl.cost.details import where_text

    out = []
    for task, row in detail.items():
        rate = row["tokens_per_s_per_gpu"]
        figures = [f"{rate:,.0f} tokens/s per GPU" if rate is not None else "- tokens/s"]
        if row["mfu"] is not None:
            figures.append(f"MFU {row['mfu']:.1%}")
        if row["hbm_utilisation"] is not None:
            figures.append(f"HBM bandwidth {row['hbm_utilisation']:.1%}")
        ep = f" ep {row['ep']}" if "ep" in row else ""
        out.append(f"{task:<21} {row['gpus']} GPUs: {where_text(row)}; dp {row['dp']} pp "
                   f"{row['pp']} tp {row['tp']}{ep}; {', '.join(figures)}")
    return out


def _format(est, workload, cluster, money=None, band=None, rows=None) -> str:
    if est.feasible:
        within = f"({band_text(band)}) " if band is not None else ""
        lines = [f"{workload.name} on {cluster.name}: {est.iteration_s:.2f} s per iteration "
                 f"{within}({est.throughput_samples_per_s:.2f} samples/s, "
                 f"{est.throughput_tokens_per_s:,.0f} tokens/s)"]
        if band is not None and band.unvalidated:
            lines.append(f"  band: no published steps on {', '.join(band.unvalidated)}; the "
                         "band is from other GPUs' steps")
    else:
        first = est.violations[0] if est.violations else "does not fit"
        lines = [f"INFEASIBLE: {workload.name} on {cluster.name}: {first}",
                 f"  ignoring memory it would take {est.iteration_s:.2f} s per iteration"]
    if workload.framework != "verl":  # (the default: said in --help and docs/specs.md)
        lines.append(f"  per-step costs of framework {workload.framework} "
                     f"(hetrl.cost.profiles)")
    lines.append(f"  {'task':<21}{'seconds':>10}   breakdown")
    present = set(workload.task_names) | {WEIGHT_SYNC}
    for task, seconds in est.tasks.items():
        if task not in present:  # a task this workload does not have (GRPO's critic, ...)
            continue
        parts = est.parts.get(task, {})
        detail = ", ".join(f"{k} {v:.2f}" for k, v in parts.items() if v > 0.005)
        lines.append(f"  {task:<21}{seconds:>10.2f}   {detail}")
    mem = est.peak_memory_gb
    if mem:
        hi = max(mem, key=mem.get)
        lines.append(f"  peak memory: max {mem[hi]:.1f} GB on device {hi}, min {min(mem.values()):.1f} GB")
    if rows:
        lines.append("  where each task runs, and its rates:")
        lines += [f"    {line}" for line in detail_lines(rows)]
    if workload.mode == "async":
        lines.append(f"  dependency chain of one iteration: {est.chain_s:.2f} s (one batch from "
                     "generation to the end of training; async runs iterations overlapped, so "
                     f"one ends every {est.iteration_s:.2f} s)")
    if money is not None:
        lines.append(money_line(money))
        lines += [f"  price note: {note}" for note in money.price_notes]
    for v in est.violations:
        lines.append(f"  violation: {v}")
    return "\n".join(lines)


@command("estimate", "estimate one iteration of a plan with the analytical cost model (exit 3: "
         "the plan does not fit)", _estimate_args)
def cmd_estimate(args: argparse.Namespace) -> int:
    from hetrl.cost.model import CostModel
    from hetrl.io import load_cluster, load_workload, save_plan
    from hetrl.plan import colocated_plan

    workload, cluster = load_workload(args.workload), load_cluster(args.cluster)
    params = load_params(args.params, cluster)
    if args.colocate:
        if args.allow_mismatch:
            raise HetrlError("--allow-mismatch goes with --plan")
        plan = stamped(colocated_plan(workload, cluster, tp=args.tp, pp=args.pp, dp=args.dp,
                                      ep=args.ep), args, workload, cluster)
        if args.save_plan:
            save_plan(plan, args.save_plan, "--save-plan")
    else:
        if args.save_plan:
            raise HetrlError("--save-plan goes with --colocate")
        if args.tp != 1 or args.pp != 1 or args.dp is not None or args.ep != 1:
            raise HetrlError("--tp, --pp, --dp and --ep go with --colocate (a --plan has its "
                             "layouts)")
        plan = load_plan_for(args, workload, cluster)
    from hetrl.cost.band import estimate_band, is_colocated
    from hetrl.cost.details import tasks_detail
    from hetrl.cost.log_stages import verl_stages
    from hetrl.cost.money import money

    model = CostModel(workload, cluster, params)
    est = model.estimate(plan)
    m = money(model, plan, est.iteration_s, args.charge_used_only)
    band = estimate_band(est.iteration_s, plan, workload, cluster) if est.feasible else None
    record = estimate_record(est, m, band)
    record["framework"] = workload.framework
    record["verl_stages"] = verl_stages(est.tasks, workload.task_names, est.iteration_s,
                                        is_colocated(plan, workload))
    detail = tasks_detail(est, plan, workload, cluster)
    record["tasks_detail"] = detail
    emit(args, record, _format(est, workload, cluster, m, band, detail))
    return 0 if est.feasible else EXIT_INFEASIBLE


def _bound_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", "-w", required=True, help="workload preset name or YAML/JSON file")
    p.add_argument("--cluster", "-c", required=True, help="cluster preset name or YAML/JSON file")
    p.add_argument("--params", help="cost-model parameters YAML for the model bound")
    _json_flag(p)


@command("bound", "lower bounds of one iteration: physical (all GPUs at peak) and the cost "
         "model's (its efficiencies, the serial generation tail); exit 2 if no plan can fit",
         _bound_args)
def cmd_bound(args: argparse.Namespace) -> int:
    from hetrl.cost.bound import lower_bound
    from hetrl.io import load_cluster, load_workload
    from hetrl.search.feasibility import check_fits

    workload, cluster = load_workload(args.workload), load_cluster(args.cluster)
    params = load_params(args.params, cluster)
    check_fits(workload, cluster, params)  # no plan fits: no bound to give (exit 2, as `plan`)
    b = lower_bound(workload, cluster, params)
    emit(args, b, "\n".join([
        f"{workload.name} on {cluster.name}: no plan can beat "
        f"{b['iteration_s_lower_bound']:.2f} s per iteration (compute "
        f"{b['compute_bound_s']:.2f} s, memory {b['memory_bound_s']:.2f} s at peak)",
        f"  nor the cost model's {b['iteration_s_model_bound']:.2f} s (generation "
        f"{b['model_generation_s']:.2f} s, of which a serial decode tail of "
        f"{b['generation_tail_s']:.2f} s: {b['decode_steps']:.0f} steps of "
        f"{b['decode_step_s'] * 1e3:.2f} ms at tp {b['generation_tail_tp']:.0f}; inference "
        f"{b['model_inference_s']:.2f} s, training {b['model_training_s']:.2f} s)"]))
    return 0
