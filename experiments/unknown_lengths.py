"""Rows whose sources publish only length caps (docs/validation.md, "Rows whose lengths are
unknown"): a step priced with every response at its cap says more about the cap than about the
cost model, so such a row (``lengths: unknown`` in its file) is also priced at plausible mean
response lengths below the cap, and reported apart with the range of its ratios, never pooled
with rows whose mean lengths are published.

The plausible means: a quarter and a half of the cap, each as hetrl's default length shape (a
lognormal whose 0.999 quantile is the cap), beside the row's own pricing at the cap. The rows
here that publish both give means of 0.14-0.98 of their caps (0.43 for the one with a 10K cap,
S21; 0.72-0.98 for 4K-8K caps), so the range is a span to report, not a guess of the mean.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Mean response lengths tried, as shares of the cap (the row's own pricing is the cap itself).
PLAUSIBLE_MEAN_SHARES = (0.25, 0.5)
#: The values of a row file's ``lengths`` key.
LENGTHS = ("published", "unknown")


def response_cap(workload: Mapping[str, Any]) -> int:
    """The row's response cap in tokens: a fixed length, or a distribution's ``max``."""
    spec = workload["response_length"]
    return int(spec["max"] if isinstance(spec, Mapping) else spec)


def plausible_workloads(workload: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The row's workload (a workload file's mapping) with its responses at each plausible
    mean below the cap (:data:`PLAUSIBLE_MEAN_SHARES`)."""
    cap = response_cap(workload)
    return [{**workload, "response_length": {"kind": "lognormal", "mean": share * cap,
                                             "max": cap}}
            for share in PLAUSIBLE_MEAN_SHARES]
