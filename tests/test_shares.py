"""hetrl.shares: the one largest-remainder split that the simulator, the runner and the search's
balancer call. The three copies it replaced are kept here, verbatim, as references: the one
function must give what each gave."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetrl.search.balance import proportional_split
from hetrl.shares import largest_remainder, split_counts, split_ranges
from sim.engine import split_counts as sim_split_counts


def old_sim_split_counts(n, shares):  # sim/engine.py before
    raw = [n * s for s in shares]
    out = [math.floor(x) for x in raw]
    for i in sorted(range(len(raw)), key=lambda i: raw[i] - out[i], reverse=True)[: n - sum(out)]:
        out[i] += 1
    return out


def old_runner_counts(n, shares):  # real/runner.py RealRun._split before (its counts)
    raw = [s * n for s in shares]
    counts = [int(x) for x in raw]
    for i in sorted(range(len(raw)), key=lambda i: counts[i] - raw[i])[: n - sum(counts)]:
        counts[i] += 1
    return counts


def old_proportional_split(total, weights):  # hetrl/search/balance.py before (without caps)
    k = len(weights)
    wsum = sum(weights)
    raw = [1 + (total - k) * w / wsum for w in weights]
    out = [math.floor(x) for x in raw]
    for i in sorted(range(k), key=lambda i: raw[i] - out[i], reverse=True)[: total - sum(out)]:
        out[i] += 1
    return tuple(out)


def shares_of(weights):
    total = sum(weights)
    return [w / total for w in weights]  # as TaskPlacement.data_shares


def test_by_hand():
    assert split_counts(10, [0.5, 1 / 3, 1 / 6]) == [5, 3, 2]
    # 8 over 3 equal shares: 2.67 each, the two spare items to the lowest indexes
    assert split_counts(8, shares_of([1, 1, 1])) == [3, 3, 2]
    # 7 over (0.5, 0.25, 0.25): 3.5, 1.75, 1.75 -> 3, 1, 1 and the two spares to .75, .75
    assert split_counts(7, [0.5, 0.25, 0.25]) == [3, 2, 2]
    assert split_counts(3, [0.25] * 4) == [1, 1, 1, 0]  # a replica may get none
    assert split_counts(0, [0.5, 0.5]) == [0, 0]
    assert [list(r) for r in split_ranges(5, [0.6, 0.4])] == [[0, 1, 2], [3, 4]]
    assert largest_remainder([1.2, 2.5, 0.3], 4) == [1, 3, 0]


weights = st.lists(st.floats(0.01, 100.0), min_size=1, max_size=8)


@settings(max_examples=400, deadline=None)
@given(st.integers(0, 600), weights)
def test_the_batch_split_is_what_the_simulator_and_the_runner_gave(n, ws):
    shares = shares_of(ws)
    counts = split_counts(n, shares)
    assert counts == old_sim_split_counts(n, shares) == old_runner_counts(n, shares)
    assert sim_split_counts is split_counts  # the simulator calls this one function
    assert sum(counts) == n and min(counts) >= 0
    assert all(abs(c - n * s) < 1 for c, s in zip(counts, shares, strict=True))
    ranges = split_ranges(n, shares)
    assert [len(r) for r in ranges] == counts
    assert [i for r in ranges for i in r] == list(range(n))


@settings(max_examples=400, deadline=None)
@given(st.data(), weights)
def test_the_balancers_split_is_what_it_gave(data, ws):
    total = data.draw(st.integers(len(ws), 200))
    assert proportional_split(total, ws) == old_proportional_split(total, ws)


@pytest.mark.parametrize("n, ws", [(12, [1, 1, 1]), (10, [3, 1]), (9, [2, 2, 1, 1]),
                                   (32, [1.0, 0.383, 0.383, 0.2])])
def test_equal_quotas_break_ties_to_the_lower_index(n, ws):
    counts = split_counts(n, shares_of(ws))
    assert sum(counts) == n
    for i in range(len(ws) - 1):
        if ws[i] == ws[i + 1]:
            assert counts[i] >= counts[i + 1]
