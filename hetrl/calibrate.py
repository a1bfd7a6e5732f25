"""Fit the cost model's calibration parameters to measured traces (``hetrl calibrate``).

Objective: the sum over runs, and over every task that both the trace and the estimate report
(measured and estimated seconds > 0), of (ln estimate - ln measured)^2, where the estimate is
``CostModel(workload, cluster, params).estimate(plan).tasks[task]`` and the measurement is
``Trace.task_seconds()`` (mean over iterations after the first). A tiny prior,
``prior_weight`` x sum (ln value - ln base value)^2, keeps parameters the traces barely constrain
at their base values and makes ties deterministic.

Parameters: for every GPU type a task ran on, the efficiency of each kernel kind that task kind
uses (generation: infer_flops, decode_flops, decode_hbm, hbm, link; inference: infer_flops, hbm,
link; training: train_flops, hbm, link; weight sync: hbm, link), kept only if changing it moves
some estimate (a decode that is HBM-bound everywhere leaves decode_flops unfitted), plus
``decode_step_overhead_s`` when a generation task is measured. Bounds: efficiencies in
[1e-6, 1] (a CPU emulating an A100 runs at ~1e-4 of its peak, less with per-call overheads),
the overhead in [0, 1] s.

Optimiser: coordinate descent in log space, deterministic: for each parameter in turn a coarse
grid over its whole log range, then golden-section search between the grid neighbours of the best
point; sweeps repeat until the objective stops improving. No scipy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hetrl.cost.model import CostModel
from hetrl.cost.params import DEFAULT_PARAMS, KERNEL_KINDS, CostParams
from hetrl.errors import HetrlError, SpecError, require
from hetrl.plan import Plan, validate
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.tasks import REPORTED_TASKS, WEIGHT_SYNC
from hetrl.spec.workload import WorkloadSpec
from hetrl.trace import Trace

__all__ = ["CalibrationResult", "CalibrationRun", "EFFICIENCY_BOUNDS", "KIND_KERNELS", "META_KEYS",
           "OVERHEAD", "OVERHEAD_BOUNDS", "OVERHEAD_LOG_FLOOR", "Parameter", "RunFit", "TaskFit",
           "apply_values", "candidate_parameters", "fit_params", "format_result", "load_runs",
           "load_trace", "result_json"]

#: Kernel kinds whose efficiency each task kind's cost uses (hetrl/cost/tasks.py, model.py, sync.py).
KIND_KERNELS: dict[str, tuple[str, ...]] = {
    "generation": ("infer_flops", "decode_flops", "decode_hbm", "hbm", "link"),
    "inference": ("infer_flops", "hbm", "link"),
    "training": ("train_flops", "hbm", "link"),
    WEIGHT_SYNC: ("hbm", "link"),
}
OVERHEAD = "decode_step_overhead_s"
EFFICIENCY_BOUNDS = (1e-6, 1.0)
OVERHEAD_BOUNDS = (0.0, 1.0)  # seconds per decode step
#: The smallest non-zero overhead the log-space search visits (0 itself is tried as well), s.
OVERHEAD_LOG_FLOOR = 1e-7
META_KEYS = ("workload_spec", "cluster_spec", "plan")


# --- inputs -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CalibrationRun:
    """One measured run: its trace and the workload, cluster and plan it executed."""

    trace: Trace
    workload: WorkloadSpec
    cluster: ClusterSpec
    plan: Plan

    @classmethod
    def from_trace(cls, trace: Trace, where: str = "trace") -> CalibrationRun:
        """Read the specs from ``trace.meta`` (keys ``workload_spec``, ``cluster_spec``, ``plan``:
        the specs' ``to_dict()``); errors name the missing or bad field under ``where``."""
        meta = trace.meta or {}
        for key in META_KEYS:
            require(key in meta and meta[key] is not None, f"{where}.meta.{key}", None,
                    "is required: the runner stores the spec it ran (its to_dict())")
        workload = _parse(f"{where}.meta.workload_spec", WorkloadSpec.from_dict, meta["workload_spec"])
        cluster = _parse(f"{where}.meta.cluster_spec", ClusterSpec.from_dict, meta["cluster_spec"])
        plan = _parse(f"{where}.meta.plan", Plan.from_dict, meta["plan"])
        _parse(f"{where}.meta.plan", lambda _: validate(plan, workload, cluster), None)
        require(len(trace.iterations) >= 1, f"{where}.iterations", [], "need at least one iteration")
        return cls(trace, workload, cluster, plan)

    def measured_iteration_s(self) -> float:
        """Mean iteration time, after the first iteration when there are several, seconds."""
        its = self.trace.iteration_seconds()
        its = its[1:] if len(its) > 1 else its
        return sum(its) / len(its)


def _parse(field: str, fn: Callable[[Any], Any], data: Any) -> Any:
    try:
        return fn(data)
    except SpecError as exc:
        raise SpecError(f"{field}.{exc.field}", exc.value, exc.problem) from None
    except HetrlError as exc:
        raise HetrlError(f"{field}: {exc}") from None


def load_trace(path: str | Path) -> Trace:
    """A trace from hetrl's own Trace JSON schema; errors name the file."""
    from hetrl.io import read_mapping

    p = Path(path)
    try:
        return Trace.from_dict(read_mapping(p, "trace"))
    except SpecError as exc:
        if exc.field == "trace" and exc.value == str(p):
            raise
        raise SpecError(f"{p.name}: {exc.field}", exc.value, exc.problem) from None


def load_runs(paths: Sequence[str | Path]) -> list[CalibrationRun]:
    """Calibration runs from trace files (each must carry its specs in ``meta``)."""
    if not paths:
        raise SpecError("--traces", [], "give at least one trace file (hetrl Trace JSON)")
    runs = []
    for path in paths:
        trace = load_trace(path)
        runs.append(CalibrationRun.from_trace(trace, f"{Path(path).name}: trace"))
    return runs


# --- parameters ---------------------------------------------------------------------------------

@dataclass(frozen=True, order=True)
class Parameter:
    """One fitted parameter: an efficiency (``gpu``, ``kind``) or the decode overhead (gpu "")."""

    gpu: str
    kind: str

    @property
    def name(self) -> str:
        return self.kind if self.kind == OVERHEAD else f"{self.gpu}.{self.kind}"

    @property
    def bounds(self) -> tuple[float, float]:
        return OVERHEAD_BOUNDS if self.kind == OVERHEAD else EFFICIENCY_BOUNDS

    def value(self, params: CostParams) -> float:
        return params.decode_step_overhead_s if self.kind == OVERHEAD else params.efficiency(
            self.gpu, self.kind)


def apply_values(base: CostParams, parameters: Sequence[Parameter],
                 values: Sequence[float]) -> CostParams:
    """``base`` with each parameter set: efficiencies as ``per_gpu`` entries."""
    per = {(g, k): v for g, k, v in base.per_gpu}
    overhead = base.decode_step_overhead_s
    for p, v in zip(parameters, values, strict=True):
        if p.kind == OVERHEAD:
            overhead = float(v)
        else:
            per[(p.gpu, p.kind)] = float(v)
    return replace(base, per_gpu=tuple((g, k, v) for (g, k), v in per.items()),
                   decode_step_overhead_s=overhead)


def _kind_order(p: Parameter) -> tuple[int, str, int]:
    kinds = list(KERNEL_KINDS)
    return (1 if p.kind == OVERHEAD else 0, p.gpu, kinds.index(p.kind) if p.kind in kinds else 0)


def candidate_parameters(run: CalibrationRun, tasks: Sequence[str]) -> set[Parameter]:
    """The parameters that the cost of ``tasks`` in ``run`` reads (by task kind and GPU type)."""
    placements = {p.task: p for p in run.plan.placements}
    gpu_of = [d.gpu.name for d in run.cluster.devices]
    out: set[Parameter] = set()
    for task in tasks:
        if task == WEIGHT_SYNC:
            devs = [d for t in ("actor_generation", "actor_training") if t in placements
                    for d in placements[t].device_ids]
            kind = WEIGHT_SYNC
        else:
            devs = list(placements[task].device_ids)
            kind = run.workload.task(task).kind
        for gpu in sorted({gpu_of[d] for d in devs}):
            out.update(Parameter(gpu, k) for k in KIND_KERNELS[kind])
        if kind == "generation":
            out.add(Parameter("", OVERHEAD))
    return out


# --- results ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TaskFit:
    """One task of one run: measured and estimated seconds before and after the fit."""

    task: str
    measured_s: float
    before_s: float
    after_s: float

    def to_dict(self) -> dict[str, float]:
        return {"measured_s": self.measured_s, "estimate_before_s": self.before_s,
                "estimate_after_s": self.after_s}


@dataclass(frozen=True)
class RunFit:
    """One run: iteration time measured and estimated (seconds), and its tasks."""

    workload: str
    cluster: str
    measured_iteration_s: float
    estimate_before_s: float
    estimate_after_s: float
    tasks: tuple[TaskFit, ...]

    @property
    def error_before(self) -> float:
        """|estimate - measured| / measured of the iteration time with the base parameters."""
        return abs(self.estimate_before_s - self.measured_iteration_s) / self.measured_iteration_s

    @property
    def error_after(self) -> float:
        return abs(self.estimate_after_s - self.measured_iteration_s) / self.measured_iteration_s

    def to_dict(self) -> dict[str, Any]:
        return {"workload": self.workload, "cluster": self.cluster,
                "measured_iteration_s": self.measured_iteration_s,
                "estimate_before_s": self.estimate_before_s,
                "estimate_after_s": self.estimate_after_s,
                "error_before": self.error_before, "error_after": self.error_after,
                "tasks": {t.task: t.to_dict() for t in self.tasks}}


@dataclass(frozen=True)
class CalibrationResult:
    """The fitted parameters, the fit per run and task, and the objective before and after.

    ``fitted``: (parameter name, base value, fitted value); ``unused``: candidate parameters
    that no estimate depends on (left at their base values)."""

    params: CostParams
    runs: tuple[RunFit, ...]
    fitted: tuple[tuple[str, float, float], ...]
    unused: tuple[str, ...]
    objective_before: float
    objective_after: float
    sweeps: int
    evaluations: int

    @property
    def error_before(self) -> float:
        """Mean over runs of the iteration time's relative error with the base parameters."""
        return sum(r.error_before for r in self.runs) / len(self.runs)

    @property
    def error_after(self) -> float:
        return sum(r.error_after for r in self.runs) / len(self.runs)

    def to_dict(self) -> dict[str, Any]:
        return {"error_before": self.error_before, "error_after": self.error_after,
                "objective_before": self.objective_before, "objective_after": self.objective_after,
                "sweeps": self.sweeps, "evaluations": self.evaluations,
                "fitted": {n: {"base": b, "fitted": v} for n, b, v in self.fitted},
                "unused": list(self.unused),
                "runs": [r.to_dict() for r in self.runs], "params": self.params.to_dict()}


# --- the fit ------------------------------------------------------------------------------------

def _estimates(runs: Sequence[CalibrationRun], params: CostParams) -> list[tuple[float, dict[str, float]]]:
    out = []
    for run in runs:
        est = CostModel(run.workload, run.cluster, params).estimate(run.plan, check=False)
        out.append((est.iteration_s, dict(est.tasks)))
    return out


def fit_params(runs: Sequence[CalibrationRun], base: CostParams = DEFAULT_PARAMS,
               max_sweeps: int = 8, grid_points: int = 13, tol_log: float = 1e-3,
               prior_weight: float = 1e-6) -> CalibrationResult:
    """Fit efficiencies and the decode-step overhead to ``runs`` (see the module docstring).

    ``max_sweeps``: coordinate-descent sweeps at most; ``grid_points``: coarse grid per
    parameter over its log range; ``tol_log``: golden-section tolerance in ln units (1e-3 is
    0.1 %); ``prior_weight``: weight of the pull towards ``base``."""
    require(len(runs) >= 1, "runs", [], "need at least one calibration run")
    require(max_sweeps >= 1, "max_sweeps", max_sweeps, "must be >= 1")
    require(grid_points >= 3, "grid_points", grid_points, "must be >= 3")
    require(tol_log > 0, "tol_log", tol_log, "must be > 0")
    require(prior_weight >= 0, "prior_weight", prior_weight, "must be >= 0")
    before = _estimates(runs, base)
    measured = [run.trace.task_seconds() for run in runs]
    tasks = [[t for t in REPORTED_TASKS if meas.get(t, 0.0) > 0 and est.get(t, 0.0) > 0]
             for (_, est), meas in zip(before, measured, strict=True)]
    if not any(tasks):
        raise HetrlError("calibrate: no task is both measured (a 'task' span with positive "
                         f"seconds) and estimated; trace tasks: {sorted(set().union(*measured))}")
    candidates: set[Parameter] = set()
    for run, names in zip(runs, tasks, strict=True):
        candidates |= candidate_parameters(run, names)
    ordered = sorted(candidates, key=_kind_order)

    def predicted(params: CostParams) -> list[dict[str, float]]:
        return [{t: est[t] for t in names}
                for (_, est), names in zip(_estimates(runs, params), tasks, strict=True)]

    # Keep the parameters that move some estimate.
    ref = predicted(base)
    parameters: list[Parameter] = []
    unused: list[str] = []
    for p in ordered:
        v0 = p.value(base)
        lo, hi = p.bounds
        alt = (v0 / 2 if v0 / 2 >= lo else min(hi, v0 * 2)) if v0 > 0 else 1e-3
        moved = predicted(apply_values(base, [p], [alt]))
        if any(abs(m[t] - r[t]) > 1e-12 * max(abs(r[t]), 1e-30)
               for m, r in zip(moved, ref, strict=True) for t in r):
            parameters.append(p)
        else:
            unused.append(p.name)
    base_values = [p.value(base) for p in parameters]
    log_meas = [{t: math.log(meas[t]) for t in names} for meas, names in zip(measured, tasks, strict=True)]
    cache: dict[tuple[float, ...], float] = {}

    def loss(values: Sequence[float]) -> float:
        key = tuple(values)
        hit = cache.get(key)
        if hit is not None:
            return hit
        pred = predicted(apply_values(base, parameters, values))
        total = sum((math.log(max(pr[t], 1e-300)) - lm[t]) ** 2
                    for pr, lm in zip(pred, log_meas, strict=True) for t in lm)
        for p, v, b in zip(parameters, values, base_values, strict=True):
            floor = OVERHEAD_LOG_FLOOR if p.kind == OVERHEAD else EFFICIENCY_BOUNDS[0]
            total += prior_weight * (math.log(max(v, floor)) - math.log(max(b, floor))) ** 2
        cache[key] = total
        return total

    values = list(base_values)
    objective_before = loss(values)
    current = objective_before
    sweeps = 0
    while sweeps < max_sweeps:
        sweeps += 1
        start, old = current, list(values)
        for i, p in enumerate(parameters):
            values[i], current = _coordinate_search(loss, values, i, p, grid_points, tol_log, current)
        if len(parameters) > 1:
            values, current = _pattern_move(loss, parameters, old, values, current, tol_log)
        if start - current <= 1e-5 * max(start, 1e-12):
            break
    params = apply_values(base, parameters, values)
    after = _estimates(runs, params)
    fits = []
    for run, (it0, est0), (it1, est1), meas, names in zip(runs, before, after, measured, tasks,
                                                          strict=True):
        fits.append(RunFit(
            run.workload.name, run.cluster.name, run.measured_iteration_s(), it0, it1,
            tuple(TaskFit(t, meas[t], est0[t], est1[t]) for t in names)))
    return CalibrationResult(
        params=params, runs=tuple(fits),
        fitted=tuple((p.name, b, v) for p, b, v in zip(parameters, base_values, values, strict=True)),
        unused=tuple(unused), objective_before=objective_before, objective_after=current,
        sweeps=sweeps, evaluations=len(cache))


_GOLDEN = (math.sqrt(5) - 1) / 2


def _golden(f: Callable[[float], float], a: float, b: float, tol: float) -> tuple[float, float]:
    """Golden-section search for a minimum of ``f`` on [a, b]; returns (x, f(x))."""
    c, d = b - _GOLDEN * (b - a), a + _GOLDEN * (b - a)
    fc, fd = f(c), f(d)
    while b - a > tol:
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - _GOLDEN * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + _GOLDEN * (b - a)
            fd = f(d)
    return (c, fc) if fc <= fd else (d, fd)


def _log_value(p: Parameter, v: float) -> float:
    return math.log(max(v, OVERHEAD_LOG_FLOOR if p.kind == OVERHEAD else EFFICIENCY_BOUNDS[0]))


def _pattern_move(loss: Callable[[Sequence[float]], float], parameters: Sequence[Parameter],
                  old: Sequence[float], new: list[float], current: float,
                  tol_log: float) -> tuple[list[float], float]:
    """Hooke-Jeeves acceleration: search along the sweep's net step (in log space) beyond the new
    point, x(t) = new + t (new - old) for t in [0, 8], clipped to the bounds. Coordinate descent
    crawls along narrow valleys (parameters that trade off against each other); this jumps."""
    u_old = [_log_value(p, v) for p, v in zip(parameters, old, strict=True)]
    u_new = [_log_value(p, v) for p, v in zip(parameters, new, strict=True)]
    step = [b - a for a, b in zip(u_old, u_new, strict=True)]
    if max(map(abs, step), default=0.0) < tol_log:
        return new, current

    def point(t: float) -> list[float]:
        out = []
        for p, u, s, v in zip(parameters, u_new, step, new, strict=True):
            lo, hi = p.bounds
            out.append(v if s == 0 else min(hi, max(lo, math.exp(u + t * s))))
        return out

    t, y = _golden(lambda t: loss(point(t)), 0.0, 8.0, tol_log)
    if y < current:
        return point(t), y
    return new, current


def _coordinate_search(loss: Callable[[Sequence[float]], float], values: list[float], i: int,
                       p: Parameter, grid_points: int, tol_log: float,
                       current: float) -> tuple[float, float]:
    """Best value of parameter ``i`` (others fixed): a log grid over its range, then golden-section
    search between the best grid point's neighbours. Returns (value, loss); never worse than the
    current value."""
    lo, hi = p.bounds
    a_log = math.log(OVERHEAD_LOG_FLOOR if p.kind == OVERHEAD else lo)
    b_log = math.log(hi)

    def clip(u: float) -> float:
        return min(hi, max(lo, math.exp(u)))

    def f(u: float) -> float:
        trial = list(values)
        trial[i] = clip(u)
        return loss(trial)

    best_v, best = values[i], current
    if p.kind == OVERHEAD and lo == 0.0:
        trial = list(values)
        trial[i] = 0.0
        zero = loss(trial)
        if zero < best:
            best_v, best = 0.0, zero
    step = (b_log - a_log) / (grid_points - 1)
    for k in range(grid_points):
        u = a_log + k * step
        y = f(u)
        if y < best:
            best_v, best = clip(u), y
    if best_v > 0:
        centre = max(math.log(best_v), a_log)
        u, y = _golden(f, max(a_log, centre - step), min(b_log, centre + step), tol_log)
        if y < best:
            best_v, best = clip(u), y
    return best_v, best


def format_result(result: CalibrationResult, params_out: str | None = None) -> str:
    """A human-readable summary: per run and task, measured vs estimates, and the parameters."""
    lines = [f"iteration-time error: {result.error_before:.1%} before, {result.error_after:.1%} after"
             f" ({len(result.runs)} runs, {result.sweeps} sweeps, {result.evaluations} evaluations)"]
    for r in result.runs:
        lines.append(f"  {r.workload} on {r.cluster}: measured {r.measured_iteration_s:.4g} s, "
                     f"estimate {r.estimate_before_s:.4g} -> {r.estimate_after_s:.4g} s")
        for t in r.tasks:
            lines.append(f"    {t.task:<21} measured {t.measured_s:>10.4g} s  estimate "
                         f"{t.before_s:>10.4g} -> {t.after_s:.4g} s")
    lines.append("  parameters (base -> fitted):")
    lines += [f"    {n:<34} {b:.4g} -> {v:.4g}" for n, b, v in result.fitted]
    if result.unused:
        lines.append("  not fitted (no estimate depends on them): " + ", ".join(result.unused))
    if params_out:
        lines.append(f"  wrote {params_out}")
    return "\n".join(lines)


def result_json(result: CalibrationResult, params_out: str) -> Mapping[str, Any]:
    """The ``hetrl calibrate --json`` document."""
    return {"params_out": params_out, **result.to_dict()}
