"""Fit the cost model's calibration parameters to measured traces (``hetrl calibrate``).

Objective: bounded nonlinear least squares (``scipy.optimize.least_squares``, method "trf") in
u = ln(value) of every fitted parameter, over the residuals

  r_run,task = ln estimate - ln measured      (every task measured and estimated > 0 s)
  r_i        = sqrt(prior_weight) (u_i - ln base_i)

where the estimate is ``CostModel(workload, cluster, params).estimate(plan).tasks[task]`` and the
measurement is ``Trace.task_seconds()`` (mean over iterations after the first). A trace with the
generation's ``prefill`` and ``decode`` phase spans (schema 2) measures those two instead of the
generation task ("actor_generation:prefill", "actor_generation:decode", against
``Estimate.generation_phases``): the prefill then fits infer_flops apart from the decode's
factors. Efficiencies are
multiplicative, so log space makes a factor of two the same step at 0.8 and at 1e-4.

The prior makes the fit well-posed: traces often cannot separate factors (the Adam step's HBM
time hides inside a training step that is 99 % matmuls; one generation time per run cannot split
decode bandwidth from per-step overhead), and a bare fit moves such factors far off to absorb
noise. ``PRIOR_WEIGHT`` = (TASK_SIGMA_LN / PRIOR_SIGMA_LN)^2: a task time is trusted to ~10 %,
a factor's base value to within a factor of 10, so the data outweigh the prior wherever they
determine a factor. Identifiability: at the optimum of the fit of all parameters, the Gauss-Newton
posterior sd of each u_i over the prior sd, sqrt(w [(J^T J)^-1]_ii) with J the residuals' Jacobian,
is 1 when the traces say nothing about it and near 0 when they pin it down. Parameters above
``IDENTIFIED_SD_RATIO`` are reported as unidentified, reset to their base values, and the rest
refitted without them.

Parameters: for every GPU type a task ran on, the efficiency of each kernel kind that task kind
uses (generation: infer_flops, decode_flops, decode_hbm, hbm, link; inference: infer_flops, hbm,
link; training: train_flops, hbm, link; weight sync: hbm, link), kept only if changing it moves
some estimate, plus ``decode_step_overhead_s`` when a generation task is measured, plus
``launch_overhead_s_per_layer`` when a trace ran on a CPU (meta ``device``; from
``CPU_LAUNCH_BASE_S`` when the base has none). Bounds:
efficiencies in [1e-6, 1] (a CPU emulating an A100 runs at ~1e-4 of its peak), the overhead and
the launch term in [1e-7, 1] s (1e-7 s stands for none: 0.1 ms over 1,000 decode steps).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from numbers import Real
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from hetrl.cost.framework import without_framework
from hetrl.cost.model import CostModel
from hetrl.cost.params import DEFAULT_PARAMS, KERNEL_KINDS, CostParams
from hetrl.errors import HetrlError, SpecError, require
from hetrl.plan import Plan, validate
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.tasks import REPORTED_TASKS, WEIGHT_SYNC
from hetrl.spec.workload import WorkloadSpec
from hetrl.trace import Trace

__all__ = ["CalibrationResult", "CalibrationRun", "EFFICIENCY_BOUNDS", "IDENTIFIED_SD_RATIO",
           "CPU_LAUNCH_BASE_S", "KIND_KERNELS", "LAUNCH", "META_KEYS", "OVERHEAD", "OVERHEAD_BOUNDS", "OVERHEAD_LOG_FLOOR",
           "PHASES", "PRIOR_SIGMA_LN", "PRIOR_WEIGHT", "Parameter", "RunFit", "TASK_SIGMA_LN", "TaskFit",
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
#: Fixed seconds per layer per forward (``CostParams.launch_overhead_s_per_layer``): fitted for
#: traces run on a CPU (trace meta ``device`` "cpu..."), where dispatch dominates a tiny model.
LAUNCH = "launch_overhead_s_per_layer"
#: The launch term's base value (the prior's centre and the fit's start) for CPU traces when the
#: base parameters have none: PyTorch's eager dispatch costs ~10 us per op on a CPU and a layer
#: runs ~10 ops. (A log-space fit cannot start from 0: at its 1e-7 s floor the term moves no
#: estimate and the fit never leaves it.)
CPU_LAUNCH_BASE_S = 1e-4
#: Fitted seconds-valued parameters (not efficiencies): bounded to OVERHEAD_BOUNDS, 0 -> the floor.
SECONDS_PARAMS = (OVERHEAD, LAUNCH)
#: The generation task's measured phases (``phase`` spans of the trace) and their keys among the
#: fitted times: "actor_generation:prefill", "actor_generation:decode".
GENERATION = "actor_generation"
PHASES = ("prefill", "decode")
EFFICIENCY_BOUNDS = (1e-6, 1.0)
OVERHEAD_BOUNDS = (0.0, 1.0)  # seconds per decode step
#: The smallest overhead the log-space fit reaches, s (stands for none).
OVERHEAD_LOG_FLOOR = 1e-7
#: How closely a calibrated estimate should match one measured task time, in ln units (10 %).
TASK_SIGMA_LN = 0.1
#: How far a factor may be from its base value a priori, in ln units (a factor of 10).
PRIOR_SIGMA_LN = math.log(10)
#: Weight of the prior residuals: (TASK_SIGMA_LN / PRIOR_SIGMA_LN)^2 = 1.9e-3.
PRIOR_WEIGHT = (TASK_SIGMA_LN / PRIOR_SIGMA_LN) ** 2
#: A parameter is identified when the traces shrink its prior sd (in ln) to at most this fraction:
#: they carry at least 3x the prior's information about it.
IDENTIFIED_SD_RATIO = 0.5
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
        run = cls(trace, workload, cluster, plan)
        require(run.measured_iteration_s() > 0, f"{where}.iterations", list(trace.iterations),
                "the measured iterations must last > 0 seconds (a fit compares logarithms)")
        return run

    def on_cpu(self) -> bool:
        """The run executed on a CPU (trace meta ``device``), the case for a launch term."""
        return str((self.trace.meta or {}).get("device", "")).startswith("cpu")

    def measured_times(self) -> dict[str, float]:
        """Measured seconds per task (``Trace.task_seconds()``); when the trace has the
        generation's ``prefill`` and ``decode`` phase spans, those two ("actor_generation:prefill",
        "actor_generation:decode") stand for the generation task."""
        out = dict(self.trace.task_seconds())
        phases = self.trace.phase_seconds(GENERATION)
        if all(phases.get(ph, 0.0) > 0 for ph in PHASES):
            out.pop(GENERATION, None)
            out.update({f"{GENERATION}:{ph}": phases[ph] for ph in PHASES})
        return out

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
        return self.kind if self.kind in SECONDS_PARAMS else f"{self.gpu}.{self.kind}"

    @property
    def bounds(self) -> tuple[float, float]:
        return OVERHEAD_BOUNDS if self.kind in SECONDS_PARAMS else EFFICIENCY_BOUNDS

    def value(self, params: CostParams) -> float:
        if self.kind in SECONDS_PARAMS:
            return getattr(params, self.kind)
        return params.efficiency(self.gpu, self.kind)


def apply_values(base: CostParams, parameters: Sequence[Parameter],
                 values: Sequence[float]) -> CostParams:
    """``base`` with each parameter set: efficiencies as ``per_gpu`` entries."""
    per = {(g, k): v for g, k, v in base.per_gpu}
    seconds = {k: getattr(base, k) for k in SECONDS_PARAMS}
    for p, v in zip(parameters, values, strict=True):
        if p.kind in SECONDS_PARAMS:
            seconds[p.kind] = float(v)
        else:
            per[(p.gpu, p.kind)] = float(v)
    return replace(base, per_gpu=tuple((g, k, v) for (g, k), v in per.items()), **seconds)


def _kind_order(p: Parameter) -> tuple[int, str, int]:
    kinds = list(KERNEL_KINDS)
    return (1 + SECONDS_PARAMS.index(p.kind) if p.kind in SECONDS_PARAMS else 0, p.gpu, kinds.index(p.kind) if p.kind in kinds else 0)


def candidate_parameters(run: CalibrationRun, tasks: Sequence[str]) -> set[Parameter]:
    """The parameters that the cost of ``tasks`` in ``run`` reads (by task kind and GPU type)."""
    placements = {p.task: p for p in run.plan.placements}
    gpu_of = [d.gpu.name for d in run.cluster.devices]
    out: set[Parameter] = set()
    for task in {t.partition(":")[0] for t in tasks}:
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
    if run.on_cpu():
        out.add(Parameter("", LAUNCH))
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

    ``fitted``: (name, base value, fitted value) of every parameter some estimate depends on;
    ``unused``: candidates no estimate depends on; ``unidentified``: parameters the traces do not
    determine, left at their base values; ``sd_ratio``: (name, posterior sd / prior sd of the ln
    value), from the fit of every parameter; ``sd_log``: (name, that posterior sd in ln units,
    ~ relative error, if task times hold to TASK_SIGMA_LN); ``objective_*``: J, the sum of the
    squared residuals, prior included; ``residual_*``: root mean square of ln estimate - ln
    measured over the tasks (ln units); ``iterations``: least-squares steps tried (Jacobians not
    counted); ``sweeps``: the same per parameter, rounded up (the unit of ``max_sweeps``);
    ``evaluations``: cost-model evaluations (each estimates every run once); ``converged``: no
    solve stopped on its step budget."""

    params: CostParams
    runs: tuple[RunFit, ...]
    fitted: tuple[tuple[str, float, float], ...]
    unused: tuple[str, ...]
    objective_before: float
    objective_after: float
    sweeps: int
    evaluations: int
    unidentified: tuple[str, ...] = ()
    sd_ratio: tuple[tuple[str, float], ...] = ()
    sd_log: tuple[tuple[str, float], ...] = ()
    residual_before: float = 0.0
    residual_after: float = 0.0
    iterations: int = 0
    converged: bool = True
    tol_log: float = 1e-3

    @property
    def error_before(self) -> float:
        """Mean over runs of the iteration time's relative error with the base parameters."""
        return sum(r.error_before for r in self.runs) / len(self.runs)

    @property
    def error_after(self) -> float:
        return sum(r.error_after for r in self.runs) / len(self.runs)

    @property
    def moved(self) -> tuple[str, ...]:
        """Parameters whose fitted value differs from the base by more than ``tol_log`` in ln."""
        return tuple(n for n, b, v in self.fitted if _moved(b, v, self.tol_log))

    def to_dict(self) -> dict[str, Any]:
        ratio, sd_log = dict(self.sd_ratio), dict(self.sd_log)
        return {"error_before": self.error_before, "error_after": self.error_after,
                "objective_before": self.objective_before, "objective_after": self.objective_after,
                "residual_before": self.residual_before, "residual_after": self.residual_after,
                "sweeps": self.sweeps, "iterations": self.iterations,
                "evaluations": self.evaluations, "converged": self.converged,
                "fitted": {n: {"base": b, "fitted": v, "moved": _moved(b, v, self.tol_log),
                               "identified": n not in self.unidentified,
                               "sd_ratio": ratio.get(n), "sd_log": sd_log.get(n)}
                           for n, b, v in self.fitted},
                "unused": list(self.unused), "unidentified": list(self.unidentified),
                "runs": [r.to_dict() for r in self.runs], "params": self.params.to_dict()}


def _moved(base: float, value: float, tol_log: float) -> bool:
    floor = OVERHEAD_LOG_FLOOR
    return abs(math.log(max(value, floor)) - math.log(max(base, floor))) > tol_log


# --- the fit ------------------------------------------------------------------------------------

def _estimates(runs: Sequence[CalibrationRun], params: CostParams) -> list[tuple[float, dict[str, float]]]:
    out = []
    for run in runs:
        est = CostModel(run.workload, run.cluster, params).estimate(run.plan, check=False)
        times = dict(est.tasks)
        times.update({f"{GENERATION}:{ph}": x for ph, x in zip(PHASES, est.generation_phases[:2],
                                                                   strict=True)})
        out.append((est.iteration_s, times))
    return out


def _log_bounds(p: Parameter) -> tuple[float, float]:
    lo, hi = p.bounds
    return math.log(max(lo, OVERHEAD_LOG_FLOOR if p.kind in SECONDS_PARAMS else lo)), math.log(hi)


def fit_params(runs: Sequence[CalibrationRun], base: CostParams = DEFAULT_PARAMS,
               max_sweeps: int = 8, tol_log: float = 1e-3,
               prior_weight: float = PRIOR_WEIGHT) -> CalibrationResult:
    """Fit efficiencies and the decode-step overhead to ``runs`` (see the module docstring).

    ``max_sweeps``: each least-squares solve stops after max_sweeps x (number of parameters)
    steps; ``tol_log``: in ln units (1e-3 is 0.1 %), a solve stops when its step is about this
    small, and a parameter counts as moved when it changed by more; ``prior_weight``: w, the weight of the pull towards ``base`` in ln units.
    Never worse than ``base``: objective_after <= objective_before."""
    require(len(runs) >= 1, "runs", [], "need at least one calibration run")
    require(isinstance(max_sweeps, int) and max_sweeps >= 1, "max_sweeps", max_sweeps,
            "must be an integer >= 1")
    require(isinstance(tol_log, Real) and 0 < tol_log < 1, "tol_log", tol_log, "must be in (0, 1)")
    require(isinstance(prior_weight, Real) and 0 < prior_weight < math.inf, "prior_weight",
            prior_weight, "must be > 0 and finite: without the prior, factors the traces do not "
            "determine drift to absorb noise")
    if any(run.on_cpu() for run in runs):
        # hetrl's own runner on a CPU is not the GPU RL framework whose per-step costs the
        # defaults were fitted on (hetrl.cost.framework): its dispatch is the launch term's
        base = without_framework(base)
        if base.launch_overhead_s_per_layer == 0:
            base = replace(base, launch_overhead_s_per_layer=CPU_LAUNCH_BASE_S)
    before = _estimates(runs, base)
    measured = [run.measured_times() for run in runs]
    keys = [k for t in REPORTED_TASKS
            for k in ([t] + ([f"{t}:{ph}" for ph in PHASES] if t == GENERATION else []))]
    tasks = [[t for t in keys if meas.get(t, 0.0) > 0 and est.get(t, 0.0) > 0]
             for (_, est), meas in zip(before, measured, strict=True)]
    if not any(tasks):
        raise HetrlError("calibrate: no task is both measured (a 'task' span with positive "
                         f"seconds) and estimated; trace tasks: {sorted(set().union(*measured))}")
    candidates: set[Parameter] = set()
    for run, names in zip(runs, tasks, strict=True):
        candidates |= candidate_parameters(run, names)
    log_meas = np.array([math.log(meas[t]) for meas, names in zip(measured, tasks, strict=True)
                         for t in names])
    counter = [0]

    def data_residuals(params: CostParams) -> np.ndarray:
        counter[0] += 1
        pred = [math.log(est[t]) if 0 < est[t] < math.inf else _BAD_LOG
                for (_, est), names in zip(_estimates(runs, params), tasks, strict=True)
                for t in names]
        return np.array(pred) - log_meas

    # Keep the parameters that move some estimate when halved (doubled near the lower bound).
    ref = data_residuals(base)
    parameters: list[Parameter] = []
    unused: list[str] = []
    for p in sorted(candidates, key=_kind_order):
        v0, (lo, hi) = p.value(base), p.bounds
        alt = (v0 / 2 if v0 / 2 >= lo else min(hi, v0 * 2)) if v0 > 0 else 1e-3
        if np.any(np.abs(data_residuals(apply_values(base, [p], [alt])) - ref) > 1e-12):
            parameters.append(p)
        else:
            unused.append(p.name)
    fit = _LogFit(parameters, base, data_residuals, prior_weight, max_sweeps, tol_log)
    u, ratios, sd_log, unidentified = fit.run()
    keep = [i for i, p in enumerate(parameters) if p.name not in unidentified]
    params = apply_values(base, [parameters[i] for i in keep], list(np.exp(u[keep])))
    final = np.concatenate([data_residuals(params), fit.prior(u)])
    if final @ final > ref @ ref:  # a truncated solve that ended uphill: keep the base
        params, u, final = base, fit.u_base.copy(), ref
    base_values = [p.value(base) for p in parameters]
    values = [b if p.name in unidentified else float(math.exp(x))
              for p, b, x in zip(parameters, base_values, u, strict=True)]
    after = _estimates(runs, params)
    fits = []
    for run, (it0, est0), (it1, est1), meas, names in zip(runs, before, after, measured, tasks,
                                                          strict=True):
        fits.append(RunFit(
            run.workload.name, run.cluster.name, run.measured_iteration_s(), it0, it1,
            tuple(TaskFit(t, meas[t], est0[t], est1[t]) for t in names)))
    n = len(log_meas)
    return CalibrationResult(
        params=params, runs=tuple(fits),
        fitted=tuple((p.name, b, v) for p, b, v in zip(parameters, base_values, values, strict=True)),
        unused=tuple(unused), objective_before=float(ref @ ref),
        objective_after=float(final @ final),
        sweeps=-(-fit.steps // max(len(parameters), 1)), evaluations=counter[0],
        unidentified=tuple(unidentified),
        sd_ratio=tuple((p.name, float(r)) for p, r in zip(parameters, ratios, strict=True)),
        sd_log=tuple((p.name, float(r)) for p, r in zip(parameters, sd_log, strict=True)),
        residual_before=math.sqrt(float(ref @ ref) / n),
        residual_after=math.sqrt(float(final[:n] @ final[:n]) / n),
        iterations=fit.steps, converged=fit.converged, tol_log=tol_log)


class _LogFit:
    """The bounded least-squares problem in u = ln(value), solved with scipy's "trf"."""

    def __init__(self, parameters: Sequence[Parameter], base: CostParams,
                 data_residuals: Callable[[CostParams], np.ndarray], prior_weight: float,
                 max_sweeps: int, tol_log: float):
        self.parameters, self.base, self.data_residuals = list(parameters), base, data_residuals
        self.w, self.max_sweeps, self.tol_log = prior_weight, max_sweeps, tol_log
        self.bounds = np.array([_log_bounds(p) for p in parameters]).reshape(-1, 2)
        u0 = [math.log(max(p.value(base), OVERHEAD_LOG_FLOOR)) for p in parameters]
        self.u_base = np.clip(np.array(u0, dtype=float), self.bounds[:, 0], self.bounds[:, 1])
        self.cache: dict[tuple[float, ...], np.ndarray] = {}
        self.steps, self.converged = 0, True

    def prior(self, u: np.ndarray) -> np.ndarray:
        return math.sqrt(self.w) * (u - self.u_base)

    def residuals(self, u_free: np.ndarray, free: list[int]) -> np.ndarray:
        """Data residuals (ln estimate - ln measured), then the prior's, for ``free`` set to
        ``u_free`` and every other parameter at its base value."""
        u = self.u_base.copy()
        u[free] = np.clip(u_free, self.bounds[free, 0], self.bounds[free, 1])
        key = tuple(u.tolist())
        data = self.cache.get(key)
        if data is None:
            data = self.cache[key] = self.data_residuals(
                apply_values(self.base, self.parameters, list(np.exp(u))))
        return np.concatenate([data, self.prior(u)[free]])

    def solve(self, free: list[int], start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(u of ``free`` at the optimum, the residuals' Jacobian there)."""
        lo, hi = self.bounds[free, 0], self.bounds[free, 1]
        sol = least_squares(self.residuals, np.clip(start, lo, hi), args=(free,), method="trf",
                            jac="2-point", diff_step=_DIFF_STEP, bounds=(lo, hi),
                            x_scale=1.0, ftol=1e-10, gtol=1e-10,
                            xtol=self.tol_log / max(1.0, float(np.linalg.norm(start))),
                            max_nfev=self.max_sweeps * len(free))
        self.steps += int(sol.nfev)
        self.converged = self.converged and sol.status > 0
        return np.clip(sol.x, lo, hi), sol.jac

    def run(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
        """Fit every parameter; find the unidentified ones; refit the rest without them.
        Returns (u, sd ratio, posterior sd of u in ln units, unidentified names)."""
        every = list(range(len(self.parameters)))
        if not every:
            return self.u_base.copy(), np.ones(0), np.zeros(0), []
        u_all, jac = self.solve(every, self.u_base)
        # Gauss-Newton: J^T J = J_data^T J_data + w I is the posterior precision x TASK_SIGMA_LN^2
        # (J^T J holds the prior's w I, but a finite-difference column can come back
        # degenerate -- a CPU trace gave a singular matrix: fall back to the pseudo-inverse)
        precision = jac.T @ jac
        try:
            cov = np.linalg.inv(precision)
        except np.linalg.LinAlgError:
            cov = np.linalg.pinv(precision)
        ratios = np.sqrt(self.w * np.diag(cov))
        sd_log = TASK_SIGMA_LN * np.sqrt(np.diag(cov))
        keep = [i for i in every if ratios[i] <= IDENTIFIED_SD_RATIO]
        unidentified = [self.parameters[i].name for i in every if i not in keep]
        if not unidentified:
            return u_all, ratios, sd_log, []
        u = self.u_base.copy()
        if keep:  # from the better of the first fit's values and the base values
            warm = u.copy()
            warm[keep] = u_all[keep]
            start = min((warm, self.u_base), key=lambda x: float(
                np.sum(self.residuals(x[keep], keep) ** 2)))
            u[keep], _ = self.solve(keep, start[keep])
        return u, ratios, sd_log, unidentified


#: ln of an estimate that is 0 or not finite: far off every measurement, but finite for scipy.
_BAD_LOG = 700.0
#: Forward-difference step of the Jacobian, relative to max(1, |ln value|).
_DIFF_STEP = 1e-4


def _values(u: np.ndarray, bounds: np.ndarray) -> list[float]:
    return [float(math.exp(min(hi, max(lo, x)))) for x, (lo, hi) in zip(u, bounds, strict=True)]


def format_result(result: CalibrationResult, params_out: str | None = None) -> str:
    """A human-readable summary: per run and task, measured vs estimates, and the parameters."""
    lines = [f"iteration-time error: {result.error_before:.1%} before, {result.error_after:.1%} after"
             f" ({len(result.runs)} runs, {result.iterations} least-squares steps, "
             f"{result.evaluations} evaluations{'' if result.converged else ', step budget spent'})",
             f"task-time rms ln error: {result.residual_before:.4g} before, "
             f"{result.residual_after:.4g} after"]
    for r in result.runs:
        lines.append(f"  {r.workload} on {r.cluster}: measured {r.measured_iteration_s:.4g} s, "
                     f"estimate {r.estimate_before_s:.4g} -> {r.estimate_after_s:.4g} s")
        for t in r.tasks:
            lines.append(f"    {t.task:<21} measured {t.measured_s:>10.4g} s  estimate "
                         f"{t.before_s:>10.4g} -> {t.after_s:.4g} s")
    lines.append("  parameters (base -> fitted; sd ratio: posterior / prior sd, 1 = not determined):")
    ratio = dict(result.sd_ratio)
    for n, b, v in result.fitted:
        note = "unidentified, kept" if n in result.unidentified else (
            "moved" if n in result.moved else "unchanged")
        lines.append(f"    {n:<34} {b:.4g} -> {v:.4g}  sd ratio {ratio.get(n, 1.0):.2f}  {note}")
    if result.unused:
        lines.append("  not fitted (no estimate depends on them): " + ", ".join(result.unused))
    if params_out:
        lines.append(f"  wrote {params_out}")
    return "\n".join(lines)


def result_json(result: CalibrationResult, params_out: str) -> Mapping[str, Any]:
    """The ``hetrl calibrate --json`` document."""
    return {"params_out": params_out, **result.to_dict()}
