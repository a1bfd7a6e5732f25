"""Prices: on-demand $/GPU-hour per GPU type and region, and $/GB of egress, from the shipped
table ``hetrl/data/prices.csv`` (sources and dates in ``hetrl/data/README.md``), with a
cluster file's ``prices:`` overrides on top (docs/money.md).

A cluster file may give::

    prices:
      gpu_hour: {A100-80GB: 3.1, L4: 0.9}   # $/GPU-hour, for that type in every region
      egress_per_gb: 0.02                    # $/GB between any two regions
      internet_egress_per_gb: 0.09           # $/GB into an edge node (out to the internet)

A GPU type the table lacks (a cluster's own ``gpu_types``) has no price unless the cluster
gives one. An AWS region (a code such as ``ap-east-1``) where the table lists no price for the
type has none: the output says so, rather than borrowing another region's. A region name that
is not an AWS code (``local``, a lab's own name) is priced at us-east-1's, and the output says
that too (:meth:`Prices.quote`). Each price knows its instance (``p5.48xlarge``) and the GPUs
per instance, so that whole instances can be charged (docs/money.md).
"""

from __future__ import annotations

import csv
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from hetrl.errors import did_you_mean, find_name, finite_number, require, string

#: Largest $/GPU-hour an override may give (the dearest on-demand GPU is ~$15/GPU-hour).
MAX_DOLLARS_PER_GPU_HOUR = 1000.0
#: Largest egress $/GB an override may give (public clouds charge $0.01-0.2/GB).
MAX_DOLLARS_PER_GB = 10.0
#: The region whose price stands in for a region the table does not list.
DEFAULT_REGION = "us-east-1"


@dataclass(frozen=True)
class PriceOverrides:
    """A cluster file's ``prices:`` (all optional): ``gpu_hour`` (GPU type, $/GPU-hour) pairs,
    ``egress_per_gb`` (between regions) and ``internet_egress_per_gb`` (into edge nodes)."""

    gpu_hour: tuple[tuple[str, float], ...] = ()
    egress_per_gb: float | None = None
    internet_egress_per_gb: float | None = None

    def __bool__(self) -> bool:
        return bool(self.gpu_hour) or self.egress_per_gb is not None \
            or self.internet_egress_per_gb is not None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.gpu_hour:
            out["gpu_hour"] = dict(self.gpu_hour)
        if self.egress_per_gb is not None:
            out["egress_per_gb"] = self.egress_per_gb
        if self.internet_egress_per_gb is not None:
            out["internet_egress_per_gb"] = self.internet_egress_per_gb
        return out

    @classmethod
    def from_dict(cls, data: Any, known_gpus: set[str] | None = None) -> PriceOverrides:
        """Parse and check ``prices:``; ``known_gpus``: the GPU type names it may price."""
        require(isinstance(data, Mapping), "prices", data, "must be a mapping")
        known = {"gpu_hour", "egress_per_gb", "internet_egress_per_gb"}
        for key in data:
            require(key in known, f"prices.{key}", data[key],
                    f"unknown key; known keys: {sorted(known)}")
        hours: list[tuple[str, float]] = []
        raw = data.get("gpu_hour") or {}
        require(isinstance(raw, Mapping), "prices.gpu_hour", raw,
                "must be a mapping {GPU type: dollars per GPU-hour}")
        for gpu, value in raw.items():
            string("prices.gpu_hour", gpu)
            if known_gpus is not None:
                name = find_name(gpu, sorted(known_gpus))  # as typed, else ignoring case
                require(name is not None, f"prices.gpu_hour.{gpu}", value,
                        f"unknown GPU type; known: {sorted(known_gpus)}"
                        f"{did_you_mean(gpu, sorted(known_gpus))}")
                gpu = name
            hours.append((gpu, finite_number(f"prices.gpu_hour.{gpu}", value, 0.0,
                                             MAX_DOLLARS_PER_GPU_HOUR, "dollars per GPU-hour")))
        egress = {k: None if data.get(k) is None else finite_number(
            f"prices.{k}", data[k], 0.0, MAX_DOLLARS_PER_GB, "dollars per GB")
            for k in ("egress_per_gb", "internet_egress_per_gb")}
        return cls(tuple(hours), **egress)


@dataclass(frozen=True)
class PriceRow:
    """One row of ``prices.csv``."""

    kind: str  # gpu_hour | egress_gb
    item: str  # GPU type, or inter-region / internet
    region: str  # a region, "a|b" for a pair, or "*"
    instance: str
    dollars: float  # per GPU-hour or per GB
    source: str
    note: str
    gpus_per_instance: int = 0  # GPUs of ``instance`` (0: not an instance row)
    instance_dollars: float | None = None  # $/h of the whole instance


@dataclass(frozen=True)
class PriceQuote:
    """The price of one GPU type in one region: ``dollars`` per GPU-hour, the ``instance`` it
    is sold in (None: a ``prices:`` override, no instance) with ``gpus_per_instance``, and
    ``note``: empty when listed as is, else what stands in (another region's price, an
    override)."""

    dollars: float
    instance: str | None
    gpus_per_instance: int
    note: str = ""


#: An AWS region code: ``us-east-1``, ``ap-southeast-5``, ``il-central-1``.
_AWS_CODE = re.compile(r"^[a-z]{2}(-[a-z]+)+-[0-9]+$")


def is_aws_region_code(region: str) -> bool:
    """Whether ``region`` is written as an AWS region code (not whether AWS has it)."""
    return bool(_AWS_CODE.match(region))


@lru_cache(maxsize=1)
def price_table() -> tuple[PriceRow, ...]:
    """The rows of the shipped ``hetrl/data/prices.csv``."""
    text = resources.files("hetrl.data").joinpath("prices.csv").read_text()
    rows = list(csv.DictReader(text.splitlines()))
    return tuple(PriceRow(r["kind"], r["item"], r["region"], r["instance"],
                          float(r["dollars_per_unit"]), r["source"], r["note"],
                          int(r["gpus_per_instance"] or 0),
                          float(r["instance_dollars_per_hour"])
                          if r["instance_dollars_per_hour"] else None) for r in rows)


@dataclass(frozen=True)
class Prices:
    """Effective prices for one cluster: the table with the cluster's overrides."""

    overrides: PriceOverrides = PriceOverrides()

    def gpu_hour(self, gpu: str, region: str) -> float | None:
        """$/GPU-hour of ``gpu`` in ``region`` (None: no price known; see :meth:`quote`)."""
        q = self.quote(gpu, region)
        return None if q is None else q.dollars

    def quote(self, gpu: str, region: str) -> PriceQuote | None:
        """The price of ``gpu`` in ``region`` with its instance: a ``prices:`` override, else
        the table's row; an AWS region without a row has no price (None); a region name that
        is not an AWS code takes us-east-1's row, said in the note."""
        for name, value in self.overrides.gpu_hour:
            if name == gpu:
                return PriceQuote(value, None, 0, "prices.gpu_hour of the cluster file")
        rows = _gpu_rows()
        row = rows.get((gpu, region))
        if row is not None:
            note = "" if row.note == "listed" else row.note
            return PriceQuote(row.dollars, row.instance, row.gpus_per_instance, note)
        stand_in = rows.get((gpu, DEFAULT_REGION))
        if stand_in is None or is_aws_region_code(region):
            return None
        return PriceQuote(stand_in.dollars, stand_in.instance, stand_in.gpus_per_instance,
                          f"{region!r} is not an AWS region: priced at {DEFAULT_REGION}'s")

    def egress_per_gb(self, a: str, b: str) -> float:
        """$/GB sent from region ``a`` to region ``b`` (0 inside a region)."""
        if a == b:
            return 0.0
        if self.overrides.egress_per_gb is not None:
            return self.overrides.egress_per_gb
        pairs = _egress()
        return pairs.get(frozenset((a, b)), pairs[frozenset(("*",))])

    def internet_per_gb(self) -> float:
        """$/GB sent into an edge node (out to the internet)."""
        if self.overrides.internet_egress_per_gb is not None:
            return self.overrides.internet_egress_per_gb
        return next(r.dollars for r in price_table() if r.kind == "egress_gb"
                    and r.item == "internet")


@lru_cache(maxsize=1)
def _gpu_rows() -> dict[tuple[str, str], PriceRow]:
    return {(r.item, r.region): r for r in price_table() if r.kind == "gpu_hour"}


@lru_cache(maxsize=1)
def _egress() -> dict[frozenset[str], float]:
    return {frozenset(r.region.split("|")): r.dollars for r in price_table()
            if r.kind == "egress_gb" and r.item == "inter-region"}
