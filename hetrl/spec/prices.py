"""Prices: on-demand $/GPU-hour per GPU type and region, and $/GB of egress, from the shipped
table ``hetrl/data/prices.csv`` (sources and dates in ``hetrl/data/README.md``), with a
cluster file's ``prices:`` overrides on top (docs/money.md).

A cluster file may give::

    prices:
      gpu_hour: {A100-80GB: 3.1, L4: 0.9}   # $/GPU-hour, for that type in every region
      egress_per_gb: 0.02                    # $/GB between any two regions
      internet_egress_per_gb: 0.09           # $/GB into an edge node (out to the internet)

A GPU type the table lacks (a cluster's own ``gpu_types``) has no price unless the cluster
gives one; a region the table lacks takes the type's us-east-1 price (the table's stand-in
rule for US regions, stated where the price is used).
"""

from __future__ import annotations

import csv
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


@lru_cache(maxsize=1)
def price_table() -> tuple[PriceRow, ...]:
    """The rows of the shipped ``hetrl/data/prices.csv``."""
    text = resources.files("hetrl.data").joinpath("prices.csv").read_text()
    rows = list(csv.DictReader(text.splitlines()))
    return tuple(PriceRow(r["kind"], r["item"], r["region"], r["instance"],
                          float(r["dollars_per_unit"]), r["source"], r["note"]) for r in rows)


@dataclass(frozen=True)
class Prices:
    """Effective prices for one cluster: the table with the cluster's overrides."""

    overrides: PriceOverrides = PriceOverrides()

    def gpu_hour(self, gpu: str, region: str) -> float | None:
        """$/GPU-hour of ``gpu`` in ``region`` (None: no price known)."""
        for name, value in self.overrides.gpu_hour:
            if name == gpu:
                return value
        return _gpu_prices().get((gpu, region), _gpu_prices().get((gpu, DEFAULT_REGION)))

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
def _gpu_prices() -> dict[tuple[str, str], float]:
    return {(r.item, r.region): r.dollars for r in price_table() if r.kind == "gpu_hour"}


@lru_cache(maxsize=1)
def _egress() -> dict[frozenset[str], float]:
    return {frozenset(r.region.split("|")): r.dollars for r in price_table()
            if r.kind == "egress_gb" and r.item == "inter-region"}
