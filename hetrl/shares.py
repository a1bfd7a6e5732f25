"""Whole numbers in proportion to shares: the largest-remainder rule, in one place.

Every integer split of the project goes through :func:`largest_remainder`: the simulator's and
the runner's split of a batch over a task's DP replicas by the plan's data shares
(:func:`split_counts`, :func:`split_ranges`), and the search's layer and device splits
(``hetrl.search.balance.proportional_split``, which first gives every part one). The search's
data-level balancer itself sets only data *weights*; the cost model reads the fractional shares,
and the simulator and the runner round them with :func:`split_counts`.

The rule: every part gets the floor of its quota; the items left over go one each to the parts
with the largest fractional remainders, ties to the lower index.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def largest_remainder(quotas: Sequence[float], total: int) -> list[int]:
    """Integers summing to ``total``: the floor of each quota (quotas >= 0, summing to about
    ``total``), plus one for each of the ``total - sum(floors)`` largest remainders (ties: the
    lower index first)."""
    out = [math.floor(q) for q in quotas]
    order = sorted(range(len(quotas)), key=lambda i: quotas[i] - out[i], reverse=True)
    for i in order[: total - sum(out)]:
        out[i] += 1
    return out


def split_counts(n: int, shares: Sequence[float]) -> list[int]:
    """``n`` items over replicas in proportion to ``shares`` (fractions summing to 1, e.g.
    ``TaskPlacement.data_shares``) by the largest remainder. A replica may get 0."""
    return largest_remainder([n * s for s in shares], n)


def split_ranges(n: int, shares: Sequence[float]) -> list[range]:
    """Items ``0..n-1`` in consecutive runs, one per replica, of :func:`split_counts` sizes."""
    out, start = [], 0
    for c in split_counts(n, shares):
        out.append(range(start, start + c))
        start += c
    return out
