"""Published peak GPU memory against the cost model's (docs/validation.md, "Peak memory"): a
row's comparison ``{quantity: peak_memory, value: V, unit: GiB | GB}`` holds the cost model's
peak bytes on the row's busiest measured GPU (the padding node of a component row left out)
against the published figure. Both are reported in GB (1e9 bytes) in the estimate and measured
columns, are never pooled with the time comparisons, and count as a hit within
:data:`MEMORY_BAND` (issue 58's target for rows that publish peak memory).

What a source's figure counts differs: PyTorch's peak *allocated* bytes (Megatron-LM's
``mem-max-allocated-bytes``) is what the cost model estimates; a peak *reserved* figure
(torchtitan's) also holds the caching allocator's free blocks, an upper bound of it. Each row
file says which its source reports.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hetrl.cost.model import Estimate

#: The comparison's quantity name.
PEAK_MEMORY = "peak_memory"
#: A peak-memory comparison is a hit within this factor of the published figure.
MEMORY_BAND = 0.15
#: Bytes per unit of a published memory figure.
MEMORY_UNITS = {"GiB": 2.0**30, "GB": 1e9}


def is_memory(comp: Mapping[str, Any]) -> bool:
    """Whether a comparison is of peak memory (else of time)."""
    return str(comp.get("quantity", "")).strip() == PEAK_MEMORY


def measured_gb(comp: Mapping[str, Any]) -> float:
    """The published peak in GB (1e9 bytes)."""
    unit = comp.get("unit", "GiB")
    if unit not in MEMORY_UNITS:
        raise ValueError(f"peak_memory: unit {unit!r} is not one of {sorted(MEMORY_UNITS)}")
    return float(comp["value"]) * MEMORY_UNITS[unit] / 1e9


def estimated_gb(est: Estimate, padding: bool) -> float:
    """The cost model's largest peak over the row's measured GPUs, GB (a component row's
    padding device, the last one, left out)."""
    peaks = dict(est.peak_memory_gb)
    if padding:
        peaks.pop(max(peaks), None)
    return max(peaks.values())
