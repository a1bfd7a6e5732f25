"""The slowest data-parallel replica: the expected excess load it carries.

A forward or training step over a batch split among ``dp`` replicas ends when the slowest
replica ends. The split is by sequence count (verl's contiguous chunks), and sequence lengths
are random, so each replica's token load is a random sum; the step waits for the largest of
``dp`` of them. With ``n`` sequences per replica drawn in groups of ``g`` responses that share one
prompt (GRPO's group; the samples of a prompt are adjacent, as verl's interleaved repeat leaves
them), the load's variance is ``n (g Var[prompt] + Var[response])`` tokens^2, and by the normal
approximation the largest of ``dp`` such loads is, in expectation,

    n E[len] + z(dp) sqrt(n (g Var[prompt] + Var[response]))

where ``z(k)`` is the expected maximum of ``k`` independent standard normals (``z(1)`` = 0). The
cost model prices the slowest replica's micro-batches with ``load`` = that over ``n E[len]``
times the tokens (docs/cost-model.md, "The slowest replica"). No fitted constant: the moments
come from the workload's length distributions.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from hetrl.cost.lengths import LengthStats


@lru_cache(maxsize=1)
def _normal_grid() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x on [-12, 12], the standard normal's density and distribution function there."""
    x = np.linspace(-12.0, 12.0, 24_001)
    phi = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    cdf = np.array([0.5 * math.erfc(-v / math.sqrt(2.0)) for v in x])
    return x, phi, cdf


@lru_cache(maxsize=4096)
def expected_max_normal(k: int) -> float:
    """E[max of ``k`` independent N(0, 1)] (``k`` >= 1), by quadrature of
    ``x k phi(x) Phi(x)^(k-1)`` on [-12, 12]; z(2) = 1/sqrt(pi)."""
    if k <= 1:
        return 0.0
    x, phi, cdf = _normal_grid()
    return float(np.trapezoid(x * k * phi * cdf ** (k - 1), x))


def straggler_load(n: float, dp: int, L: LengthStats, group: int) -> float:
    """The slowest of ``dp`` replicas' token load over a replica's mean load (>= 1), for ``n``
    sequences per replica (per optimizer step) in prompt groups of ``group`` responses."""
    if dp <= 1 or n <= 0:
        return 1.0
    g = min(float(group), max(n, 1.0))  # a replica with fewer sequences than a group
    spread = math.sqrt(n * (g * L.prompt_var + L.response_var))
    return 1.0 + expected_max_normal(dp) * spread / (n * L.seq_mean)
