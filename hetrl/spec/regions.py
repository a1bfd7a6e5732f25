"""AWS inter-region network facts shipped in ``hetrl/data`` (sources in its README): every
commercial AWS region; the cells between the HetRL paper's ten regions are measured (source C,
A) or the older E estimate, every other cell is a great-circle estimate (source G,
``experiments/estimate_aws_rtt.py``), not a measurement: override it with ``region_links``.

One-way delay = RTT / 2. Bandwidth is the per-flow model min(5 Gbps, 12 MiB / RTT).
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from functools import lru_cache
from importlib import resources

from hetrl.errors import SpecError, did_you_mean
from hetrl.spec.cluster import RegionLink


def _matrix(filename: str) -> dict[tuple[str, str], float]:
    text = resources.files("hetrl.data").joinpath(filename).read_text()
    rows = list(csv.reader(text.splitlines()))
    header = rows[0][1:]
    out = {}
    for row in rows[1:]:
        for col, cell in zip(header, row[1:], strict=True):
            if cell.strip():
                out[(row[0], col)] = float(cell)
    return out


@lru_cache(maxsize=1)
def aws_rtt_ms() -> dict[tuple[str, str], float]:
    """Round-trip times in ms between AWS regions (symmetric)."""
    return _matrix("aws_rtt_ms.csv")


@lru_cache(maxsize=1)
def aws_bandwidth_gbps() -> dict[tuple[str, str], float]:
    """Per-flow bandwidth in Gbit/s between AWS regions."""
    return _matrix("aws_bandwidth_gbps.csv")


@lru_cache(maxsize=1)
def aws_regions() -> dict[str, dict[str, str]]:
    """Region code -> {city, country, continent}."""
    text = resources.files("hetrl.data").joinpath("aws_regions.csv").read_text()
    return {r["region"]: {k: v for k, v in r.items() if k != "region"}
            for r in csv.DictReader(text.splitlines())}


@lru_cache(maxsize=1)
def aws_rtt_source() -> dict[tuple[str, str], str]:
    """Where each RTT cell comes from: C (cloudping.co), A (Azure's published P50), E (Azure
    East-US + 10 ms), G (great-circle estimate)."""
    text = resources.files("hetrl.data").joinpath("aws_rtt_source.csv").read_text()
    rows = list(csv.reader(text.splitlines()))
    return {(row[0], col): cell for row in rows[1:]
            for col, cell in zip(rows[0][1:], row[1:], strict=True) if cell != "-"}


def aws_region_links(regions: Sequence[str]) -> list[RegionLink]:
    """A link for every pair of ``regions``: one-way delay RTT/2 (ms), per-flow Gbit/s."""
    known = aws_regions()
    for r in regions:
        if r not in known:
            raise SpecError("regions", r, f"not in the AWS matrix{did_you_mean(r, known)}; "
                                          f"known: {', '.join(known)}")
    rtt, bw = aws_rtt_ms(), aws_bandwidth_gbps()
    return [
        RegionLink(a, b, rtt[(a, b)] / 2, bw[(a, b)])
        for i, a in enumerate(regions) for b in regions[i + 1:]
    ]
