"""The 80% band of an iteration estimate, from the cost model's errors on published steps.

The residuals are the primary comparisons (ratio = estimate / measured) of the public set's
*holdout step rows* (experiments/validate_public.py, docs/validation.md, "The band of an
estimate"), shipped as ``hetrl/data/validation_residuals.csv`` and rewritten by that script
whenever it writes its outputs. For an estimate of ``est`` seconds::

    q    = max(80th percentile of |ln ratio| over the rows of the plan's class, MIN_HALF_WIDTH)
    band = [est x exp(-q), est x exp(q)]

The class is ``colocated`` (:func:`is_colocated`: verl's hybrid engine) or ``disaggregated``; a
class with fewer than :data:`MIN_CLASS_ROWS` rows takes every row (class ``all``). GPU types the
plan uses on which no row was measured are listed (``unvalidated``): the band then comes from
other GPUs' steps.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from hetrl.errors import SpecError
from hetrl.plan import Plan
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.workload import WorkloadSpec

#: The shipped residual table (in package ``hetrl.data``).
RESIDUALS_FILE = "validation_residuals.csv"
#: Its columns, in order (``gpus``: the row's GPU types joined by ";").
RESIDUAL_COLUMNS = ("id", "split", "kind", "colocated", "feasible", "gpus", "ratio", "source_key")
#: The band covers this share of the residuals (percent).
BAND_PERCENT = 80
#: A class with fewer rows than this borrows every row (its own percentile would be noise).
MIN_CLASS_ROWS = 5
#: The narrowest half-width, in ln units (a factor 1.05 either way): a class whose rows all
#: hit within 5% would otherwise give a band of width ~0, which no set of a few published
#: steps (each with its own run-to-run spread) supports.
MIN_HALF_WIDTH = math.log(1.05)


@dataclass(frozen=True)
class Residual:
    """One holdout step row's primary comparison: ``ratio`` = estimate / measured seconds;
    ``feasible`` false where the cost model finds the row's plan over memory (its time then
    computed ignoring memory); ``gpus`` the GPU types the row's plan uses."""

    id: str
    split: str
    kind: str
    colocated: bool
    feasible: bool
    gpus: tuple[str, ...]
    ratio: float
    source_key: str


@dataclass(frozen=True)
class Band:
    """The band of one estimate, seconds: ``low_s`` < estimate < ``high_s``. ``quantile`` is the
    percentile of |ln ratio| used (80), ``half_width`` its value after the floor (ln units),
    ``rows``/``row_ids`` the residuals it is taken over, ``cls`` their class (``colocated``,
    ``disaggregated`` or ``all``), ``plan_class`` the plan's own class and ``class_rows`` its
    rows (fewer than :data:`MIN_CLASS_ROWS`: class ``all``), ``unvalidated`` the plan's GPU
    types with no residual row at all."""

    low_s: float
    high_s: float
    quantile: int
    half_width: float
    rows: int
    row_ids: tuple[str, ...]
    cls: str
    plan_class: str
    class_rows: int
    unvalidated: tuple[str, ...] = ()

    @property
    def description(self) -> str:
        """E.g. ``80% band from 9 published co-located steps``."""
        steps = "step" if self.rows == 1 else "steps"
        if self.cls == "all":
            return (f"{self.quantile}% band from all {self.rows} published {steps}; only "
                    f"{self.class_rows} {_named(self.plan_class)}")
        return f"{self.quantile}% band from {self.rows} published {_named(self.cls)} {steps}"

    def source(self) -> dict[str, Any]:
        """``band_source`` of ``hetrl estimate --json``."""
        return {"rows": self.rows, "class": self.cls, "plan_class": self.plan_class,
                "class_rows": self.class_rows, "quantile": self.quantile,
                "half_width_ln": self.half_width, "row_ids": list(self.row_ids),
                "unvalidated_gpus": list(self.unvalidated), "description": self.description}


def _named(cls: str) -> str:
    return "co-located" if cls == "colocated" else cls


def is_colocated(plan: Plan, workload: WorkloadSpec) -> bool:
    """True when ``plan`` runs synchronously and a generation task shares a device with
    ``actor_training`` (verl's hybrid engine: the engines switch every step); false for a
    disaggregated or asynchronous plan."""
    if workload.mode != "sync":
        return False
    devices = {p.task: frozenset(p.device_ids) for p in plan.placements}
    train = devices.get("actor_training")
    if train is None:
        return False
    return any(not devices[t.name].isdisjoint(train) for t in workload.tasks
               if t.kind == "generation" and t.name in devices)


def plan_class(colocated: bool) -> str:
    """The class name of a plan (or row) by :func:`is_colocated`."""
    return "colocated" if colocated else "disaggregated"


def residuals_csv(residuals: Iterable[Residual]) -> str:
    """The residuals as the text of :data:`RESIDUALS_FILE` (ratios to 6 significant digits)."""
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")
    out.writerow(RESIDUAL_COLUMNS)
    for r in residuals:
        out.writerow([r.id, r.split, r.kind, str(r.colocated).lower(), str(r.feasible).lower(),
                      ";".join(r.gpus), f"{r.ratio:.6g}", r.source_key])
    return buf.getvalue()


def _flag(value: str, where: str) -> bool:
    if value not in ("true", "false"):
        raise SpecError(where, value, "must be true or false")
    return value == "true"


def parse_residuals(text: str, what: str = RESIDUALS_FILE) -> tuple[Residual, ...]:
    """The rows of a residual table's text; a missing column or a ratio that is not a finite
    positive number is a :class:`SpecError` naming the line."""
    reader = csv.DictReader(io.StringIO(text))
    missing = set(RESIDUAL_COLUMNS) - set(reader.fieldnames or ())
    if missing:
        raise SpecError(what, sorted(missing), "missing columns")
    out = []
    for i, r in enumerate(reader, start=2):
        where = f"{what}: line {i}"
        try:
            ratio = float(r["ratio"])
        except ValueError:
            raise SpecError(f"{where}: ratio", r["ratio"], "must be a number") from None
        if not (math.isfinite(ratio) and ratio > 0):
            raise SpecError(f"{where}: ratio", ratio, "must be a finite number > 0")
        out.append(Residual(r["id"], r["split"], r["kind"], _flag(r["colocated"], where),
                            _flag(r["feasible"], where),
                            tuple(g for g in r["gpus"].split(";") if g), ratio, r["source_key"]))
    return tuple(out)


@lru_cache(maxsize=1)
def shipped_residuals() -> tuple[Residual, ...]:
    """The rows of the shipped ``hetrl/data/validation_residuals.csv`` (read once)."""
    return parse_residuals(resources.files("hetrl.data").joinpath(RESIDUALS_FILE).read_text())


def percentile(values: Sequence[float], percent: float) -> float:
    """The ``percent``-th percentile of ``values``, interpolated linearly between order
    statistics (numpy's default)."""
    xs = sorted(values)
    pos = (len(xs) - 1) * percent / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def half_width(colocated: bool, rows: Sequence[Residual]
               ) -> tuple[float, str, list[Residual], list[Residual]]:
    """The band's half-width q (ln units) for a plan of class ``colocated`` from the holdout
    step ``rows`` (not empty): (q, the class used, the rows used, the rows of the plan's
    class)."""
    mine = plan_class(colocated)
    same = [r for r in rows if plan_class(r.colocated) == mine]
    cls, used = (mine, same) if len(same) >= MIN_CLASS_ROWS else ("all", list(rows))
    q = max(percentile([abs(math.log(r.ratio)) for r in used], BAND_PERCENT), MIN_HALF_WIDTH)
    return q, cls, used, same


def estimate_band(estimate_s: float, plan: Plan, workload: WorkloadSpec, cluster: ClusterSpec,
                  residuals: Sequence[Residual] | None = None) -> Band | None:
    """The :data:`BAND_PERCENT`% band of an iteration estimate of ``estimate_s`` seconds of
    ``plan`` (``residuals``: default the shipped table; only its holdout step rows count).
    None when there are no such rows or the estimate is not a finite positive number."""
    rows = [r for r in (shipped_residuals() if residuals is None else residuals)
            if r.split == "holdout" and r.kind == "step"]
    if not rows or not (math.isfinite(estimate_s) and estimate_s > 0):
        return None
    mine = plan_class(is_colocated(plan, workload))
    q, cls, used, same = half_width(mine == "colocated", rows)
    validated = {g for r in rows for g in r.gpus}
    gpus = sorted({cluster.device(d).gpu.name for d in plan.device_ids})
    return Band(low_s=estimate_s * math.exp(-q), high_s=estimate_s * math.exp(q),
                quantile=BAND_PERCENT, half_width=q, rows=len(used),
                row_ids=tuple(r.id for r in used), cls=cls, plan_class=mine,
                class_rows=len(same),
                unvalidated=tuple(g for g in gpus if g not in validated))
